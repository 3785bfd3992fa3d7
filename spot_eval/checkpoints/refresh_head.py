"""SPOT-R's drafter on disk: the refresh head, the target's projections it reads through, and the SPOT order model
whose tree it refreshes, in one file.

One `torch.save`d dict, read back with `torch.load(path, weights_only=True)`:

    {"format": "spot-refresh-head/2", "state_dict": {...}, "projections": {"hidden": {...}, "embedding": {...}},
     "sha256": "...", "config": RefreshConfig.to_dict(), "fingerprint": target_fingerprint(...),
     "metrics": {...held-out top-1 shares...}, "order": {a spot-order-model checkpoint's dict},
     "stale": StaleOrder.to_dict()}

`stale` is the temperature at which the refreshed confidences order a node in place of the order model
(SpotDrafter's mode "stale", the method spot_rc): fitted on the held-out requests, or as `train-refresh
--order-temperature` set it.

`sha256` covers the head's weights and both projections; the order model carries its own (spot_eval.checkpoints.
drafter). Both were trained for the target the fingerprint names: another target's file is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from spot.drafters.refresh import RefreshConfig, RefreshedTokens, RefreshHead
from spot.drafters.set_model import Projection
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
KEYS = ("format", "state_dict", "projections", "sha256", "config", "fingerprint", "metrics", "order", "stale")
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


def save_refresh(path: str | Path, head: RefreshHead, hidden: Projection, embedding: Projection, fingerprint: dict,
                 metrics: dict, order: dict, stale: StaleOrder) -> None:
    """Write atomically (temp file + rename); `order` is the order model's checkpoint dict (checkpoint_payload),
    `stale` the refreshed confidences' order."""
    state = {k: v.detach().cpu().clone() for k, v in head.state_dict().items()}
    projections = {"hidden": hidden.to_dict(), "embedding": embedding.to_dict()}
    payload = {"format": FORMAT, "state_dict": state, "projections": projections, "sha256": projected_sha256(state, projections),
               "config": head.config.to_dict(), "fingerprint": dict(fingerprint), "metrics": metrics, "order": order,
               "stale": stale.to_dict()}
    write_atomically(path, lambda tmp: torch.save(payload, tmp))


def load_refresh(path: str | Path) -> RefreshFile:
    """Load and verify; every way the file can be damaged or foreign is a ValueError naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"SPOT-R drafter {path} does not exist; {FIX}")

    def corrupt(why: str) -> ValueError:
        return ValueError(f"SPOT-R drafter {path} is corrupt or not a SPOT-R drafter ({why}); {FIX}")

    raw = read_payload(path, FORMAT, KEYS, corrupt, retired={
        "spot-refresh-head/1": f"SPOT-R drafter {path} predates the refreshed order's temperature (format "
                               f"spot-refresh-head/1); {FIX}"})
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
    except (TypeError, KeyError, ValueError) as err:
        raise corrupt(f"the refreshed order: {type(err).__name__}: {str(err)[:200]}") from None
    if [k for k in IDENTITY if k not in raw["fingerprint"]]:
        raise corrupt("the target fingerprint is incomplete")
    order = checkpoint_from_payload(raw["order"], str(path), corrupt)
    return RefreshFile(str(path), config, raw["state_dict"], hidden, embedding, raw["fingerprint"], raw["metrics"], order, stale)


def refresh_for_target(target, policy: str, path: str | Path) -> tuple[DrafterCheckpoint, RefreshedTokens, StaleOrder]:
    """The file's order model, refreshed tokens and refreshed order, checked to belong to this target, block length
    and policy; the head on the target's device, its token embeddings the target's own, projected."""
    loaded = load_refresh(path)
    what = f"SPOT-R drafter {path} was trained"
    check_fingerprint(loaded.fingerprint, target_fingerprint(target, policy), what=what, fix=FIX)
    check_fingerprint(loaded.order.fingerprint, target_fingerprint(target, policy), what=f"{what} (its order model)", fix=FIX)
    head = RefreshHead(loaded.config, loaded.embedding(target.embeddings().detach()))
    head.load_state_dict(loaded.state_dict, strict=True)
    return loaded.order, RefreshedTokens(head.to(target.device).eval(), loaded.hidden), loaded.stale
