"""`spot-eval calibrate-reach`: fit the calibrations that budget=auto sizes SPOT's trees by, on
held-out trajectories, and store them in the drafter checkpoint: the reach of the order model's
trees (spot/drafters/reach.py has the definition), and the stale-confidence order's temperature
with the reach of its trees (spot/drafters/stale.py), the cheap mode for small trees."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

from spot.drafters.reach import ReachCalibration, ReplayedTree, fit_reach, replay, with_table
from spot.drafters.spot import SpotDrafter
from spot.drafters.stale import StaleOrder, fit_temperature
from spot_eval.checkpoints.drafter import load_checkpoint, save_checkpoint
from spot_eval.training.fit_gamma import heldout_blocks


def calibrate_reach_command(
    drafter: str | Path,
    trajectories: Sequence[str | Path],
    budget: int,
    out: str | Path | None,
    max_blocks: int,
    all_blocks: bool = False,
) -> dict:
    """Replay plain SPOT's walk at `budget` over the requests the drafter's training held out, in both
    modes, fit, store; returns what was stored and the calibration tables (of a fit on half the
    trees, measured on the other half). SPOT-gamma reuses them: the calibrated score is the path's
    log-score without gamma. all_blocks: every block of `trajectories`, which were collected apart
    from the drafter's training data."""
    checkpoint = load_checkpoint(drafter)
    heldout = heldout_blocks(checkpoint, trajectories, all_blocks)[:max_blocks]
    stale_fit = fit_temperature(heldout)
    spot = SpotDrafter(checkpoint.model, stale=StaleOrder(stale_fit.temperature))
    reach, model_report = _fit(list(replay(spot.grow, heldout, budget)))
    stale_reach, stale_report = _fit(list(replay(spot.grow, heldout, budget, mode="stale")))
    stale = StaleOrder(stale_fit.temperature, stale_reach)
    report = {"budget": budget, "heldout_blocks": len(heldout), **model_report,
              "stale": {**asdict(stale_fit), **stale_report}}
    save_checkpoint(out or drafter, checkpoint.model, checkpoint.fingerprint,
                    {**checkpoint.metrics, "reach_fit": report}, gamma=checkpoint.gamma, reach=reach, stale=stale)
    return report


def _fit(replayed: list[ReplayedTree | None]) -> tuple[ReachCalibration, dict]:
    """The calibration fitted on every tree, with the error table of a fit on every other tree measured
    on the rest; and its report."""
    trees = [t for t in replayed if t is not None]
    table = with_table(fit_reach(trees[::2]), trees[1::2])
    fit = replace(fit_reach(trees), bins=table.bins, error=table.error)
    forwards = len(replayed)
    return fit, {
        "trees": len(trees),
        "nodes": sum(len(t.scores) for t in trees),
        "commits_per_forward": (forwards - len(trees) + sum(t.steps for t in trees)) / max(forwards, 1),
        "knots": [len(m.scores) for m in fit.maps],
        "calibration_error": fit.error,
        "mean_reach": list(fit.mean_reach[:8]),
        "bins": [asdict(b) for b in fit.bins],
    }
