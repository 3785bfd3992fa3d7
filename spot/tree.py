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

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DraftTree:
    """states: [N + 1, K] int64, row 0 the root; parents[i]: the parent nodes of node i (() for the root).

    scores[i]: node i's path log-score, the sum of its edges' log-scores (0 for the root), when the
    drafter grew it best-first; reach[i]: the calibrated probability that the walk reaches node i
    (1 for the root), when the drafter knows it (what budget=auto sizes by, spot.sizing).
    """

    states: torch.Tensor
    parents: tuple[tuple[int, ...], ...]
    scores: tuple[float, ...] | None = None
    reach: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.states.dim() != 2 or len(self.parents) != self.states.shape[0]:
            raise ValueError(f"a draft tree needs one parent tuple per state row; got {len(self.parents)} for {tuple(self.states.shape)}")
        if self.parents[0]:
            raise ValueError("node 0 is the root and has no parent")
        for i, ps in enumerate(self.parents[1:], start=1):
            if not ps or any(not 0 <= p < i for p in ps):
                raise ValueError(f"node {i} has parents {ps}; each node needs >= 1 parent among the earlier nodes")
        for name in ("scores", "reach"):
            values = getattr(self, name)
            if values is not None and len(values) != len(self.parents):
                raise ValueError(f"a draft tree needs one {name} value per node; got {len(values)} for {len(self.parents)} nodes")

    @property
    def size(self) -> int:
        """Draft nodes beyond the root (what a budget counts)."""
        return self.states.shape[0] - 1

    @staticmethod
    def root_only(state: torch.Tensor) -> DraftTree:
        return DraftTree(states=state[None].clone(), parents=((),))

    def prefix(self, n: int) -> DraftTree:
        """The root and nodes 1..n: a tree again, since every node's parents come before it."""
        def cut(values: tuple[float, ...] | None) -> tuple[float, ...] | None:
            return None if values is None else values[: n + 1]

        return DraftTree(self.states[: n + 1], self.parents[: n + 1], cut(self.scores), cut(self.reach))

    def depth(self) -> list[int]:
        """Commits-steps from the root to each node along its first parent."""
        out = [0]
        for ps in self.parents[1:]:
            out.append(out[ps[0]] + 1)
        return out


def unchecked(states: torch.Tensor, parents: tuple, scores: tuple | None = None, reach: tuple | None = None) -> DraftTree:
    """A DraftTree built without its own checks, for `defect` to judge and name what is wrong (a drafter's tree as
    the engine copies it, spot.drafters.base.checked)."""
    tree = object.__new__(DraftTree)
    for name, value in (("states", states), ("parents", parents), ("scores", scores), ("reach", reach)):
        object.__setattr__(tree, name, value)
    return tree


def defect(tree: object, root: torch.Tensor, budget: int, vocab_size: int, mask_id: int, shallow: bool = False) -> str | None:
    """What is wrong with `tree` as a drafter's answer for the block state `root` [K] under `budget`, said as what
    it is ("a list, not a spot.tree.DraftTree"), or None for a well-formed tree: a DraftTree of int64 states
    [N + 1, K] with N <= budget, row 0 equal to `root`, every token in the vocabulary, each drafted node equal to the
    root wherever the root is not masked (a node only fills masked positions), parents that make a tree (each node
    under earlier nodes) and reach probabilities in [0, 1]. Rechecked here, whatever DraftTree's own checks
    said: a drafter may build one around them. A subclass of DraftTree or of torch.Tensor is refused: its reads may
    answer differently each time. `shallow`: the types alone (spot.drafters.base.checked copies, then checks it all).
    """
    if type(tree) is not DraftTree:
        return f"a {type(tree).__name__}, not a spot.tree.DraftTree"
    states, k = tree.states, root.shape[0]
    if type(states) is not torch.Tensor or states.device.type == "meta":
        return f"states of type {type(states).__name__}{' on the meta device' if type(states) is torch.Tensor else ''}; a tree's states are a torch.Tensor with values"
    if states.dim() == 2 and states.shape[0] - 1 > budget:  # before anything copies an oversized tree
        return f"{states.shape[0] - 1} nodes for budget {budget}"
    if shallow:
        return None
    if states.dim() != 2 or states.shape[1] != k or states.shape[0] < 1:
        shape = tuple(states.shape)
        return f"states of shape {shape}; a tree's states are [N + 1, {k}], one row per node of a {k}-position block"
    if states.dtype != torch.int64:
        return f"{states.dtype} states; token ids are torch.int64"
    if states.shape[0] - 1 > budget:
        return f"{states.shape[0] - 1} nodes for budget {budget}"
    parents = tree.parents
    if not isinstance(parents, (tuple, list)) or len(parents) != states.shape[0]:
        return f"{len(parents) if isinstance(parents, (tuple, list)) else type(parents).__name__} parent entries for {states.shape[0]} nodes"
    for i, ps in enumerate(parents):
        if not isinstance(ps, (tuple, list)) or (i == 0) != (len(ps) == 0) or any(
                not isinstance(p, int) or isinstance(p, bool) or not 0 <= p < i for p in ps):
            return f"parents {ps!r} for node {i}; the root has none and every other node has >= 1 among the earlier nodes"
    states = states.cpu()
    outside = (states < 0) | (states >= vocab_size)
    if bool(outside.any()):
        node, position = (int(v) for v in torch.nonzero(outside)[0])
        return f"token {int(states[node, position])} at node {node}, position {position}, outside the vocabulary (0..{vocab_size - 1})"
    if not torch.equal(states[0], root.cpu()):
        return "a root (node 0) that is not the current block state"
    overwritten = (states[1:] != root.cpu()) & (root.cpu() != mask_id)
    if bool(overwritten.any()):
        node, position = (int(v) for v in torch.nonzero(overwritten)[0])
        return f"node {node + 1} changing position {position}, which is not masked in the current state (a node only fills masked positions)"
    for name in ("scores", "reach"):
        values = getattr(tree, name)
        if values is not None and (not isinstance(values, (tuple, list)) or len(values) != states.shape[0]):
            return f"{name} that is not one number per node"
    if tree.reach is not None and not all(isinstance(r, (int, float)) and 0.0 <= r <= 1.0 for r in tree.reach):
        return "reach probabilities outside [0, 1]"
    return None


