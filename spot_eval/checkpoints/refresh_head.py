"""SPOT-R's drafter on disk: the refresh head, the target's projections it reads through, and the SPOT order model
whose tree it refreshes, in one file.

One `torch.save`d dict, read back with `torch.load(path, weights_only=True)`:

    {"format": "spot-refresh-head/2", "state_dict": {...}, "projections": {"hidden": {...}, "embedding": {...}},
     "sha256": "...", "config": RefreshConfig.to_dict(), "fingerprint": target_fingerprint(...),
     "metrics": {...held-out top-1 shares...}, "order": {a spot-order-model checkpoint's dict},
     "stale": StaleOrder.to_dict(), "reach": ReachCalibration.to_dict() or None,
     "sets": {"threshold": tau, "coefficients": [[a, b, e], ...], "fingerprint": target_fingerprint(..., threshold
              policy), "fit": {...held-out report...}} or None}

`stale` is the temperature at which the refreshed confidences order a node in place of the order model
(SpotDrafter's mode "stale", the method spot_rc), chosen by replaying its trees over the held-out requests (or as
`train-refresh --order-temperature` set it), with the reach calibration of those trees; `reach` is the calibration
of SPOT-R's own trees (the order model's). budget=auto sizes trees by them (spot.drafters.reach). `reach` is
optional: a file written before it decodes at fixed budgets, and `spot-eval calibrate-reach` adds it. `sets`, also
optional, is SPOT-RS's rule (spot.drafters.refreshed_sets: the method sets_r, threshold decoding at tau), fitted on
threshold trajectories recorded in the head's projections by `spot-eval fit-sets --refresh`.

`sha256` covers the head's weights and both projections; the order model carries its own (spot_eval.checkpoints.
drafter). Both were trained for the target the fingerprint names: another target's file is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from spot.drafters.reach import ReachCalibration
from spot.drafters.refresh import RefreshConfig, RefreshedTokens, RefreshHead
from spot.drafters.refreshed_sets import RefreshedSets
from spot.drafters.set_model import Projection
from spot.drafters.sets import StaleSets
from spot.drafters.stale import StaleOrder
from spot_eval.checkpoints.atomic_file import write_atomically
from spot_eval.checkpoints.drafter import (
    DrafterCheckpoint,
    checkpoint_from_payload,
    projected_sha256,
    read_payload,
)
from spot_eval.checkpoints.fingerprint import IDENTITY, check_fingerprint, target_fingerprint

FORMAT = "spot-refresh-head/2"
SET_POLICIES = ("threshold", "dynamic")  # the policies whose steps commit sets (SPOT-RS's)
KEYS = ("format", "state_dict", "projections", "sha256", "config", "fingerprint", "metrics", "order", "stale")  # and "reach"
FIX = ("train one for this target (spot-eval collect --hidden-dims 64, then spot-eval train-refresh --order-model "
       "SPOT_DRAFTER.pt)")


@dataclass(frozen=True)
class RefreshFile:
    """A loaded, verified SPOT-R file: the head's weights (eval mode, on the CPU, its token embeddings still to be
    projected from the target's), the projections, and the order model's checkpoint."""

    path: str
    config: RefreshConfig
    state_dict: dict[str, torch.Tensor]
    hidden: Projection
    embedding: Projection
    fingerprint: dict
    metrics: dict
    order: DrafterCheckpoint
    stale: StaleOrder
    reach: ReachCalibration | None  # SPOT-R's trees' (the stale order's trees carry their own in `stale`)
    sha256: str  # of the head's weights and projections, as recorded and verified
    sets: RefreshedRule | None = None  # SPOT-RS's, where fitted


@dataclass(frozen=True)
class RefreshedRule:
    """SPOT-RS's inclusion rule on the head's refreshed confidences, fitted at `threshold` for the target and policy
    of `fingerprint` (a set policy), with its held-out report."""

    threshold: float
    rule: StaleSets
    fingerprint: dict
    fit: dict

    def to_dict(self) -> dict:
        return {"threshold": self.threshold, **self.rule.to_dict(), "fingerprint": dict(self.fingerprint), "fit": self.fit}

    @staticmethod
    def from_dict(raw: dict) -> RefreshedRule:
        return RefreshedRule(float(raw["threshold"]), StaleSets.from_dict(raw), dict(raw["fingerprint"]), dict(raw["fit"]))


def save_refresh(path: str | Path, head: RefreshHead, hidden: Projection, embedding: Projection, fingerprint: dict,
                 metrics: dict, order: dict, stale: StaleOrder, reach: ReachCalibration | None = None) -> None:
    """Write atomically (temp file + rename); `order` is the order model's checkpoint dict (checkpoint_payload),
    `stale` the refreshed confidences' order, `reach` SPOT-R's trees' calibration."""
    state = {k: v.detach().cpu().clone() for k, v in head.state_dict().items()}
    projections = {"hidden": hidden.to_dict(), "embedding": embedding.to_dict()}
    payload = {"format": FORMAT, "state_dict": state, "projections": projections, "sha256": projected_sha256(state, projections),
               "config": head.config.to_dict(), "fingerprint": dict(fingerprint), "metrics": metrics, "order": order}
    write_atomically(path, lambda tmp: torch.save({**payload, **_orders(stale, reach)}, tmp))


