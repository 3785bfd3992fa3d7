"""Draft trees: candidate block states with parent links, as plain data.

Node 0 is the root: the current state, whose logits every forward needs anyway. Every other node
is a hypothetical future state, one or more commits beyond each of its parents. Spiffy's draft
graphs give a node several parents (the same state reached through different commit orders);
trees are the one-parent case.

Acceptance needs only state equality (an accepted node is a state whose logits the target really
computed), so parent links describe how a drafter grew the structure; the verifier never trusts
them for correctness.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DraftTree:
    """states: [N + 1, K] int64, row 0 the root; parents[i]: the parent nodes of node i (() for the root)."""

    states: torch.Tensor
    parents: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if self.states.dim() != 2 or len(self.parents) != self.states.shape[0]:
            raise ValueError(f"a draft tree needs one parent tuple per state row; got {len(self.parents)} for {tuple(self.states.shape)}")
        if self.parents[0]:
            raise ValueError("node 0 is the root and has no parent")
        for i, ps in enumerate(self.parents[1:], start=1):
            if not ps or any(not 0 <= p < i for p in ps):
                raise ValueError(f"node {i} has parents {ps}; each node needs >= 1 parent among the earlier nodes")

    @property
    def size(self) -> int:
        """Draft nodes beyond the root (what a budget counts)."""
        return self.states.shape[0] - 1

    @staticmethod
    def root_only(state: torch.Tensor) -> DraftTree:
        return DraftTree(states=state[None].clone(), parents=((),))

    def depth(self) -> list[int]:
        """Commits-steps from the root to each node along its first parent."""
        out = [0]
        for ps in self.parents[1:]:
            out.append(out[ps[0]] + 1)
        return out
