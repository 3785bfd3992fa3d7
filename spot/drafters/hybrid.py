"""The hybrid tree: the FreeDave chain and SPOT's best-first tree under one budget (issue 64's first direction).

The two sources miss in different places. The chain is the draft-free decoder's own next steps replayed on the
stale logits, so it is long where the stale confidences already rank the commits right; SPOT's order model
branches where they do not. The verifier accepts by state alone (spot.acceptance: any drafted node may serve), so
their union is one tree: a state both propose is drafted once.

Which N states go in: every candidate of both sources is weighed by its chance of being reached, and the N
likeliest are kept, each under its parent (`select`). A SPOT node's chance is its calibrated reach
(spot.drafters.reach, fitted offline); a chain state's at depth d is the share of this request's earlier trees
whose chain the walk followed at least d states deep (`ChainRate`), starting from SPOT's mean reach at rank d as a
prior. That rate reads only the request's own history (the last accepted node, `DraftContext.stale_state`), so a
request's trees are the same at every batch size; whatever the trees, the verifier keeps the output exact. (A
fixed split, the chain's first N/2 states and then SPOT's, was the first try: behind SPOT on every task, Results ->
Drafters.)

Shapes: K block length, N the budget.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from spot.drafters.base import DraftContext
from spot.drafters.freedave import FreeDaveDrafter
from spot.drafters.spot import SpotDrafter
from spot.tree import DraftTree

PRIOR_WEIGHT = 2.0  # trees' worth of belief in the prior rate before a request's own trees speak
KEPT_REQUESTS = 4096  # requests whose chain history is kept (the oldest go first)


class HybridDrafter:
    """SPOT's tree and the FreeDave chain under one budget (see the module)."""

    def __init__(self, spot: SpotDrafter, name: str = "hybrid") -> None:
        if spot.reach is None:
            raise ValueError("the hybrid weighs SPOT's nodes by their calibrated reach: calibrate the drafter "
                             "(spot-eval calibrate-reach)")
        self.spot = spot
        self.chain = FreeDaveDrafter()
        self.name = name
        self._rates: OrderedDict[int, ChainRate] = OrderedDict()

    def draft(self, ctx: DraftContext) -> DraftTree:
        return self.draft_batch([ctx])[0]

    def draft_batch(self, ctxs: list[DraftContext]) -> list[DraftTree]:
        """Each context's hybrid tree; SPOT's trees in one order-model call, as SPOT batches them."""
        return [self._hybrid(ctx, tree) for ctx, tree in zip(ctxs, self.spot.draft_batch(ctxs), strict=True)]

    def _hybrid(self, ctx: DraftContext, spot: DraftTree) -> DraftTree:
        rate = self._rates.pop(ctx.request, None)
        if rate is None or rate.last is None or (ctx.block, ctx.step) <= rate.last[:2]:  # a new decode of the request
            rate = ChainRate(self.spot.reach.mean_reach)
        self._rates[ctx.request] = rate  # the most recent last
        if len(self._rates) > KEPT_REQUESTS:
            self._rates.popitem(last=False)
        rate.observe(ctx)
        chain = self.chain.draft(ctx)
        rate.remember(ctx, chain)
        union = merge(chain, spot, chain.size + spot.size)
        index = {_key(s): i for i, s in enumerate(union.states)}
        reach = [0.0] * len(index)  # a state both propose: the likelier source's chance
        spot_reach = spot.reach or (1.0,)  # a block's first step: the root alone, uncalibrated
        for tree, probs in ((chain, [1.0, *(rate.at(d) for d in range(1, chain.size + 1))]), (spot, spot_reach)):
            for state, p in zip(tree.states, probs, strict=True):
                i = index[_key(state)]
                reach[i] = max(reach[i], p)
        return select(union, reach, ctx.budget)


@dataclass
class ChainRate:
    """How deep the walk has followed this request's chain: reached[d - 1] trees of `trees` went at least d deep."""

    prior: tuple[float, ...]  # the rate at depth d before any tree (SPOT's mean reach at rank d)
    trees: int = 0
    reached: list[int] = field(default_factory=list)
    last: tuple[int, int, torch.Tensor] | None = None  # (block, step, the chain's states [n + 1, K]) of the last tree

    def at(self, depth: int) -> float:
        prior = self.prior[min(depth, len(self.prior)) - 1]
        hits = self.reached[depth - 1] if depth <= len(self.reached) else 0
        return (hits + PRIOR_WEIGHT * prior) / (self.trees + PRIOR_WEIGHT)

    def remember(self, ctx: DraftContext, chain: DraftTree) -> None:
        self.last = (ctx.block, ctx.step, chain.states)

    def observe(self, ctx: DraftContext) -> None:
        """Count the last tree (drafted at an earlier step of this block) by how deep its chain lies on the walk:
        the deepest chain state whose commits the last accepted node (`stale_state`) holds, token for token."""
        if self.last is None or ctx.stale_state is None:
            return
        block, step, states = self.last
        if block != ctx.block or step >= ctx.step or states.shape[0] < 2:
            return
        root, accepted = states[0], ctx.stale_state.cpu()
        depth = 0
        for d in range(1, states.shape[0]):
            written = states[d] != root  # [K] what the chain had committed by depth d
            if not torch.equal(states[d][written], accepted[written]):
                break
            depth = d
        self.trees += 1
        self.reached += [0] * (states.shape[0] - 1 - len(self.reached))
        for d in range(depth):
            self.reached[d] += 1


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


def select(tree: DraftTree, reach: list[float], budget: int) -> DraftTree:
    """The `budget` likeliest nodes of `tree` by `reach` (one value per node, the root's first), each taken only
    once a parent is: best first from the root over the children of what is taken, ties to the earlier node. The
    kept nodes keep their order, so parents still come before children; `reach` goes with them."""
    children: dict[int, list[int]] = {}
    for i, ps in enumerate(tree.parents[1:], start=1):
        children.setdefault(ps[0], []).append(i)
    taken, frontier = [0], [(-reach[c], c) for c in children.get(0, [])]
    heapq.heapify(frontier)
    while frontier and len(taken) <= budget:
        _, node = heapq.heappop(frontier)
        taken.append(node)
        for c in children.get(node, []):
            heapq.heappush(frontier, (-reach[c], c))
    kept = sorted(taken)
    row = {node: i for i, node in enumerate(kept)}
    parents = tuple(tuple(row[p] for p in tree.parents[n] if p in row) for n in kept)
    return DraftTree(tree.states[kept], parents, reach=tuple(reach[n] for n in kept))


def _key(state: torch.Tensor) -> bytes:
    return state.cpu().numpy().tobytes()