def save_sets(path: str | Path, out: str | Path, sets: RefreshedRule, sha256: str) -> None:
    """Write `path`'s file to `out` (may be the same) with SPOT-RS's rule, the rest as it was; `sha256` the head's that
    the rule was fitted with (RefreshFile.sha256), so that a file replaced meanwhile is refused."""
    raw = _read(Path(path))
    if raw["sha256"] != sha256:
        raise ValueError(f"{path} changed while SPOT-RS's rule was fitted on its head; fit it again")
    raw = {**raw, "sets": sets.to_dict()}
    write_atomically(out, lambda tmp: torch.save(raw, tmp))


def save_orders(path: str | Path, out: str | Path, stale: StaleOrder, reach: ReachCalibration | None, metrics: dict,
                sha256: str) -> None:
    """Write `path`'s file to `out` (may be the same) with another refreshed order, reach calibration and metrics, the
    head and the order model as they were; `sha256` the head's that was calibrated (RefreshFile.sha256), so that a
    file replaced meanwhile is refused, not given another head's calibration."""
    raw = _read(Path(path))
    if raw["sha256"] != sha256:
        raise ValueError(f"{path} changed while it was calibrated (its head is no longer the one replayed); calibrate "
                         "it again")
    raw = {**raw, "metrics": metrics, **_orders(stale, reach)}
    write_atomically(out, lambda tmp: torch.save(raw, tmp))


def _orders(stale: StaleOrder, reach: ReachCalibration | None) -> dict:
    return {"stale": stale.to_dict(), "reach": None if reach is None else reach.to_dict()}


def load_refresh(path: str | Path) -> RefreshFile:
    """Load and verify; every way the file can be damaged or foreign is a ValueError naming it."""
    path = Path(path)
    raw, corrupt = _read(path), _corrupt(path)
    try:
        if projected_sha256(raw["state_dict"], raw["projections"]) != raw["sha256"]:
            raise corrupt("the weights or projections do not match their recorded sha256")
        config = RefreshConfig(**raw["config"])
        hidden, embedding = (Projection.from_dict(raw["projections"][k]) for k in ("hidden", "embedding"))
        RefreshHead(config, torch.zeros(1, config.embedding_dims)).load_state_dict(raw["state_dict"], strict=True)
    except (TypeError, RuntimeError, KeyError, AttributeError) as err:
        raise corrupt(f"{type(err).__name__}: {str(err)[:300]}") from None
    try:
        stale = StaleOrder.from_dict(raw["stale"])
        reach = None if raw.get("reach") is None else ReachCalibration.from_dict(raw["reach"])
        sets = None if raw.get("sets") is None else RefreshedRule.from_dict(raw["sets"])
    except (TypeError, KeyError, ValueError) as err:
        raise corrupt(f"the refreshed order, the reach calibration or SPOT-RS's rule: {type(err).__name__}: {str(err)[:200]}") from None
    if [k for k in IDENTITY if k not in raw["fingerprint"]]:
        raise corrupt("the target fingerprint is incomplete")
    order = checkpoint_from_payload(raw["order"], str(path), corrupt)
    return RefreshFile(str(path), config, raw["state_dict"], hidden, embedding, raw["fingerprint"], raw["metrics"], order, stale,
                       reach, raw["sha256"], sets)


def _corrupt(path: Path):
    return lambda why: ValueError(f"SPOT-R drafter {path} is corrupt or not a SPOT-R drafter ({why}); {FIX}")


