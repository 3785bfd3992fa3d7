"""Reference drafters for tests and bounds: random, adversarial and oracle.

The oracle and the adversary peek at the draft-free trajectory of the same request
(`Generation.trajectory` with record=True), for as long as the decoding stays on it. The oracle proposes the true next states, a chain:
the upper bound of forwards saved at a budget (N + 1 steps per verify). The adversary proposes
near misses of the truth (one token off, or one commit too many), so every node is wrong.
"""

from __future__ import annotations

import torch

from spot.drafters.base import DraftContext
from spot.noise import step_key
from spot.tree import DraftTree


def _trajectory_index(trajectory) -> dict[int, torch.Tensor]:
    return {trace.block: trace.states for trace in trajectory}


def _on_track(states: torch.Tensor, ctx: DraftContext) -> bool:
    """Whether this decoding is still on the recorded trajectory: its state is the recorded one at this step. Off it
    (a packed-layout run that parted from the reference at a near tie), the recorded future would change positions
    this run has already filled, which is no tree for this state."""
    return ctx.step < len(states) and torch.equal(states[ctx.step], ctx.state.cpu())


class OracleDrafter:
    name = "oracle"

    def __init__(self, trajectory) -> None:
        self._states = _trajectory_index(trajectory)  # block -> [S + 1, K]

    def draft(self, ctx: DraftContext) -> DraftTree:
        truth = self._states[ctx.block]
        if not _on_track(truth, ctx):
            return DraftTree.root_only(ctx.state)
        chain = truth[ctx.step + 1 : ctx.step + 1 + ctx.budget]  # [<= N, K]
        states = torch.cat([ctx.state[None], chain])
        return DraftTree(states=states, parents=((),) + tuple((i,) for i in range(len(chain))))


class AdversarialDrafter:
    name = "adversarial"

    def __init__(self, trajectory, vocab_size: int) -> None:
        self._states = _trajectory_index(trajectory)
        self._vocab = vocab_size

    def _other_token(self, token: int, mask_id: int) -> int:
        other = (token + 1) % self._vocab
        return other if other != mask_id else (other + 1) % self._vocab

    def draft(self, ctx: DraftContext) -> DraftTree:
        if not _on_track(self._states[ctx.block], ctx):
            return DraftTree.root_only(ctx.state)
        truth = self._states[ctx.block][ctx.step :]  # [S' + 1, K], row 0 == ctx.state
        # A timestep step may commit nothing: the near misses are of the first true step that commits.
        moved = torch.nonzero((truth != truth[0]).any(dim=1))[:, 0]
        if moved.numel() == 0:
            return DraftTree.root_only(ctx.state)
        truth = truth[int(moved[0]) - 1 :]
        first = torch.nonzero(truth[1] != truth[0])[:, 0]  # positions the next true step commits
        p = int(first[0])
        wrong_token = self._other_token(int(truth[1][p]), ctx.mask_id)
        states, parents = [ctx.state], [()]
        # Depth 1 near misses: one token off; one commit too many; (threshold) one commit too few.
        flipped = truth[1].clone()
        flipped[p] = wrong_token
        states.append(flipped)
        parents.append((0,))
        masked = torch.nonzero(truth[1] == ctx.mask_id)[:, 0]
        if masked.numel():
            superset = truth[1].clone()
            q = int(masked[0])
            token = int(truth[-1][q])  # plausible: what the target writes there later
            superset[q] = token if token != ctx.mask_id else self._other_token(token, ctx.mask_id)
            states.append(superset)
            parents.append((0,))
        if first.numel() > 1:
            subset = truth[1].clone()
            subset[int(first[-1])] = ctx.mask_id
            states.append(subset)
            parents.append((0,))
        # Deeper: the true future on top of the wrong token, each a child of the previous one.
        chain_parent = 1
        for true_state in truth[2:]:
            wrong = true_state.clone()
            wrong[p] = wrong_token
            states.append(wrong)
            parents.append((chain_parent,))
            chain_parent = len(states) - 1
        n = ctx.budget + 1
        return DraftTree(states=torch.stack(states[:n]), parents=tuple(parents[:n]))


class RandomDrafter:
    """Random trees: each node commits one random masked position of a random earlier node, with
    the stale top-1 or top-2 token there (or a random token when no logits exist yet)."""

    name = "random"

    def __init__(self, vocab_size: int, seed: int = 0) -> None:
        self.vocab_size = vocab_size
        self.seed = seed

    def draft(self, ctx: DraftContext) -> DraftTree:
        g = torch.Generator().manual_seed(step_key(self.seed, ctx.request, ctx.block, ctx.step))
        top2 = None
        if ctx.stale_logits is not None:
            logits = ctx.stale_logits.detach().float().cpu().clone()  # [K, V]
            logits[:, ctx.mask_id] = float("-inf")
            top2 = torch.topk(logits, 2, dim=-1).indices  # [K, 2]
        states, parents = [ctx.state], [()]
        for _ in range(ctx.budget):
            open_nodes = [i for i, s in enumerate(states) if bool((s == ctx.mask_id).any())]
            parent = open_nodes[int(torch.randint(len(open_nodes), (1,), generator=g))]
            masked = torch.nonzero(states[parent] == ctx.mask_id)[:, 0]
            pos = int(masked[int(torch.randint(masked.numel(), (1,), generator=g))])
            if top2 is not None:
                token = int(top2[pos, int(torch.randint(2, (1,), generator=g))])
            else:
                token = int(torch.randint(self.vocab_size, (1,), generator=g))
                token = token if token != ctx.mask_id else (token + 1) % self.vocab_size
            child = states[parent].clone()
            child[pos] = token
            states.append(child)
            parents.append((parent,))
        return DraftTree(states=torch.stack(states), parents=tuple(parents))
