"""FreeDave (Wu & Zhang, arXiv 2510.00294) and SSD (Gao et al., arXiv 2510.04147): the training-free chain.

Both draft from the last forward's outputs alone: a chain of block states, each the one before with the next
most confident masked position filled, verified in one forward and accepted as far as each state equals the
target's own next state. Here the chain is what the draft-free decoder would do if the logits it last
computed stayed put: with l the stale logits (the last forward's, at the state whose step produced the
current one) and x_0 the current state,

    x_{d+1} = pi(x_d, l, g_{s+d})        d = 0 .. N - 1, s the root's step

the same policy, rules and step index the target applies, on the stale logits instead of fresh ones. So:

- under `single` at T = 0, x_k is x_0 with the k most confident masked positions filled with their argmax
  tokens: FreeDave's drafts d_2 .. d_{k+1}. Its d_1, the target's own next step, is our x_0, which the
  previous verify already took (FreeDave keeps d_b's predictions for the next round; the engine keeps them as
  the stale logits), so `freedave@N` verifies N + 1 pieces, as FreeDave with K = N + 1 does;
- under `threshold` x_0 is the threshold step and each further state adds the next position by confidence
  (every stale confidence above tau was committed by that step): FreeDave++;
- under `static` / `dynamic` each state takes the schedule's next step, and under `timestep` Dream's.

Tokens under sampling [project design]: each drafted position holds the token that the node's own step would
draw there, the stale logits with step s + d's coupled noise, so the chain keeps being accepted at T > 0.
FreeDave instead reuses the last forward's sample for every drafted position (`reuse_sample=True`: step
s - 1's noise at every depth), and its target samples afresh each forward; with the coupled noise the target
draws with the noise of each step, so the reused sample is accepted only where the draws happen to agree.

SSD is the same chain (its N + 1 nodes are our root and N drafted states; its acceptance is state equality
of each node with the stepwise rule applied to the one before); its batch-expanded forward and dual cache are
verify layouts, which the engine's exact layout and `cache=dual` cover (docs/methods/freedave.md).

Shapes: K block length, V vocabulary, N = the budget.
"""

from __future__ import annotations

import torch

from spot.drafters.base import DraftContext
from spot.policy import decide
from spot.tree import DraftTree


class FreeDaveDrafter:
    """The chain above, at most `ctx.budget` states beyond the root; `name` labels it (`freedave`, or `ssd`)."""

    def __init__(self, name: str = "freedave", reuse_sample: bool = False) -> None:
        self.name = name
        self.reuse_sample = reuse_sample

    def draft(self, ctx: DraftContext) -> DraftTree:
        if ctx.stale_logits is None:  # a block's first step: no logits of this block yet
            return DraftTree.root_only(ctx.state)
        states = [ctx.state.cpu()]
        node, step = states[0], ctx.step
        # A timestep step may commit nothing: the chain then waits a step on the same state, as the walk does.
        for _ in range(ctx.budget + ctx.state.shape[0]):
            if len(states) > ctx.budget or not bool((node == ctx.mask_id).any()):
                break
            noise = ctx.gumbel(ctx.step - 1 if self.reuse_sample else step)
            node = decide(node.to(ctx.stale_logits.device), ctx.stale_logits, noise, ctx.config, ctx.mask_id, step,
                          model_dtype=ctx.model_dtype)[0].cpu()
            step += 1
            if not torch.equal(node, states[-1]):
                states.append(node)
        parents = ((),) + tuple((i,) for i in range(len(states) - 1))  # a chain: each state under the one before
        return DraftTree(torch.stack(states), parents)
