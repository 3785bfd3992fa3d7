import pytest
import torch

from spot.tree import DraftTree


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
