"""`spot-eval fit-gamma`: fit SPOT-gamma's per-depth exponents on held-out trajectories and store
them in the drafter checkpoint (spot/drafters/gamma.py has the definition)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from spot.drafters.gamma import fit_gamma
from spot.drafters.order_examples import RecordedBlock
from spot.drafters.order_training import split_by_request
from spot.drafters.spot import SpotDrafter
from spot_eval.checkpoints.drafter import DrafterCheckpoint, load_checkpoint, save_checkpoint
from spot_eval.checkpoints.fingerprint import fingerprint_mismatch
from spot_eval.training.trajectories import read_blocks, read_manifest


def heldout_blocks(checkpoint: DrafterCheckpoint, trajectories: Sequence[str | Path], every: bool = False) -> list[RecordedBlock]:
    """The blocks of the requests the drafter's training held out (its recorded split) in `trajectories`;
    with `every`, all their blocks (trajectories the drafter was not trained on)."""
    policy = checkpoint.fingerprint.get("policy", "single")
    for directory in trajectories:
        differences = fingerprint_mismatch(checkpoint.fingerprint, read_manifest(directory).fingerprint)
        if differences:
            raise ValueError(f"{directory} was recorded for another target than {checkpoint.path}: {'; '.join(differences)}")
    blocks = [b for directory in trajectories for b in read_blocks(directory, policy=policy)]
    if every:
        return blocks
    split = checkpoint.metrics.get("config", {})
    return split_by_request(blocks, split.get("heldout_fraction", 0.1), split.get("seed", 0))[1]


def fit_gamma_command(
    drafter: str | Path, trajectories: Sequence[str | Path], budget: int, out: str | Path | None, max_blocks: int
) -> dict:
    """Fit on the requests the drafter's training held out; returns what was stored."""
    checkpoint = load_checkpoint(drafter)
    heldout = heldout_blocks(checkpoint, trajectories)
    fit = fit_gamma(SpotDrafter(checkpoint.model), heldout[:max_blocks], budget)
    report = {
        "gamma": list(fit.gamma[:8]),
        "budget": budget,
        "heldout_blocks": min(len(heldout), max_blocks),
        "commits_per_forward": fit.commits_per_forward,
        "spot_commits_per_forward": fit.baseline_commits_per_forward,
        "grid": [list(row) for row in fit.grid],
    }
    save_checkpoint(out or drafter, checkpoint.model, checkpoint.fingerprint,
                    {**checkpoint.metrics, "gamma_fit": report}, gamma=list(fit.gamma), reach=checkpoint.reach,
                    stale=checkpoint.stale)
    return report
