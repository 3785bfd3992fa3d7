"""budget=auto: size each draft tree by what a verify costs on this device [project design].

A verify forward with P pieces and L positions of context costs c(P, L) seconds (`VerifyCost`,
measured on the device by `spot.cost`); drafting a tree of n nodes costs d(n) seconds. The walk
reaches a drafted node i with probability r_i (calibrated, `spot.drafters.reach`), and every
reached node is one more step beside the free step, so a tree of nodes 1..n advances
1 + r_1 + ... + r_n steps in expectation. The rule maximises expected steps per second, in two
decisions per step:

1. How large a tree to draft, and how? Before drafting, only the drafter's mean reach by best-first
   rank (m_i, measured on held-out trajectories) is known, for each of its modes (a drafter may
   offer a cheap mode for small trees, spot.drafters.stale): draft n nodes in the mode and for the
   n that maximise (1 + m_1 + ... + m_n) / (c(n + 1, L) + d(n)), n = 0 (no draft, d(0) = 0) included.
2. How many of them to verify? Once drafted, the drafter's time is spent: verify the best-first
   prefix of n nodes, n = 0 included, that maximises (1 + r_1 + ... + r_n) / c(n + 1, L).

The probe that measures c and d runs outside decoding, and on this project's CPU it came out a few
percent optimistic against the same costs inside decoding, where drafting's margins are that thin.
So the costs are refitted to what decoding measures (`refit`, from the engine's `ForwardTiming`s):
the harness does it between requests, so every request decides with fixed inputs.

Verification is unchanged, so whatever size is chosen the output is the draft-free one.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

MIN_SAMPLES = 8  # forwards (or drafts) a refit factor needs: fewer keep the probe's value


@dataclass(frozen=True)
class VerifyCost:
    """c(P, L): the median seconds of one verify forward with P pieces and L positions of context.

    pieces: ascending, from 1. contexts: ascending. seconds[i][j]: at contexts[i] with pieces[j].
    Between the measured points c is linear in P and in L; below the shortest context it is the
    shortest's; beyond the largest P or L it continues the last segment's slope.
    """

    pieces: tuple[int, ...]
    contexts: tuple[int, ...]
    seconds: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        if not self.pieces or self.pieces[0] != 1 or list(self.pieces) != sorted(set(self.pieces)):
            raise ValueError(f"pieces must ascend from 1 without repeats, got {self.pieces}")
        if not self.contexts or list(self.contexts) != sorted(set(self.contexts)):
            raise ValueError(f"contexts must ascend without repeats, got {self.contexts}")
        if len(self.seconds) != len(self.contexts) or any(len(row) != len(self.pieces) for row in self.seconds):
            raise ValueError(f"seconds must be [contexts][pieces] = [{len(self.contexts)}][{len(self.pieces)}]")
        if not all(s > 0 for row in self.seconds for s in row):
            raise ValueError("every measured verify time must be positive")

    def __call__(self, pieces: int, context: int) -> float:
        row = [_linear(self.pieces, r, pieces) for r in self.seconds]
        return _linear(self.contexts, row, context)


def _linear(xs: Sequence[int], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through (xs, ys); below the range the first y, above it the last segment's
    slope continued, never below the last y (a cost does not fall with more work)."""
    if x <= xs[0] or len(xs) == 1:
        return ys[0]
    i = min(bisect.bisect_right(xs, x) - 1, len(xs) - 2)
    y = ys[i] + (ys[i + 1] - ys[i]) * (x - xs[i]) / (xs[i + 1] - xs[i])
    return max(y, ys[-1]) if x > xs[-1] else y


@dataclass(frozen=True)
class DraftMode:
    """One way a drafter drafts: its seconds per tree as measured at a few budgets (seconds[j] =
    (budget, seconds), budgets ascending; linear between them, constant beyond) and its mean reach
    by best-first rank (mean_reach[i]: node i + 1's)."""

    name: str
    seconds: tuple[tuple[int, float], ...]
    mean_reach: tuple[float, ...]

    def __post_init__(self) -> None:
        budgets = [b for b, _ in self.seconds]
        if not budgets or budgets != sorted(set(budgets)) or budgets[0] < 1:
            raise ValueError(f"the drafter's cost needs ascending budgets >= 1, got {budgets}")

    def drafter_seconds(self, n: int) -> float:
        if n <= 0:
            return 0.0
        budgets, seconds = [b for b, _ in self.seconds], [s for _, s in self.seconds]
        return seconds[-1] if n >= budgets[-1] else _linear(budgets, seconds, n)


