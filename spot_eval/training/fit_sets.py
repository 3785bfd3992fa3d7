"""`spot-eval fit-sets`: fit SPOT-Sets' stale set predictor (spot.drafters.sets) on threshold trajectories
and write it with its target's fingerprint and threshold. The metrics are measured on held-out requests
(every other request of the directories, by request id) by a fit on the rest, against the baseline set."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from spot.drafters.order_examples import RecordedBlock
from spot.drafters.sets import evaluate_sets, fit_stale_sets
from spot_eval.checkpoints.fingerprint import check_fingerprint
from spot_eval.checkpoints.set_predictor import write_set_predictor
from spot_eval.training.trajectories import read_blocks, read_manifest

POLICIES = ("threshold", "dynamic")  # the policies that commit sets


@dataclass(frozen=True)
class ThresholdData:
    """Threshold trajectories of one target, block length and threshold, from one or more directories."""

    fingerprint: dict
    threshold: float
    blocks: list[RecordedBlock]


def threshold_data(trajectories: Sequence[str | Path]) -> ThresholdData:
    """Every block of the directories, checked to come from one target, block length, set policy and threshold."""
    manifests = [read_manifest(d) for d in trajectories]
    fingerprint, threshold = manifests[0].fingerprint, manifests[0].settings.threshold
    policy = fingerprint.get("policy")
    if policy not in POLICIES:
        raise ValueError(f"{trajectories[0]} was recorded with policy {policy!r}, whose steps commit one position: "
                         "collect with --policy threshold --threshold TAU for a set predictor")
    for directory, manifest in zip(trajectories[1:], manifests[1:], strict=True):
        check_fingerprint(manifest.fingerprint, fingerprint, what=f"trajectories {directory} were recorded",
                          fix="pass directories of one target, block length and policy")
        if manifest.settings.threshold != threshold:
            raise ValueError(f"{directory} was recorded at threshold {manifest.settings.threshold}, {trajectories[0]} at {threshold}")
    return ThresholdData(fingerprint, threshold, [b for d in trajectories for b in read_blocks(d, policy)])


def fit_sets_command(trajectories: Sequence[str | Path], out: str | Path, depths: int = 4) -> dict:
    data = threshold_data(trajectories)
    fingerprint, threshold, blocks = data.fingerprint, data.threshold, data.blocks
    held = set(sorted({b.request for b in blocks})[1::2])
    train = [b for b in blocks if b.request not in held]
    heldout = [b for b in blocks if b.request in held]
    report = {"threshold": threshold, "blocks": len(blocks), "heldout_blocks": len(heldout),
              "heldout": asdict(evaluate_sets(fit_stale_sets(train, threshold, depths), heldout, threshold, depths))}
    predictor = fit_stale_sets(blocks, threshold, depths)
    write_set_predictor(out, fingerprint, threshold, predictor, report)  # the file holds the coefficients once
    return {**report, "coefficients": [list(c) for c in predictor.coefficients]}
