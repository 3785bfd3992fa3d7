"""The hybrid tree: the FreeDave chain and SPOT's best-first tree under one budget (issue 64's first direction).

The two sources miss in different places. The chain is the draft-free decoder's own next steps replayed on the
stale logits, so it is long where the stale confidences already rank the commits right; SPOT's order model
branches where they do not. The verifier accepts by state alone (spot.acceptance: any drafted node may serve), so
their union is one tree: a state both propose is drafted once.

Budget N: the chain's first `ceil(chain_share * N)` states go in first, then SPOT's nodes in their best-first
order, a state already drafted skipped without spending budget, until N states are drafted (or both sources run
out). chain_share 0 is SPOT's tree and 1 the chain; between them the tree holds each source's best nodes. The
share is a fixed split, not yet each node's calibrated probability of acceptance (the issue's goal: that needs the
chain's reach per depth calibrated beside SPOT's, spot.drafters.reach).

Shapes: K block length, N the budget.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from spot.drafters.base import DraftContext
from spot.drafters.freedave import FreeDaveDrafter
from spot.drafters.spot import SpotDrafter
from spot.tree import DraftTree


class HybridDrafter:
    """SPOT's tree with the FreeDave chain's first states grafted in (see the module)."""

    def __init__(self, spot: SpotDrafter, chain_share: float = 0.5, name: str = "hybrid") -> None:
        if not 0.0 <= chain_share <= 1.0:
            raise ValueError(f"chain_share must be in [0, 1], got {chain_share}")
        self.spot = spot
        self.chain = FreeDaveDrafter()
        self.chain_share = chain_share
        self.name = name

    def draft(self, ctx: DraftContext) -> DraftTree:
        return self.draft_batch([ctx])[0]

    def draft_batch(self, ctxs: list[DraftContext]) -> list[DraftTree]:
        """Each context's hybrid tree; SPOT's trees in one order-model call, as SPOT batches them."""
        spots = self.spot.draft_batch(ctxs)
        return [merge(self.chain.draft(replace(ctx, budget=math.ceil(self.chain_share * ctx.budget))), tree, ctx.budget)
                for ctx, tree in zip(ctxs, spots, strict=True)]


def merge(first: DraftTree, then: DraftTree, budget: int) -> DraftTree:
    """One tree of at most `budget` states beyond the common root: every node of `first`, then `then`'s nodes in
    their order, each state drafted once (a node of `then` already present keeps the index it has, so that its
    children hang under it). Both trees list parents before children, so the result does too.

    first, then: trees rooted at the same state; states [N + 1, K].
    """
    rows = [first.states[0]]
    index: dict[bytes, int] = {_key(first.states[0]): 0}
    parents: list[tuple[int, ...]] = [()]
    for tree in (first, then):
        where = {0: 0}  # the tree's node -> its row in the merged tree
        for i in range(1, tree.states.shape[0]):
            key = _key(tree.states[i])
            if key in index:
                where[i] = index[key]
                continue
            mapped = tuple(where[p] for p in tree.parents[i] if p in where)
            if len(rows) > budget or not mapped:  # the budget is spent, or its parent was cut
                continue
            index[key] = where[i] = len(rows)
            rows.append(tree.states[i])
            parents.append(mapped)
    return DraftTree(torch.stack(rows), tuple(parents))


def _key(state: torch.Tensor) -> bytes:
    return state.cpu().numpy().tobytes()