@dataclass(frozen=True)
class ForwardTiming:
    """One verify forward as decoding ran it: `pieces` at `context` positions took `verify_seconds`,
    after a draft of `drafted` nodes in mode `mode` that took `draft_seconds` (0 and None: no draft)."""

    pieces: int
    context: int
    verify_seconds: float
    drafted: int = 0
    mode: str | None = None
    draft_seconds: float = 0.0


@dataclass(frozen=True)
class Plan:
    """Decision 1 for a block: draft `nodes` nodes in mode `mode` (nodes 0: no draft, mode None)."""

    mode: str | None
    nodes: int


@dataclass(frozen=True)
class Sizing:
    """What budget=auto decides with: the device's verify cost and the drafter's modes."""

    verify: VerifyCost
    modes: tuple[DraftMode, ...]

    def __post_init__(self) -> None:
        if not self.modes:
            raise ValueError("budget=auto needs at least one calibrated drafting mode")

    def plan(self, context: int, cap: int) -> Plan:
        """Decision 1: the mode and the number of nodes to draft, counting the drafter's time."""
        best, value = Plan(None, 0), 1.0 / self.verify(1, context)
        for mode in self.modes:
            n, v = _best(mode.mean_reach[:cap], lambda p: self.verify(p, context), mode.drafter_seconds)
            if n and v > value:
                best, value = Plan(mode.name, n), v
        return best

    def size(self, reach: Sequence[float], context: int) -> int:
        """Decision 2: how many of the drafted nodes (best first, reach[i] node i + 1's) to verify."""
        return best_size(reach, lambda p: self.verify(p, context), lambda n: 0.0)


def best_size(reach: Sequence[float], verify_seconds, drafter_seconds) -> int:
    """argmax over n in 0..len(reach) of (1 + reach[0] + ... + reach[n - 1]) / (verify_seconds(n + 1) +
    drafter_seconds(n)), drafter_seconds(0) taken as 0; ties go to the smaller tree."""
    return _best(reach, verify_seconds, drafter_seconds)[0]


def _best(reach: Sequence[float], verify_seconds, drafter_seconds) -> tuple[int, float]:
    """(best_size's n, its expected steps per second)."""
    best_n, best = 0, 1.0 / verify_seconds(1)
    steps = 1.0
    for n, r in enumerate(reach, start=1):
        steps += r
        value = steps / (verify_seconds(n + 1) + drafter_seconds(n))
        if value > best:
            best_n, best = n, value
    return best_n, best


def refit(sizing: Sizing, timings: Sequence[ForwardTiming]) -> Sizing:
    """`sizing` with its costs scaled to what decoding measured. Verify: per piece count P observed at
    least MIN_SAMPLES times, the median of measured over predicted seconds; every knot of the curve is
    scaled by the factor of the observed P nearest to it (ties to the smaller), so that the curve
    keeps its shape between observations. Drafting: per mode drafted at least MIN_SAMPLES times, the
    median of measured over predicted seconds scales all its budgets. Where nothing qualifies, the
    probe's values stay."""
    ratios: dict[int, list[float]] = {}
    for t in timings:
        ratios.setdefault(t.pieces, []).append(t.verify_seconds / sizing.verify(t.pieces, t.context))
    factors = {p: statistics.median(r) for p, r in ratios.items() if len(r) >= MIN_SAMPLES}
    verify = sizing.verify
    if factors:
        observed = sorted(factors)

        def factor(p: int) -> float:
            return factors[min(observed, key=lambda o: (abs(o - p), o))]

        seconds = tuple(tuple(s * factor(p) for p, s in zip(verify.pieces, row, strict=True)) for row in verify.seconds)
        verify = replace(verify, seconds=seconds)
    modes = []
    for mode in sizing.modes:
        drafts = [t.draft_seconds / mode.drafter_seconds(t.drafted) for t in timings if t.mode == mode.name and t.drafted]
        if len(drafts) >= MIN_SAMPLES:
            f = statistics.median(drafts)
            mode = replace(mode, seconds=tuple((b, s * f) for b, s in mode.seconds))
        modes.append(mode)
    return Sizing(verify, tuple(modes))