# -- best-first growth ("ddtree_b") ------------------------------------------------------------


@dataclass(frozen=True)
class Edge:
    """One commit (position, token) out of a node, with its log-score (higher is likelier)."""

    position: int
    token: int
    logp: float

    def apply(self, state: torch.Tensor) -> torch.Tensor:
        child = state.clone()
        child[self.position] = self.token
        return child


@dataclass(frozen=True)
class SetEdge:
    """One step that commits a set of positions (SPOT-Sets), with its log-score."""

    positions: tuple[int, ...]
    tokens: tuple[int, ...]
    logp: float

    def apply(self, state: torch.Tensor) -> torch.Tensor:
        child = state.clone()
        child[list(self.positions)] = torch.tensor(self.tokens, dtype=state.dtype)
        return child


@dataclass(frozen=True)
class Frontier:
    """The nodes one `expand` call scores, with what a drafter needs to reuse work across levels."""

    nodes: tuple[int, ...]  # node ids in the growing tree
    parents: tuple[int, ...]  # each node's parent id (-1 for the root)
    states: torch.Tensor  # [B, K]
    depths: tuple[int, ...]


# expand(frontier) -> for each node its edges (Edge or SetEdge), sorted by logp descending.
Expander = Callable[[Frontier], list[list[Edge]] | list[list[SetEdge]]]

_EXPAND, _EDGE = 0, 1


def grow_best_first(
    root: torch.Tensor, budget: int, expand: Expander, gamma: Sequence[float] | None = None
) -> DraftTree:
    """Best-first tree growth under a node budget (DDTree's heap, arXiv 2604.12989, over commit steps:
    an edge commits one position, or a set of them).

    A node's score is the sum over its path of gamma[depth] * edge.logp (gamma = 1: the path's
    log-probability). A heap pops the best frontier item; popping a candidate edge adds its child
    node and pushes (a) the next sibling (same parent, next-ranked edge) and (b) the child's first
    child. Departure from DDTree: edges come from a model that must run per node, so (b) is pushed
    as a placeholder keyed by the child's own score, an upper bound on any descendant's (every
    weighted logp <= 0); when a placeholder reaches the top, every node still waiting is expanded
    in one batched `expand` call. The pop order, and so the tree, is exactly best-first.
    A child whose state is already in the tree (another commit order) is skipped. Expansion
    runs parents before children, so a drafter may reuse a parent's work for its children.

    Args:
        root: [K] the current state.
        gamma: per-depth weights (the last repeats); None means 1 at every depth.
    """
    states, parents, score, depth = [root], [()], [0.0], [0]
    logp = [0.0]  # the path's log-score without gamma: what reach is calibrated on
    seen = {tuple(root.tolist())}
    edges: dict[int, list[Edge] | list[SetEdge]] = {}
    heap: list[tuple[float, int, int, int, int]] = [(-0.0, 0, _EXPAND, 0, 0)]  # (-score, tiebreak, kind, node, rank)
    tiebreak = 1

    def weight(d: int) -> float:
        return 1.0 if not gamma else gamma[min(d, len(gamma) - 1)]

    def push_edge(node: int, rank: int) -> None:
        nonlocal tiebreak
        if rank < len(edges[node]):
            s = score[node] + weight(depth[node]) * edges[node][rank].logp
            heapq.heappush(heap, (-s, tiebreak, _EDGE, node, rank))
            tiebreak += 1

    while heap and len(states) - 1 < budget:
        neg, _, kind, node, rank = heapq.heappop(heap)
        if kind == _EXPAND:
            if node not in edges:
                waiting = [node] + [item[3] for item in heap if item[2] == _EXPAND and item[3] not in edges]
                frontier = Frontier(
                    nodes=tuple(waiting),
                    parents=tuple(parents[n][0] if parents[n] else -1 for n in waiting),
                    states=torch.stack([states[n] for n in waiting]),
                    depths=tuple(depth[n] for n in waiting),
                )
                for n, ranked in zip(waiting, expand(frontier), strict=True):
                    edges[n] = ranked
            push_edge(node, 0)
            continue
        push_edge(node, rank + 1)
        edge = edges[node][rank]
        child = edge.apply(states[node])
        key = tuple(child.tolist())
        if key in seen:
            continue
        seen.add(key)
        states.append(child)
        parents.append((node,))
        score.append(-neg)
        logp.append(logp[node] + edge.logp)
        depth.append(depth[node] + 1)
        heapq.heappush(heap, (neg, tiebreak, _EXPAND, len(states) - 1, 0))
        tiebreak += 1
    return DraftTree(states=torch.stack(states), parents=tuple(parents), scores=tuple(logp))
