"""SPOT-gamma: the project's definition of the paper's undocumented variant [INF].

SPOT scores a tree path by the sum of its edges' log-probabilities. SPOT-gamma weights the edges
at depth d by an exponent gamma_d (P^gamma_d): gamma > 1 sharpens, so the budget follows the
most likely order deeper; gamma < 1 flattens, so it buys more alternatives near the root. The
exponents are fitted on held-out trajectories to maximise the expected commits per verify
forward, by replaying the engine's own walk over recorded draft-free blocks: from step s the tree
is grown from the stale distribution of step s - 1, the accepted steps are the true future states
found in it plus the free step, and the replay jumps to s + accepted. Verification is unchanged,
so SPOT-gamma is exactly as lossless as every method.

The family searched is gamma_d = a * b**d (a: the root's weight, b: the change per level).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from spot.drafters.order_examples import RecordedBlock
from spot.drafters.reach import replay
from spot.drafters.spot import SpotDrafter

MAX_DEPTH = 32


@dataclass(frozen=True)
class GammaFit:
    gamma: tuple[float, ...]  # per depth, the last repeating
    commits_per_forward: float  # at the fitted gamma, on the held-out blocks
    baseline_commits_per_forward: float  # gamma = 1 (plain SPOT), same blocks
    grid: tuple[tuple[float, float, float], ...]  # (a, b, commits per forward) for every point tried


def replay_commits(drafter: SpotDrafter, blocks: Sequence[RecordedBlock], budget: int) -> float:
    """Commits per verify forward of the engine's walk over recorded blocks."""
    steps = forwards = 0
    for tree in replay(drafter.grow, blocks, budget):
        steps += 1 if tree is None else tree.steps
        forwards += 1
    return steps / max(forwards, 1)


def depth_weights(a: float, b: float) -> tuple[float, ...]:
    return tuple(a * b**d for d in range(MAX_DEPTH))


def fit_gamma(
    drafter: SpotDrafter,
    blocks: Sequence[RecordedBlock],
    budget: int,
    roots: Sequence[float] = (0.5, 0.75, 1.0, 1.5, 2.0),
    slopes: Sequence[float] = (0.8, 0.9, 1.0, 1.1, 1.25),
) -> GammaFit:
    """Grid search of (a, b); ties keep the earlier point, so the fit is deterministic."""
    grid = []
    with torch.inference_mode():
        for a, b in itertools.product(roots, slopes):
            trial = SpotDrafter(drafter.model, gate=drafter.gate, gamma=depth_weights(a, b), model_depth=drafter.model_depth)
            grid.append((a, b, replay_commits(trial, blocks, budget)))
        baseline = replay_commits(SpotDrafter(drafter.model, gate=drafter.gate, model_depth=drafter.model_depth), blocks, budget)
    a, b, best = max(grid, key=lambda row: row[2])
    return GammaFit(depth_weights(a, b), best, baseline, tuple(grid))