def _read(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"SPOT-R drafter {path} does not exist; {FIX}")
    return read_payload(path, FORMAT, KEYS, _corrupt(path), retired={
        "spot-refresh-head/1": f"SPOT-R drafter {path} predates the refreshed order's temperature (format "
                               f"spot-refresh-head/1); {FIX}"})


def recorded_tokens(loaded: RefreshFile, projections: dict, where: str) -> RefreshedTokens:
    """The file's head reading recorded trajectories (`projections`: their projections.pt, spot_eval.training.
    trajectories.read_projections): its token embeddings the recorded ones, its hidden states read as recorded
    (already projected: spot.drafters.reach.replay). The trajectories must be projected as the head was trained:
    from the same collect."""
    if not Projection.from_dict(projections["hidden"]).same(loaded.hidden):
        raise ValueError(f"{where} projects the target's hidden states on other components than {loaded.path} was trained "
                         "on: pass the trajectories it was trained on (spot-eval train-refresh --trajectories)")
    head = RefreshHead(loaded.config, projections["token_coords"])
    head.load_state_dict(loaded.state_dict, strict=True)
    return RefreshedTokens(head.eval(), Projection.identity(loaded.config.hidden_dims))


def refresh_for_target(target, policy: str, path: str | Path) -> tuple[RefreshFile, RefreshedTokens]:
    """The loaded file (its order model, refreshed order and reach) and its refreshed tokens, checked to belong to
    this target, block length and policy; the head on the target's device, its token embeddings the target's own,
    projected."""
    loaded = load_refresh(path)
    what = f"SPOT-R drafter {path} was trained"
    check_fingerprint(loaded.fingerprint, target_fingerprint(target, policy), what=what, fix=FIX)
    check_fingerprint(loaded.order.fingerprint, target_fingerprint(target, policy), what=f"{what} (its order model)", fix=FIX)
    return loaded, _tokens(loaded, target)


def refreshed_sets_for_target(target, policy: str, threshold: float, path: str | Path) -> RefreshedSets:
    """SPOT-RS's predictor from a SPOT-R file with a fitted rule, checked to belong to this target and block length
    (the head: whichever policy it was trained under; the rule: this policy and threshold)."""
    if policy not in SET_POLICIES:
        raise ValueError(f"sets_r drafts the sets a threshold step commits, and policy {policy!r} commits one position a "
                         "step: decode with --unmasking threshold (unmasking=threshold), or use spot_r")
    loaded = load_refresh(path)
    fix = (f"fit one: spot-eval collect --policy {policy} --threshold {threshold} --hidden-dims {loaded.config.hidden_dims} "
           f"--embedding-dims {loaded.config.embedding_dims} --projections-from {path}, then spot-eval fit-sets --refresh {path} "
           "--trajectories DIR (docs/methods/spot-sets.md)")
    check_fingerprint(loaded.fingerprint, target_fingerprint(target, loaded.fingerprint["policy"]),
                      what=f"SPOT-R drafter {path} was trained", fix=FIX)
    if loaded.sets is None:
        raise ValueError(f"SPOT-R drafter {path} holds no SPOT-RS rule, which sets_r reads; {fix}")
    check_fingerprint(loaded.sets.fingerprint, target_fingerprint(target, policy), what=f"SPOT-RS's rule in {path} was fitted",
                      fix=fix)
    if loaded.sets.threshold != threshold:
        raise ValueError(f"SPOT-RS's rule in {path} was fitted at threshold {loaded.sets.threshold}, but decoding uses "
                         f"{threshold}; {fix}")
    return RefreshedSets(_tokens(loaded, target), loaded.sets.rule)


def same_projections(projections: dict, hidden: Projection, embedding: Projection) -> bool:
    """Whether recorded trajectories' projections (their projections.pt) are these, hidden and embedding."""
    return Projection.from_dict(projections["hidden"]).same(hidden) and Projection.from_dict(projections["embedding"]).same(embedding)


def _tokens(loaded: RefreshFile, target) -> RefreshedTokens:
    """The head on the target's device, its token embeddings the target's own, projected."""
    head = RefreshHead(loaded.config, loaded.embedding(target.embeddings().detach()))
    head.load_state_dict(loaded.state_dict, strict=True)
    return RefreshedTokens(head.to(target.device).eval(), loaded.hidden)
