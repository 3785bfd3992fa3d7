"""The hybrid tree (spot.drafters.hybrid): the chain's states first, SPOT's after, each state drafted once, within
the budget, parents before children; its losslessness is test_batching's, with every other drafter's."""

from __future__ import annotations

import pytest
import torch

from spot.drafters.hybrid import merge
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
