"""Draft trees and best-first growth on hand-written scores: exact expected trees."""

import math

import pytest
import torch

from spot.tree import DraftTree, Edge, grow_best_first

M = 9

EDGES = {  # state -> ranked edges (position, token, probability)
    (M, M, M): [(0, 1, 0.6), (1, 2, 0.3), (2, 3, 0.1)],
    (1, M, M): [(1, 2, 0.9), (2, 3, 0.1)],
    (M, 2, M): [(0, 1, 0.5), (2, 3, 0.5)],
    (M, M, 3): [(0, 1, 1.0)],
    (1, 2, M): [(2, 3, 1.0)],
    (1, M, 3): [(1, 2, 1.0)],
    (M, 2, 3): [(0, 1, 1.0)],
    (1, 2, 3): [],
}


class LiteralExpander:
    def __init__(self):
        self.calls = []
        self.frontiers = []

    def __call__(self, frontier):
        self.calls.append([tuple(s) for s in frontier.states.tolist()])
        self.frontiers.append(frontier)
        return [[Edge(p, v, math.log(q)) for p, v, q in EDGES[tuple(s)]] for s in frontier.states.tolist()]


def grow(budget, gamma=None):
    expander = LiteralExpander()
    tree = grow_best_first(torch.tensor([M, M, M]), budget, expander, gamma)
    return [tuple(s) for s in tree.states.tolist()], tree.parents, expander


def test_root_only_and_depths():
    root = torch.tensor([1, 9, 9])
    assert DraftTree.root_only(root).size == 0
    tree = DraftTree(torch.tensor([[1, 9, 9], [1, 2, 9], [1, 9, 3], [1, 2, 3]]), ((), (0,), (0,), (1, 2)))
    assert tree.size == 3 and tree.depth() == [0, 1, 1, 2]


@pytest.mark.parametrize(
    "parents, message",
    [(((0,), (0,)), "root"), (((), ()), "parent"), (((), (1,)), "parent"), (((),), "one parent tuple")],
)
def test_malformed_trees_are_refused(parents, message):
    with pytest.raises(ValueError, match=message):
        DraftTree(torch.zeros(2, 3, dtype=torch.long), parents)


def test_best_first_pops_paths_in_probability_order():
    # Path probabilities: A .6, AB .54, ABC .54, B .3, BA dup, BC .15, AC .06, C .1 ...
    states, parents, _ = grow(4)
    assert states == [(M, M, M), (1, M, M), (1, 2, M), (1, 2, 3), (M, 2, M)]
    assert parents == ((), (0,), (1,), (2,), (0,))


def test_a_state_reached_by_another_order_costs_no_budget():
    states, parents, _ = grow(6)
    # After B (.3): BA = (1, 2, M) is already in the tree and is skipped; BC (.15) and C (.1) follow.
    assert states[5:] == [(M, 2, 3), (M, M, 3)]
    assert parents[5:] == ((4,), (0,))
    assert len(set(states)) == len(states)


def test_budget_zero_is_the_root_and_waiting_nodes_expand_in_one_batch():
    states, _, expander = grow(0)
    assert states == [(M, M, M)] and expander.calls == []
    _, _, expander = grow(4)
    assert expander.calls[0] == [(M, M, M)]
    assert sum(len(c) for c in expander.calls) == len({s for c in expander.calls for s in c})  # no node twice


def test_gamma_flattens_a_depth_and_changes_the_tree():
    # gamma 0.1 at depth 0 flattens the root's choices to A .95, B .89, C .79, so B now comes
    # before AB (.95 * .9 = .86), which is followed by ABC (.86) ahead of C.
    states, parents, _ = grow(4, gamma=[0.1, 1.0])
    assert states == [(M, M, M), (1, M, M), (M, 2, M), (1, 2, M), (1, 2, 3)]
    assert parents == ((), (0,), (0,), (1,), (3,))


def test_frontiers_name_each_node_its_parent_and_depth():
    expander = LiteralExpander()
    tree = grow_best_first(torch.tensor([M, M, M]), 6, expander)
    depths = tree.depth()
    seen = [n for f in expander.frontiers for n in f.nodes]
    assert seen[0] == 0 and expander.frontiers[0].parents == (-1,)
    for f in expander.frontiers:
        for node, parent, depth, state in zip(f.nodes, f.parents, f.depths, f.states.tolist(), strict=True):
            assert parent == (tree.parents[node][0] if node else -1)
            assert depth == depths[node] and state == tree.states[node].tolist()
            assert parent in seen[: seen.index(node)] or node == 0  # parents expand first
