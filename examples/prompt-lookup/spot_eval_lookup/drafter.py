"""The lookup drafter: FreeDave's chain, with the prompt lookup's token beside it where the lookup names the
policy's second choice.

A drafted node is accepted only where it equals the state the target itself reaches, so a tree must follow the
target's commit order and tokens. The lookup knows neither the order nor the policy: filling masked positions with
its tokens in any other order than the target's, or overriding the tokens the target's own rule draws, costs more
drafts than it wins (measured on the embedded target, 3 MBPP and 3 HumanEval prompts: FreeDave's chain with every
token the lookup covers replaced by the lookup's saved 1.25x forwards at budget 8 where FreeDave's saved 2.28x, and
the lookup's token beside every chain node that it disagrees with, 2.13x). So the spine of the tree is
FreeDave's chain (the target's own rule replayed on the stale logits: spot_eval.plugin.decide, with the coupled
noise at T > 0, under any policy), and the lookup adds a sibling to a spine node only where the two disagree and
the stale logits are torn between them: at a position the node commits, the lookup's token is the policy's
runner-up draw (its draw with its first choice knocked out) at that step. Such a sibling costs the spine one node
of the budget; the rest of the time the tree is FreeDave's.

Shapes: K block length, V vocabulary.
"""

from __future__ import annotations

import torch

from spot_eval.plugin import DraftContext, DraftTree, decide
from spot_eval_lookup.ngram import continuation


def looked_up(ctx: DraftContext, root: torch.Tensor) -> torch.Tensor | None:
    """[K]: `root` with every masked position from its first masked one on filled with the lookup's continuation of
    the text before it (the prefix and the block's committed tokens before that position), or None where the text
    holds no earlier occurrence of its last n-gram. Positions the target committed out of order keep its tokens."""
    masked = root == ctx.mask_id  # [K]
    first = int(masked.nonzero()[0])
    prefix = ctx.prefix if ctx.prefix is not None else root[:0]  # a context built by hand may carry no text before
    guess = continuation(torch.cat([prefix, root[:first]]), root.shape[0] - first)  # [K - first]
    if guess is None:
        return None
    out = root.clone()
    out[first:] = torch.where(masked[first:], guess, root[first:])
    return out


class LookupDrafter:
    """The tree above, at most `ctx.budget` nodes beyond the root."""

    name = "lookup"

    def draft(self, ctx: DraftContext) -> DraftTree:
        root = ctx.state.cpu()  # [K]
        # A block's first step (no logits of it yet), or a block with nothing left to fill.
        if ctx.stale_logits is None or not bool((root == ctx.mask_id).any()):
            return DraftTree.root_only(root)
        logits = ctx.stale_logits  # [K, V] on the target's device
        guess = looked_up(ctx, root)
        states, parents = [root], [()]
        node, spine, step = root, 0, ctx.step  # spine: the index of the chain's last node
        # A timestep step may commit nothing: the chain then waits a step on the same state, as FreeDave's does.
        for _ in range(ctx.budget + root.shape[0]):
            if len(states) > ctx.budget or not bool((node == ctx.mask_id).any()):
                break
            noise = ctx.gumbel(step)  # [K, V] float64, None at T = 0
            after, drawn = decide(node.to(logits.device), logits, noise, ctx.config, ctx.mask_id, step,
                                  model_dtype=ctx.model_dtype)
            after = after.cpu()
            if not torch.equal(after, node):
                states.append(after)
                parents.append((spine,))
                grown = len(states) - 1
                other = None if guess is None else self._sibling(ctx, node, after, guess, drawn.tokens, noise, step)
                if other is not None and len(states) <= ctx.budget:
                    states.append(other)  # a leaf: the walk that takes it stops there, and the next draft goes on
                    parents.append((spine,))
                spine, node = grown, after
            step += 1
        return DraftTree(torch.stack(states), tuple(parents))

    @staticmethod
    def _sibling(ctx: DraftContext, node: torch.Tensor, after: torch.Tensor, guess: torch.Tensor,
                 drawn: torch.Tensor, noise: torch.Tensor | None, step: int) -> torch.Tensor | None:
        """[K]: `after` (the policy's step from `node`) with the lookup's token where that is the policy's runner-up
        at a position the step commits, or None where there is no such position. `drawn` [K] the step's draws."""
        disagree = (after != node) & (guess != after)  # [K] committed by the step, to another token than the lookup's
        if not bool(disagree.any()):
            return None
        logits = ctx.stale_logits
        knocked = logits.scatter(-1, drawn[:, None].to(logits.device), float("-inf"))  # [K, V] the first choices out
        runner_up = decide(node.to(logits.device), knocked, noise, ctx.config, ctx.mask_id, step,
                           model_dtype=ctx.model_dtype)[1].tokens.cpu()  # [K] the same draw, one choice down
        swap = disagree & (runner_up == guess)
        return torch.where(swap, guess, after) if bool(swap.any()) else None
