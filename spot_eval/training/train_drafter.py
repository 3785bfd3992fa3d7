"""`spot-eval train-drafter`: read trajectories, train the order model, save the drafter checkpoint."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from spot.drafters.order_training import Progress, TrainConfig, TrainResult, train
from spot_eval.checkpoints.drafter import save_checkpoint
from spot_eval.checkpoints.fingerprint import fingerprint_mismatch
from spot_eval.training.trajectories import read_blocks, read_manifest


def metrics_dict(result: TrainResult, config: TrainConfig) -> dict:
    """The checkpoint's `metrics`: held-out accuracies and how they were obtained (plain JSON types)."""
    heldout = result.heldout
    return {
        "heldout_top1_depth0": heldout.depth0.model,
        "heuristic_top1_depth0": heldout.depth0.heuristic,
        "heldout_top1_by_depth": [a.model for a in heldout.by_depth],
        "heuristic_top1_by_depth": [a.heuristic for a in heldout.by_depth],
        "heldout_examples_by_depth": [a.examples for a in heldout.by_depth],
        "heldout_depth0_by_temperature": {str(t): asdict(a) for t, a in heldout.by_temperature},
        "heldout_loss": heldout.loss,
        "heldout_requests": result.heldout_requests,
        "train_requests": result.train_requests,
        "train_examples": result.train_examples,
        "parameters": result.parameters,
        "steps": result.steps,
        "stopped_early": result.stopped_early,
        "final_train_loss": result.curve[-1][1] if result.curve else None,
        "train_seconds": result.seconds,
        "config": {k: v for k, v in asdict(config).items() if k not in ("device", "model")},
    }


def train_drafter(
    trajectories: Sequence[str | Path],
    out: str | Path,
    policy: str,
    config: TrainConfig,
    progress: Callable[[Progress], None] | None = None,
) -> dict:
    """Train on every block of `trajectories` (one target fingerprint) and save to `out`; returns the metrics."""
    if not trajectories:
        raise ValueError("no --trajectories directories given")
    fingerprint = read_manifest(trajectories[0]).fingerprint
    for directory in trajectories[1:]:
        other = read_manifest(directory).fingerprint
        differences = fingerprint_mismatch(fingerprint, other)
        if differences:
            raise ValueError(
                f"{trajectories[0]} (target {fingerprint}) and {directory} (target {other}) differ in "
                f"{'; '.join(differences)}; train one drafter per target, block length and policy"
            )
    blocks = [b for directory in trajectories for b in read_blocks(directory, policy=policy)]
    result = train(blocks, config, progress)
    metrics = metrics_dict(result, config)
    save_checkpoint(out, result.model, fingerprint, metrics)
    return metrics
