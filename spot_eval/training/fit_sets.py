"""`spot-eval fit-sets`: fit SPOT-Sets' stale set predictor (spot.drafters.sets) on threshold trajectories
and write it with its target's fingerprint and threshold, or with --refresh SPOT-RS's rule into a SPOT-R file.

SPOT-RS's rule (spot/drafters/refreshed_sets.py) is the same rule on a SPOT-R head's refreshed confidences. The
metrics are measured on held-out requests (every other request of the directories, by request id) by a fit on the
rest, against the baseline set (and, for SPOT-RS, beside the stale rule fitted on the same split)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from spot.drafters.order_examples import RecordedBlock
from spot.drafters.refreshed_sets import refreshed_set_examples
from spot.drafters.sets import evaluate_sets, fit_stale_sets
from spot_eval.checkpoints.fingerprint import check_fingerprint
from spot_eval.checkpoints.refresh_head import (
    SET_POLICIES,
    RefreshedRule,
    load_refresh,
    recorded_tokens,
    same_projections,
    save_sets,
)
from spot_eval.checkpoints.set_predictor import write_set_predictor
from spot_eval.training.trajectories import PROJECTIONS, read_blocks, read_manifest, read_projections


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
    if policy not in SET_POLICIES:
        raise ValueError(f"{trajectories[0]} was recorded with policy {policy!r}, whose steps commit one position: "
                         "collect with --policy threshold --threshold TAU for a set predictor")
    for directory, manifest in zip(trajectories[1:], manifests[1:], strict=True):
        check_fingerprint(manifest.fingerprint, fingerprint, what=f"trajectories {directory} were recorded",
                          fix="pass directories of one target, block length and policy")
        if manifest.settings.threshold != threshold:
            raise ValueError(f"{directory} was recorded at threshold {manifest.settings.threshold}, {trajectories[0]} at {threshold}")
    return ThresholdData(fingerprint, threshold, [b for d in trajectories for b in read_blocks(d, policy)])


def split(blocks: list[RecordedBlock]) -> tuple[list[RecordedBlock], list[RecordedBlock]]:
    """(fitted on, held out): every other request of the blocks, by request id, held out."""
    held = set(sorted({b.request for b in blocks})[1::2])
    return [b for b in blocks if b.request not in held], [b for b in blocks if b.request in held]


def fit_sets_command(trajectories: Sequence[str | Path], out: str | Path, depths: int = 4) -> dict:
    data = threshold_data(trajectories)
    fingerprint, threshold, blocks = data.fingerprint, data.threshold, data.blocks
    train, heldout = split(blocks)
    report = {"threshold": threshold, "blocks": len(blocks), "heldout_blocks": len(heldout),
              "heldout": asdict(evaluate_sets(fit_stale_sets(train, threshold, depths), heldout, threshold, depths))}
    predictor = fit_stale_sets(blocks, threshold, depths)
    write_set_predictor(out, fingerprint, threshold, predictor, report)  # the file holds the coefficients once
    return {**report, "coefficients": [list(c) for c in predictor.coefficients]}


def fit_refreshed_sets_command(refresh: str | Path, trajectories: Sequence[str | Path], out: str | Path, depths: int = 4) -> dict:
    """SPOT-RS's rule on the refreshed confidences of `refresh`'s head, written into a copy of that file at `out` (may
    be the same); the trajectories must be recorded in the head's projections (collect --projections-from)."""
    data = threshold_data(trajectories)
    loaded = load_refresh(refresh)
    check_fingerprint(loaded.fingerprint, {**data.fingerprint, "policy": loaded.fingerprint["policy"]},
                      what=f"SPOT-R drafter {refresh} was trained", fix="pass trajectories of the target it was trained for")
    projections = [read_projections(d) if (Path(d) / PROJECTIONS).is_file() else None for d in trajectories]
    for directory, recorded in zip(trajectories, projections, strict=True):
        if recorded is None or not same_projections(recorded, loaded.hidden, loaded.embedding):
            raise ValueError(f"{directory} does not record the target's hidden states in the projections {refresh}'s head "
                             f"reads: collect them with --projections-from {refresh}")
    tokens = recorded_tokens(loaded, projections[0], str(trajectories[0]))

    def examples(blocks, depth):
        return refreshed_set_examples(blocks, tokens, depth)

    threshold, blocks = data.threshold, data.blocks
    train, heldout = split(blocks)
    report = {"threshold": threshold, "blocks": len(blocks), "heldout_blocks": len(heldout),
              "heldout": asdict(evaluate_sets(fit_stale_sets(train, threshold, depths, examples=examples), heldout, threshold,
                                              depths, examples)),
              "stale_heldout": asdict(evaluate_sets(fit_stale_sets(train, threshold, depths), heldout, threshold, depths))}
    rule = fit_stale_sets(blocks, threshold, depths, examples=examples)
    save_sets(refresh, out, RefreshedRule(threshold, rule, data.fingerprint, report), loaded.sha256)
    return {**report, "coefficients": [list(c) for c in rule.coefficients]}
