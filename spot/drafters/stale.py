"""The stale-confidence order: SPOT's tree without the order model's call, for small trees [project design].

P(next commit = p) is proportional to c_p^(1 / temperature) over the node's masked positions, c_p
the stale distribution's confidence in the token the node's step would draw at p (what the order
model also reads). The target commits its most confident position under *fresh* logits, which
the stale ones predict less well than the model does (held-out next-commit top-1 of the embedded
target, block 32: 0.59 at T = 0 and 0.61 at T = 1, against the model's 0.77), but it costs no
network call, and where the model's call costs as much as a piece of the verify forward, a tree
of one or two nodes pays more often in this mode (budget=auto picks per block, spot.sizing).
The temperature is fitted on held-out trajectories by the likelihood of the true next commit; the
mode's reach has a calibration of its own (spot.drafters.reach), since its scores differ.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from spot.drafters.order_examples import RecordedBlock
from spot.drafters.reach import ReachCalibration, replay

TEMPERATURES = tuple(10 ** (i / 10) for i in range(-30, 11))  # 0.001 .. 10, log-spaced
TREE_TEMPERATURES = (0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 0.4, 1.0)  # each a replay of every block: a coarser grid


@dataclass(frozen=True)
class StaleOrder:
    """temperature: the fitted exponent's inverse; reach: the mode's calibration (None until fitted)."""

    temperature: float
    reach: ReachCalibration | None = None

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"the stale order's temperature must be positive, got {self.temperature}")

    def logits(self, confidence: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        """[..., K] order logits from confidences [..., K], -inf where not masked."""
        return (confidence.clamp_min(1e-12).log() / self.temperature).float().masked_fill(~masked, float("-inf"))

    def to_dict(self) -> dict:
        return {"temperature": self.temperature, "reach": None if self.reach is None else self.reach.to_dict()}

    @staticmethod
    def from_dict(raw: dict) -> StaleOrder:
        reach = raw.get("reach")
        return StaleOrder(float(raw["temperature"]), None if reach is None else ReachCalibration.from_dict(reach))


@dataclass(frozen=True)
class StaleFit:
    """The fitted temperature, the mean log-likelihood of the true next commit under it, and the top-1
    accuracy of the stale confidence (the temperature does not change the argmax), over `steps`."""

    temperature: float
    log_likelihood: float
    top1: float
    steps: int


def fit_temperature(blocks: Sequence[RecordedBlock], temperatures: Sequence[float] = TEMPERATURES) -> StaleFit:
    """The temperature on the grid that maximises the likelihood of each step's committed position, from
    step s >= 1 of every block (the stale distribution is step s - 1's, the confidence the one the
    node's step would draw with its noise, as the drafter sees it)."""
    log_conf, truth = [], []
    for block in blocks:
        positions = block.committed_positions()
        for s in range(1, block.states.shape[0] - 1):
            if positions[s] < 0:  # a set policy's step of several commits: no single position to predict
                continue
            confidence = block.drawn_confidence(s - 1, s).clamp_min(1e-12)  # [K]
            log_conf.append(confidence.log().masked_fill(block.states[s] != block.mask_id, -math.inf))
            truth.append(int(positions[s]))
    if not truth:
        raise ValueError("no steps to fit the stale order on: pass blocks of three or more steps")
    return fit_order(torch.stack(log_conf), torch.tensor(truth), temperatures)


def fit_order(log_conf: torch.Tensor, truth: torch.Tensor, temperatures: Sequence[float] = TEMPERATURES) -> StaleFit:
    """The temperature on the grid that maximises the likelihood of the committed positions `truth` [S] under
    softmax(log_conf / temperature), log_conf [S, K] the log-confidences (-inf where not masked); what any
    confidence (the stale one, SPOT-R's refreshed one) is fitted with. Ties go to the larger temperature (the
    likelihood saturates once the order is sharp enough)."""
    x = log_conf
    top1 = float((x.argmax(-1) == truth).double().mean())
    scored = [(float(torch.log_softmax(x / t, -1).gather(-1, truth[:, None]).mean()), t) for t in temperatures]
    likelihood, temperature = max(scored)
    return StaleFit(temperature, likelihood, top1, len(truth))


@dataclass(frozen=True)
class TreeFit:
    """The temperature whose replayed trees commit the most per verify forward, that figure, and every temperature
    tried with its own: ((temperature, commits per forward), ...)."""

    temperature: float
    commits_per_forward: float
    grid: tuple[tuple[float, float], ...]


def fit_by_trees(grow_at: Callable[[float], Callable], blocks: Sequence[RecordedBlock], budget: int,
                 temperatures: Sequence[float] = TREE_TEMPERATURES, progress: Callable[[], None] | None = None) -> TreeFit:
    """The temperature on the grid whose trees commit the most per verify forward, replaying the engine's walk over
    `blocks` at `budget` (spot.drafters.reach.replay) in mode "stale" with grow_at(temperature), a drafter's `grow`.
    What a tree wants is sharper than what the likelihood of the next commit picks: the tree spends its budget on the
    order's first few positions, and the likelihood rewards mass spread over the rest (SPOT-RC on the embedded
    target, budget 8: 0.03 against the likelihood's 0.4, bench/order_temperature.py). Ties keep the sharper.
    progress: called after each block's replay."""
    if not blocks:
        raise ValueError("no recorded blocks to replay the order's trees on: pass trajectories with held-out requests")
    grid = []
    for temperature in temperatures:
        steps = forwards = 0
        grow = grow_at(temperature)
        for block in blocks:
            for tree in replay(grow, [block], budget, mode="stale"):
                steps, forwards = steps + (1 if tree is None else tree.steps), forwards + 1
            if progress is not None:
                progress()
        if not forwards:
            raise ValueError("the recorded blocks hold no step to replay: pass trajectories with held-out requests")
        grid.append((temperature, steps / forwards))
    best = min(grid, key=lambda row: (-row[1], row[0]))  # the most commits; of equals, the sharpest
    return TreeFit(best[0], best[1], tuple(grid))
