"""Calibrated reach: the probability that the engine's walk reaches a drafted node [project design].

SPOT grows its tree best-first by path score: the sum of the node's edge log-scores (order-model
log-probability of the position plus the stale log-probability of the token). Those scores rank
well but are not probabilities of acceptance. Monotone maps from score to probability (isotonic
regression over score quantiles, interpolated between their centres), one for a tree's first node,
one for its next two and one for the rest, are fitted on held-out trajectories by replaying the
engine's own walk over recorded draft-free blocks (SPOT-gamma's fit, spot.drafters.gamma, replays
the same walk): from step s the tree is grown from the stale distribution of step s - 1, the nodes
equal to the true states s + 1, s + 2, ... in a row are the reached ones, and the replay jumps past
them.
`budget=auto` (spot.sizing) sizes each tree by these probabilities.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace

from spot.config import DecodeConfig, Sampling
from spot.drafters.base import DraftContext
from spot.drafters.order_examples import RecordedBlock
from spot.tree import DraftTree


@dataclass(frozen=True)
class ReplayedTree:
    """One tree of the replayed walk: its nodes' path scores (root excluded, best first) and which
    of them the walk reached."""

    scores: tuple[float, ...]
    reached: tuple[bool, ...]
    context: int = 0  # positions before the block (what the verify forward attends to)

    @property
    def steps(self) -> int:
        """Steps this forward advances: the free step plus one per reached node."""
        return 1 + sum(self.reached)


def replay(grow, blocks: Sequence[RecordedBlock], budget: int, mode: str | None = None) -> Iterator[ReplayedTree | None]:
    """The engine's walk over recorded blocks, one item per verify forward: the tree grown at that
    root (grow(ctx, topk_logprobs, topk_ids, prior) -> DraftTree, ctx.mode `mode`), or None at a
    block's first step, which has no stale distribution to draft from (one step, no tree). Where the
    block recorded hidden states, ctx.stale_hidden is the stale step's, [K, R] as recorded: already
    projected, so a drafter that reads them is replayed through the identity projection."""
    for block in blocks:
        n_steps = block.states.shape[0] - 1
        config = DecodeConfig(block_length=block.states.shape[1], sampling=Sampling(block.temperature), seed=block.seed, budget=budget)
        s = 0
        while s < n_steps:
            if s == 0:
                yield None
                s += 1
                continue
            ctx = DraftContext(block.states[s], None, block.states[s - 1], None, config, block.mask_id, block.request,
                               block.block, s, budget, lambda _: None, mode,
                               None if block.hidden is None else block.hidden[s - 1].float())
            tree: DraftTree = grow(ctx, block.topk_logprobs[s - 1].float(), block.topk_ids[s - 1].long(), block.prior(s))
            ahead = {tuple(block.states[t].tolist()): t for t in range(s + 1, n_steps)}  # the finished state needs no node
            at = [ahead.get(tuple(row)) for row in tree.states[1:].tolist()]
            accepted = 1
            while s + accepted in at:
                accepted += 1
            reached = tuple(t is not None and t < s + accepted for t in at)
            yield ReplayedTree(tree.scores[1:] if tree.scores else (), reached, block.block * block.states.shape[1])
            s += accepted


@dataclass(frozen=True)
class CalibrationBin:
    """Nodes whose predicted reach fell in [low, high): their mean prediction and observed rate."""

    low: float
    high: float
    predicted: float
    observed: float
    count: int


RANK_GROUPS = (1, 2, 4)  # best-first ranks from which a map of its own starts: the first node, the next two, the rest


@dataclass(frozen=True)
class ReachMap:
    """P(reach | path score) for one group of best-first ranks: piecewise linear through (scores[i],
    reach[i]), scores ascending and reach non-decreasing (a better-scored node is never less likely),
    constant beyond the ends."""

    scores: tuple[float, ...]
    reach: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.scores or len(self.scores) != len(self.reach) or list(self.scores) != sorted(self.scores):
            raise ValueError("a reach map needs ascending scores with one reach value each")

    def __call__(self, score: float) -> float:
        xs, ys = self.scores, self.reach
        if score <= xs[0]:
            return ys[0]
        if score >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_right(xs, score) - 1
        return ys[i] + (ys[i + 1] - ys[i]) * (score - xs[i]) / (xs[i + 1] - xs[i])


@dataclass(frozen=True)
class ReachCalibration:
    """P(the walk reaches a node | its path score, its best-first rank): one monotone map per group of
    ranks (`ranks[g]` is group g's first rank), since at equal score a tree's first node is reached more
    often than a deep one (its competitors are fewer).

    mean_reach[i]: how often the walk reached the (i + 1)-th best-first node of a tree, over the
    held-out trees (what budget=auto expects before it drafts). bins: predicted against observed
    reach, by predicted value (the calibration error table). error: their count-weighted mean
    absolute gap (expected calibration error).
    """

    ranks: tuple[int, ...]
    maps: tuple[ReachMap, ...]
    mean_reach: tuple[float, ...]
    bins: tuple[CalibrationBin, ...] = ()
    error: float = 0.0

    def __post_init__(self) -> None:
        if not self.ranks or self.ranks[0] != 1 or list(self.ranks) != sorted(set(self.ranks)) or len(self.maps) != len(self.ranks):
            raise ValueError(f"a reach calibration needs one map per rank group, the groups ascending from rank 1; got {self.ranks}")

    def __call__(self, scores: Sequence[float]) -> tuple[float, ...]:
        """The reach of a tree's nodes from their path scores, given best first (rank 1 first)."""
        return tuple(self.maps[bisect.bisect_right(self.ranks, rank) - 1](s) for rank, s in enumerate(scores, start=1))

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(raw: dict) -> ReachCalibration:
        maps = tuple(ReachMap(tuple(float(x) for x in m["scores"]), tuple(float(y) for y in m["reach"])) for m in raw["maps"])
        bins = tuple(CalibrationBin(**b) for b in raw.get("bins", ()))
        return ReachCalibration(tuple(int(r) for r in raw["ranks"]), maps, tuple(float(m) for m in raw["mean_reach"]),
                                bins, float(raw.get("error", 0.0)))


def isotonic(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """The non-decreasing sequence closest to `values` in weighted least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, length]
    for v, w in zip(values, weights, strict=True):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, w1, n1), (m2, w2, n2) = blocks.pop(-2), blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return [m for m, _, n in blocks for _ in range(n)]


def _fit_map(pairs: list[tuple[float, bool]], n_knots: int) -> ReachMap:
    """Isotonic regression over `n_knots` score quantiles of (score, reached) pairs sorted by score:
    each knot its quantile's mean score and, after pooling violators, its reach rate."""
    edges = {0, len(pairs)}
    for i in range(1, n_knots):
        edge = round(i * len(pairs) / n_knots)
        while 0 < edge < len(pairs) and pairs[edge - 1][0] == pairs[edge][0]:
            edge += 1  # equal scores stay in one quantile
        edges.add(edge)
    cuts = sorted(edges)
    groups = [pairs[a:b] for a, b in zip(cuts, cuts[1:], strict=False) if b > a]
    rates = isotonic([sum(r for _, r in g) / len(g) for g in groups], [len(g) for g in groups])
    return ReachMap(tuple(sum(s for s, _ in g) / len(g) for g in groups), tuple(rates))


def fit_reach(trees: Sequence[ReplayedTree], n_knots: int = 32, ranks: tuple[int, ...] = RANK_GROUPS) -> ReachCalibration:
    """One monotone map per rank group (`_fit_map`), and the mean reach by best-first rank; no table
    (`with_table`). A group without nodes takes the previous group's map."""
    if not any(t.scores for t in trees):
        raise ValueError("no drafted nodes to calibrate on: replay more blocks (or blocks of more than one step)")
    maps: list[ReachMap] = []
    for g, first in enumerate(ranks):
        last = ranks[g + 1] - 1 if g + 1 < len(ranks) else None
        pairs = sorted((s, r) for t in trees for rank, (s, r) in enumerate(zip(t.scores, t.reached, strict=True), start=1)
                       if rank >= first and (last is None or rank <= last))
        maps.append(_fit_map(pairs, n_knots) if pairs else maps[-1])
    width = max(len(t.reached) for t in trees)
    mean_reach = tuple(sum(t.reached[i] for t in trees if i < len(t.reached)) / len(trees) for i in range(width))
    return ReachCalibration(ranks, tuple(maps), mean_reach)


def with_table(calibration: ReachCalibration, trees: Sequence[ReplayedTree], n_bins: int = 10) -> ReachCalibration:
    """The calibration with its error table measured on `trees` (held out from the fit, to be honest):
    predicted against observed reach in `n_bins` equal-width bins of predicted reach."""
    predicted = [p for t in trees for p in calibration(t.scores)]
    observed = [r for t in trees for r in t.reached]
    bins, gap = [], 0.0
    for b in range(n_bins):
        low, high = b / n_bins, (b + 1) / n_bins
        inside = [(p, r) for p, r in zip(predicted, observed, strict=True) if low <= p < high or (b == n_bins - 1 and p == high)]
        if inside:
            p, o = sum(p for p, _ in inside) / len(inside), sum(r for _, r in inside) / len(inside)
            bins.append(CalibrationBin(low, high, p, o, len(inside)))
            gap += len(inside) * abs(p - o)
    return replace(calibration, bins=tuple(bins), error=gap / max(len(observed), 1))
