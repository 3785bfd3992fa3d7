"""Spiffy (Agrawal et al., arXiv 2509.18085): auto-speculative drafts over a calibrated draft graph.

Spiffy drafts future block states from the target's own distribution, with no draft model. The
drafts follow a fixed directed graph (a DAG) of *formulas*, calibrated offline once per target and
instantiated online with the live distribution (method.md §3).

Formulas. At a root state, the stale distribution (the target's logits from the previous forward)
ranks the root's masked positions by their top-1 probability: position rank i, 0 = most confident
(ties go to the leftmost position). Within a position it ranks the tokens: vocab rank j, 0 = the
token the target would draw. A formula (i, j) names "the j-th token at the i-th position", never a
concrete token, so one graph serves every state.

Nodes. A graph node is the root plus a set of formulas; its depth is the number of denoising steps
it skips. Under `single` (one commit per step) depth == the number of commits; under `threshold` a
step may commit several positions, so 1 <= depth <= commits. Node B's parents are the nodes A with
depth(B) == depth(A) + 1 and commits(A) a proper subset of commits(B): one state reached through
several commit orders has several parents, which is what makes the graph a DAG and not a tree.
Node 0 is the root (no commits, depth 0). `declared_nodes` counts the nodes beyond the root (the
paper's D), the number a budget counts.

Instantiation at temperature T (the graph is calibrated at T = 0 and reused at every T, as in the
paper; the engine's coupled noise keeps decoding exact whatever the drafts are):
    T = 0: vocab rank j is the j-th token by stale log-probability (the target draws the argmax).
    T > 0: [INF] vocab rank j is the j-th token of (filtered stale logits / T + that commit step's
        coupled Gumbel noise) over the stale top-k, exactly the draw the target makes at that step
        if the stale logits were its logits (as SPOT's `order_model.predict`). Which step commits
        which formula is not stored in an unordered set, so a node's commits are assigned steps by
        ascending position rank (the target commits its most confident positions first): under
        `single` the k-th commit is drawn with the noise of step root + k; under `threshold` the
        surplus commits (commits - depth) join the first step, then one commit per step. A node
        and its parent may therefore draw one position with different steps' noise; acceptance
        tests state equality only, so this costs acceptance, never exactness.
    Position ranks use the plain stale top-1 log-probability at every T (what calibration ranked).
    A node whose formula names a position rank beyond the root's masked positions, a vocab rank
    beyond the stale top-k, or a token the sampling filters remove (top-k/top-p) is dropped, and
    so is a node left without an instantiated parent. Two nodes with one state keep the first.

Pruning (§3.5). A node's local score is the geometric mean of the stale probabilities p_ij of its
drafted tokens (at T > 0 under the filtered, temperature-scaled stale distribution, renormalised
over the top-k). childScore is the geometric mean of its children's scores, and score =
GM(local, childScore) (a leaf's score is its local score). [INF] The kept set stays connected:
starting from the root, repeatedly keep the highest-scoring node that has a kept parent (ties to
the earlier node) until D* nodes are kept. The drafter keeps min(D*, budget) nodes; with
prune_to=None, D* is the whole graph (then only the budget prunes).

Shapes: K block length, k stale top-k, N nodes beyond the root.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from spot.config import POLICIES, Sampling
from spot.drafters.base import DraftContext
from spot.drafters.order_model import step_noise_at_topk
from spot.policy import filtered_logits, topk_logprobs
from spot.tree import DraftTree


@dataclass(frozen=True, order=True)
class Formula:
    """One drafted token: the `token`-th ranked token at the `rank`-th ranked masked position (i, j)."""

    rank: int
    token: int


@dataclass(frozen=True)
class GraphNode:
    """commits: sorted by (rank, token), one per position rank; parents: indices of earlier nodes;
    count: how often calibration saw this future (0 when hand-made)."""

    commits: tuple[Formula, ...]
    depth: int
    parents: tuple[int, ...]
    count: int = 0


@dataclass(frozen=True)
class SpiffyGraph:
    """A validated draft graph. nodes[0] is the root; every node comes after all its parents.

    target: the fingerprint of the (target, block length, policy) it was calibrated for (as on disk;
        `block_length` and `policy` at least). calibration: how it was made (as on disk).
    """

    nodes: tuple[GraphNode, ...]
    block_length: int
    policy: str
    target: dict[str, object]
    calibration: dict[str, object]

    def __post_init__(self) -> None:
        _check_structure(self)

    @property
    def size(self) -> int:
        """Nodes beyond the root (the paper's D)."""
        return len(self.nodes) - 1

    @property
    def reach(self) -> tuple[float, ...] | None:
        """Per node, how often calibration saw its future among the roots it counted (node 0's count):
        the probability that the walk reaches it, as budget=auto reads it; None for a hand-made graph.
        Calibrated at T = 0 and reused at every T, like the graph itself (an overestimate at T > 0)."""
        root = self.nodes[0].count
        return tuple(n.count / root for n in self.nodes) if root > 0 else None

    @property
    def max_token_rank(self) -> int:
        return max((f.token for node in self.nodes for f in node.commits), default=0)


def _check_structure(graph: SpiffyGraph) -> None:
    k, policy = graph.block_length, graph.policy
    if k < 1:
        raise ValueError(f"block_length must be >= 1, got {k}")
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; a graph is calibrated for one of {', '.join(POLICIES)}")
    if graph.target.get("block_length") != k or graph.target.get("policy") != policy:
        raise ValueError(
            f"the target fingerprint says block length {graph.target.get('block_length')!r} and policy "
            f"{graph.target.get('policy')!r}, the graph {k} and {policy!r}"
        )
    if not graph.nodes or graph.nodes[0] != GraphNode((), 0, (), graph.nodes[0].count):
        raise ValueError("node 0 must be the root: no commits, depth 0, no parents")
    seen: dict[tuple[int, tuple[Formula, ...]], int] = {}
    for index, node in enumerate(graph.nodes[1:], start=1):
        twin = seen.setdefault((node.depth, node.commits), index)
        if twin != index:
            raise ValueError(f"nodes {twin} and {index} are the same node (depth {node.depth}, commits {_pairs(node.commits)})")
        ranks = [f.rank for f in node.commits]
        if not node.commits or list(node.commits) != sorted(set(node.commits)) or len(set(ranks)) != len(ranks):
            raise ValueError(f"node {index} needs >= 1 commits, sorted, at most one per position rank; got {_pairs(node.commits)}")
        if any(f.rank < 0 or f.token < 0 or f.rank >= k for f in node.commits):
            raise ValueError(f"node {index} has a formula outside 0 <= i < {k}, 0 <= j: {_pairs(node.commits)}")
        n = len(node.commits)
        if (policy == "single" and node.depth != n) or not 1 <= node.depth <= n:
            rule = "== its commits" if policy == "single" else "in 1 .. its commits"
            raise ValueError(f"node {index} has depth {node.depth} for {n} commits; policy {policy} needs depth {rule}")
        if not node.parents:
            raise ValueError(f"node {index} has no parent; every node beyond the root needs >= 1")
        for p in node.parents:
            if not 0 <= p < index:
                raise ValueError(f"node {index} names parent {p}; number every node after its parents")
            parent = graph.nodes[p]
            if parent.depth != node.depth - 1 or not set(parent.commits) < set(node.commits):
                raise ValueError(
                    f"node {index} (depth {node.depth}, commits {_pairs(node.commits)}) cannot have parent {p} "
                    f"(depth {parent.depth}, commits {_pairs(parent.commits)}): a parent is one step shallower "
                    "and commits a proper subset"
                )


def _pairs(commits: Sequence[Formula]) -> list[list[int]]:
    return [[f.rank, f.token] for f in commits]


# -- instantiation and pruning ------------------------------------------------------------------


def position_order(top1_logprob: torch.Tensor, masked: torch.Tensor) -> list[int]:
    """Position rank -> position: the masked positions by descending stale top-1 log-probability,
    ties to the leftmost. top1_logprob, masked: [K]."""
    values = top1_logprob.tolist()
    return sorted((p for p in range(len(values)) if bool(masked[p])), key=lambda p: (-values[p], p))


def commit_offsets(n_commits: int, depth: int) -> list[int]:
    """The step (after the root's) that draws each of a node's commits, in position-rank order: the
    surplus of a `threshold` node joins the first step, then one commit per step."""
    surplus = n_commits - depth
    return [max(0, k - surplus) for k in range(n_commits)]


@dataclass(frozen=True)
class Drafts:
    """An instantiated graph. states: [N + 1, K], row 0 the root; parents: as in DraftTree;
    local: each node's mean log stale probability over its drafted tokens (0.0 for the root);
    nodes: the graph node each row instantiates (the first, where formulas meet in one state)."""

    states: torch.Tensor
    parents: tuple[tuple[int, ...], ...]
    local: tuple[float, ...]
    nodes: tuple[int, ...]


def instantiate(
    graph: SpiffyGraph,
    state: torch.Tensor,
    logprobs: torch.Tensor,
    ids: torch.Tensor,
    mask_id: int,
    sampling: Sampling,
    noise: Callable[[int], torch.Tensor] | None = None,
) -> Drafts:
    """Turn the graph's formulas into block states at one root.

    Args:
        state: [K] the root.
        logprobs, ids: [K, k] the stale top-k log-softmax (descending, mask token excluded) and its ids.
        noise: offset e -> [K, k] float64 coupled noise at `ids` of the step root + e; needed at T > 0.
    """
    order = position_order(logprobs[:, 0], state == mask_id)
    t = sampling.temperature
    if t > 0:
        if noise is None:
            raise ValueError("instantiating at temperature > 0 needs the steps' coupled noise")
        z = filtered_logits(logprobs.double(), sampling)  # [K, k], -inf where top-k/top-p drop a token
        probs = torch.softmax(z, dim=-1)
    else:
        z, probs = logprobs.double(), logprobs.double().exp()
    ranked: dict[int, torch.Tensor] = {}  # offset -> [K, k] slice indices by the draw's order at that step

    def ranking(offset: int) -> torch.Tensor:
        if offset not in ranked:
            key = z + noise(offset) if t > 0 else z
            ranked[offset] = torch.sort(key, dim=-1, descending=True, stable=True).indices
        return ranked[offset]

    states, parents, local, nodes = [state], [()], [0.0], [0]
    kept: dict[int, int] = {0: 0}  # graph node -> draft row
    rows: dict[tuple[int, ...], int] = {tuple(state.tolist()): 0}
    for index, node in enumerate(graph.nodes[1:], start=1):
        alive = sorted({kept[p] for p in node.parents if p in kept})
        if not alive:
            continue
        child, logp = state.clone(), 0.0
        for formula, offset in zip(node.commits, commit_offsets(len(node.commits), node.depth), strict=True):
            if formula.rank >= len(order) or formula.token >= ids.shape[1]:
                break
            p = order[formula.rank]
            slot = int(ranking(offset)[p, formula.token])
            if not math.isfinite(float(z[p, slot])):
                break
            child[p] = ids[p, slot]
            logp += math.log(max(float(probs[p, slot]), 1e-300))
        else:
            key = tuple(child.tolist())
            if key in rows:  # the same state through other formulas: keep the first
                kept[index] = rows[key]
                continue
            kept[index] = rows[key] = len(states)
            states.append(child)
            parents.append(tuple(alive))
            local.append(logp / len(node.commits))
            nodes.append(index)
    return Drafts(torch.stack(states), tuple(parents), tuple(local), tuple(nodes))


def scores(parents: Sequence[Sequence[int]], local: Sequence[float]) -> list[float]:
    """Log of Spiffy's node score: GM(local, GM(children's scores)), a leaf's being its local score.

    parents: per node (node 0 the root), earlier node indices; local: per node, log local score.
    """
    children: list[list[int]] = [[] for _ in local]
    for node, ps in enumerate(parents):
        for p in ps:
            children[p].append(node)
    out = list(local)
    for node in reversed(range(len(local))):
        if children[node]:
            child = sum(out[c] for c in children[node]) / len(children[node])
            out[node] = (local[node] + child) / 2
    return out


def prune(parents: Sequence[Sequence[int]], local: Sequence[float], keep: int) -> list[int]:
    """The nodes (beyond the root, ascending) to keep: greedily the best-scoring node with a kept
    parent (or the root), until `keep` are kept."""
    score = scores(parents, local)
    chosen = {0}
    while len(chosen) - 1 < keep:
        frontier = [n for n in range(1, len(local)) if n not in chosen and any(p in chosen for p in parents[n])]
        if not frontier:
            break
        chosen.add(max(frontier, key=lambda n: (score[n], -n)))
    return sorted(chosen - {0})


class SpiffyDrafter:
    """Spiffy over a calibrated graph: instantiate, keep min(prune_to, budget) nodes, verify.

    order: which nodes are kept. "score" (Spiffy v4, the default): the online pruning above, by each node's
        geometric-mean score on the live distribution. "calibration" (Spiffy as first published [INF: peers.md],
        `spiffy_v1`): the instantiated nodes in the graph's own order, the most often calibrated first, with no
        online pruning; prune_to is then the D of the graph verified.
    topk: how many stale tokens per position are ranked (at least the graph's largest vocab rank + 1).
    """

    ORDERS = ("score", "calibration")

    def __init__(self, graph: SpiffyGraph, prune_to: int | None = 3, topk: int = 32, order: str = "score") -> None:
        if prune_to is not None and prune_to < 1:
            raise ValueError(f"prune_to must be >= 1 (or None for the whole graph), got {prune_to}")
        if order not in self.ORDERS:
            raise ValueError(f"unknown order {order!r}; choose {' or '.join(self.ORDERS)}")
        self.graph = graph
        self.prune_to = prune_to
        self.order = order
        self.name = "spiffy" if order == "score" else "spiffy_v1"
        self.topk = max(topk, graph.max_token_rank + 1)
        self._reach = graph.reach  # per graph node; computed once, read by every tree

    @property
    def modes(self) -> dict[str, tuple[float, ...]]:
        """budget=auto's expectation before drafting (its one mode, "graph"): each graph node's reach,
        in graph order; none for a graph without calibration counts."""
        return {} if self._reach is None else {"graph": self._reach[1:]}

    def draft(self, ctx: DraftContext) -> DraftTree:
        if ctx.state.shape[0] != self.graph.block_length or ctx.config.policy != self.graph.policy:
            raise ValueError(
                f"this Spiffy graph is for block length {self.graph.block_length} and policy {self.graph.policy!r}, "
                f"but decoding uses block length {ctx.state.shape[0]} and policy {ctx.config.policy!r}; "
                "calibrate a graph for these settings (spot-eval spiffy-calibrate)"
            )
        if ctx.stale_logits is None:  # a block's first step: no distribution of this block yet
            return DraftTree.root_only(ctx.state)
        state = ctx.state.cpu()
        logprobs, ids = topk_logprobs(ctx.stale_logits, min(self.topk, ctx.stale_logits.shape[-1] - 1), ctx.mask_id)

        def noise(offset: int) -> torch.Tensor:
            return step_noise_at_topk(ctx.config.seed, ctx.request, ctx.block, ctx.step + offset, ids)

        drafts = instantiate(self.graph, state, logprobs, ids, ctx.mask_id, ctx.config.sampling, noise)
        keep = min(ctx.budget, self.prune_to if self.prune_to is not None else self.graph.size)
        rows = list(range(len(drafts.local)))
        if len(rows) - 1 > keep:
            # Instantiated nodes keep the graph's order, parents first: its first keep + 1 rows are connected.
            rows = [0, *prune(drafts.parents, drafts.local, keep)] if self.order == "score" else rows[: keep + 1]
        new = {old: i for i, old in enumerate(rows)}
        parents = tuple(tuple(new[p] for p in drafts.parents[r] if p in new) for r in rows)
        reach = None if self._reach is None else tuple(self._reach[drafts.nodes[r]] for r in rows)
        return DraftTree(drafts.states[rows], parents, reach=reach)
