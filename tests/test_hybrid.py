"""The hybrid tree (spot.drafters.hybrid) on literal trees: the union of the chain and SPOT's tree, each state drafted
once; the likeliest nodes kept under their parents; the chain's rate from the request's own walk. Its losslessness
and batch invariance are test_batching's, with every other drafter's."""

from __future__ import annotations

import pytest
import torch

from spot.drafters.hybrid import ChainRate, merge, select
from spot.tree import DraftTree

M = 9  # the mask


def tree(*rows: tuple[tuple[int, ...], tuple[int, ...]]) -> DraftTree:
    """Literal trees of 3-position blocks: (state, parents) per node, the root first."""
    return DraftTree(torch.tensor([state for state, _ in rows]), tuple(parents for _, parents in rows))


ROOT = ((1, M, M), ())
CHAIN = tree(ROOT, ((1, 2, M), (0,)), ((1, 2, 3), (1,)))
SPOT = tree(ROOT, ((1, M, 4), (0,)), ((1, 2, M), (0,)), ((1, 5, 4), (1,)), ((1, 2, 6), (2,)))


@pytest.mark.parametrize("budget, states, parents", [
    (1, [(1, M, M), (1, 2, M)], ((), (0,))),
    # the chain's two states, then SPOT's first; its (1, 2, M) is the chain's first: drafted once, no budget spent
    (3, [(1, M, M), (1, 2, M), (1, 2, 3), (1, M, 4)], ((), (0,), (1,), (0,))),
    # SPOT's (1, 2, 6) hangs under the chain's (1, 2, M), where SPOT had it under its own copy of that state
    (8, [(1, M, M), (1, 2, M), (1, 2, 3), (1, M, 4), (1, 5, 4), (1, 2, 6)], ((), (0,), (1,), (0,), (3,), (1,))),
])
def test_the_chain_goes_first_and_each_state_is_drafted_once_within_the_budget(budget, states, parents):
    merged = merge(CHAIN, SPOT, budget)
    assert merged.states.tolist() == [list(s) for s in states] and merged.parents == parents
    assert merged.size <= budget


def test_a_node_whose_parent_the_budget_cut_is_left_out():
    deep = tree(ROOT, ((1, 7, M), (0,)), ((1, 7, 8), (1,)))
    assert merge(CHAIN, deep, 2).states.tolist() == [[1, M, M], [1, 2, M], [1, 2, 3]]
    assert merge(tree(ROOT), deep, 2).parents == ((), (0,), (1,))


def test_the_likeliest_nodes_are_kept_each_under_its_parent():
    union = tree(ROOT, ((1, 2, M), (0,)), ((1, 2, 3), (1,)), ((1, M, 4), (0,)), ((1, 5, 4), (3,)))
    # (1, 5, 4) is likelier than (1, 2, 3) but only reachable through (1, M, 4), taken first
    kept = select(union, [1.0, 0.6, 0.2, 0.5, 0.4], 3)
    assert kept.states.tolist() == [[1, M, M], [1, 2, M], [1, M, 4], [1, 5, 4]]
    assert kept.parents == ((), (0,), (0,), (2,)) and kept.reach == (1.0, 0.6, 0.5, 0.4)
    assert select(union, [1.0, 0.6, 0.2, 0.5, 0.4], 0).states.tolist() == [[1, M, M]]


def test_the_chain_rate_counts_how_deep_the_walk_followed_the_requests_chain():
    from spot.config import DecodeConfig
    from spot.drafters.base import DraftContext

    def ctx(step, state, stale):
        return DraftContext(torch.tensor(state), None, torch.tensor(stale), None, DecodeConfig(block_length=3), M, 0, 0,
                            step, 2, lambda _: None)

    rate = ChainRate((0.5, 0.25))
    assert rate.at(1) == 0.5 and rate.at(2) == 0.25 and rate.at(5) == 0.25  # the prior alone; deeper: its last
    rate.remember(ctx(1, (1, M, M), (M, M, M)), CHAIN)
    rate.observe(ctx(3, (1, 2, 7), (1, 2, M)))  # the walk took the chain's first state, not its second
    assert (rate.trees, rate.reached) == (1, [1, 0])
    assert rate.at(1) == (1 + 2 * 0.5) / 3 and rate.at(2) == (0 + 2 * 0.25) / 3
    rate.remember(ctx(3, (1, M, M), (1, M, M)), CHAIN)
    rate.observe(ctx(5, (1, 2, 3), (1, 2, 3)))
    assert rate.reached == [2, 1]
    rate.remember(ctx(5, (1, M, M), (1, M, M)), CHAIN)
    rate.observe(ctx(2, (1, 2, 3), (1, 2, 3)))  # not the next step of the same block: not counted
    assert rate.trees == 2
