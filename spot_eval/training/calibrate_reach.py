"""`spot-eval calibrate-reach`: fit the calibration that budget=auto sizes SPOT's trees by, on
held-out trajectories, and store it in the drafter checkpoint (spot/drafters/reach.py has the
definition)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

from spot.drafters.reach import fit_reach, replay, with_table
from spot.drafters.spot import SpotDrafter
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
    """Replay plain SPOT's walk at `budget` over the requests the drafter's training held out, fit,
    store; returns what was stored and the calibration table (of a fit on half the trees, measured
    on the other half). SPOT-gamma reuses it: the calibrated
    score is the path's log-score without gamma. all_blocks: every block of `trajectories`, which were
    collected apart from the drafter's training data."""
    checkpoint = load_checkpoint(drafter)
    heldout = heldout_blocks(checkpoint, trajectories, all_blocks)[:max_blocks]
    trees = [t for t in replay(SpotDrafter(checkpoint.model).grow, heldout, budget) if t is not None]
    # The error table of a fit on every other tree, measured on the rest; the stored map is fitted on all.
    table = with_table(fit_reach(trees[::2]), trees[1::2])
    fit = replace(fit_reach(trees), bins=table.bins, error=table.error)
    report = {
        "budget": budget,
        "heldout_blocks": len(heldout),
        "trees": len(trees),
        "nodes": sum(len(t.scores) for t in trees),
        "knots": [len(m.scores) for m in fit.maps],
        "calibration_error": fit.error,
        "mean_reach": list(fit.mean_reach[:8]),
        "bins": [asdict(b) for b in fit.bins],
    }
    save_checkpoint(out or drafter, checkpoint.model, checkpoint.fingerprint,
                    {**checkpoint.metrics, "reach_fit": report}, gamma=checkpoint.gamma, reach=fit)
    return report
