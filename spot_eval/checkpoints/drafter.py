"""SPOT's order-model drafter on disk.

A checkpoint is one `torch.save`d dict, read back with `torch.load(path, weights_only=True)`:

    {"format": "spot-order-model/3", "state_dict": {...}, "state_sha256": "...",
     "config": OrderModelConfig.to_dict(), "fingerprint": target_fingerprint(...),
     "metrics": {...held-out accuracies...}, "gamma": None, "reach": None, "stale": None}

"reach" (optional; `spot-eval calibrate-reach`) maps tree scores to the probability that the walk
reaches a node (spot.drafters.reach), which budget=auto needs. "stale" (optional, written by the
same command) holds the stale-confidence order's temperature and its own reach calibration
(spot.drafters.stale), the cheap mode budget=auto may pick for small trees.

`state_sha256` is there because torch's zip reader does not check the data it reads: a flipped byte
inside a weight tensor loads silently and only makes the drafter worse. Every way a file can be
damaged is therefore a `ValueError` naming the file, never a quietly slower decode. The
fingerprint (spot_eval/checkpoints/fingerprint.py) says which target the drafter was trained for.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from spot.drafters.order_model import OrderModel, OrderModelConfig
from spot.drafters.reach import ReachCalibration
from spot.drafters.stale import StaleOrder
from spot_eval.checkpoints.atomic_file import write_atomically
from spot_eval.checkpoints.fingerprint import IDENTITY

FORMAT = "spot-order-model/3"
# Formats this version reads no more, with why: the order model's inputs changed.
RETIRED = {
    "spot-order-model/1": "its order model reads no last-commit input (format 1, before 2026-12)",
    "spot-order-model/2": "its order model reads no margin, writing-front or prior-forward inputs (format 2, 2026-12-01)",
}
KEYS = ("format", "state_dict", "state_sha256", "config", "fingerprint", "metrics", "gamma")


def state_sha256(state_dict: dict[str, torch.Tensor]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}:".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def projected_sha256(state: dict[str, torch.Tensor], projections: dict[str, dict[str, torch.Tensor]]) -> str:
    """state_sha256 over a network's weights and the projections it reads through (a set model's, SPOT-R's head's)."""
    flat = {f"state.{k}": v for k, v in state.items()}
    flat |= {f"{name}.{k}": v for name, projection in projections.items() for k, v in projection.items()}
    return state_sha256(flat)


@dataclass(frozen=True)
class DrafterCheckpoint:
    """A loaded, verified checkpoint: `model` holds the weights (eval mode, on the CPU)."""

    path: str
    model: OrderModel
    config: OrderModelConfig
    fingerprint: dict
    metrics: dict
    gamma: tuple[float, ...] | None  # SPOT-gamma's per-depth exponents (spot.drafters.spot), None for plain SPOT
    reach: ReachCalibration | None = None  # for budget=auto; None until calibrated
    stale: StaleOrder | None = None  # budget=auto's cheap mode; None until calibrated


def save_checkpoint(
    path: str | Path,
    model: OrderModel,
    fingerprint: dict,
    metrics: dict,
    gamma: Sequence[float] | None = None,
    reach: ReachCalibration | None = None,
    stale: StaleOrder | None = None,
) -> None:
    """Write atomically (temp file + rename): an interrupted save never leaves a half checkpoint."""
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    payload = {
        "format": FORMAT,
        "state_dict": state,
        "state_sha256": state_sha256(state),
        "config": model.config.to_dict(),
        "fingerprint": dict(fingerprint),
        "metrics": metrics,
        "gamma": None if gamma is None else [float(g) for g in gamma],
        "reach": None if reach is None else reach.to_dict(),
        "stale": None if stale is None else stale.to_dict(),
    }
    write_atomically(path, lambda tmp: torch.save(payload, tmp))


def read_payload(path: Path, fmt: str, keys: Sequence[str], corrupt: Callable[[str], ValueError],
                 retired: dict[str, str] | None = None) -> dict:
    """The dict a drafter file holds, loaded with weights_only=True and checked to be of format `fmt` with every
    one of `keys`; `corrupt(why)` is the error for a damaged or foreign file, `retired` maps an earlier format
    to its own message."""
    try:
        raw = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:  # torch raises many kinds here (zip, unpickling, unicode, EOF)
        raise corrupt(f"torch.load failed: {type(err).__name__}: {str(err)[:200]}") from None
    if isinstance(raw, dict) and raw.get("format") in (retired or {}):
        raise ValueError(retired[raw["format"]])
    if not isinstance(raw, dict) or raw.get("format") != fmt:
        found = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise corrupt(f"format {found!r}, expected {fmt!r}")
    missing = [k for k in keys if k not in raw]
    if missing:
        raise corrupt(f"missing keys {missing}")
    return raw


def load_checkpoint(path: str | Path) -> DrafterCheckpoint:
    """Load and verify a drafter checkpoint.

    Raises:
        FileNotFoundError: no such file.
        ValueError: naming the file, for a corrupt, truncated or foreign file.
    """
    raw, corrupt = _read_checkpoint(path)
    return checkpoint_from_payload(raw, str(path), corrupt)


def checkpoint_payload(path: str | Path) -> dict:
    """The dict a checkpoint file holds, verified as load_checkpoint does (what SPOT-R's file carries of its order
    model)."""
    raw, corrupt = _read_checkpoint(path)
    checkpoint_from_payload(raw, str(path), corrupt)
    return raw


def _read_checkpoint(path: str | Path) -> tuple[dict, Callable[[str], ValueError]]:
    """The file's dict (read_payload's checks) and the error that names the file for any later defect."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"drafter checkpoint {path} does not exist; train one with spot-eval train-drafter")

    def corrupt(why: str) -> ValueError:
        return ValueError(
            f"drafter checkpoint {path} is corrupt or truncated ({why}); retrain it (spot-eval train-drafter) "
            "or re-download it"
        )

    raw = read_payload(path, FORMAT, KEYS, corrupt, retired={
        old: f"drafter checkpoint {path} was written by an earlier spot-eval: {why}; retrain it with spot-eval "
             "train-drafter on the same trajectories" for old, why in RETIRED.items()})
    return raw, corrupt


def checkpoint_from_payload(raw: dict, path: str, corrupt: Callable[[str], ValueError]) -> DrafterCheckpoint:
    """A checkpoint's dict (read_payload's) verified and built; `corrupt(why)` names the file for every defect."""
    missing = [k for k in KEYS if not isinstance(raw, dict) or k not in raw]
    if missing or raw.get("format") != FORMAT:
        raise corrupt(f"the order model is not a {FORMAT} payload (missing {missing})")
    state = raw["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise corrupt("state_dict is not a dict of tensors")
    if state_sha256(state) != raw["state_sha256"]:
        raise corrupt("the weights do not match their recorded sha256")
    try:
        config = OrderModelConfig(**raw["config"])
        model = OrderModel(config)
        model.load_state_dict(state, strict=True)
    except (TypeError, RuntimeError) as err:
        raise corrupt(f"the weights do not fit the recorded config: {str(err)[:300]}") from None
    fingerprint = raw["fingerprint"]
    missing_fp = [k for k in IDENTITY if not isinstance(fingerprint, dict) or k not in fingerprint]
    if missing_fp:
        raise corrupt(f"the target fingerprint lacks {missing_fp}")
    gamma = raw["gamma"]
    if gamma is not None and not (isinstance(gamma, list) and all(isinstance(g, float) for g in gamma)):
        raise corrupt(f"gamma is {gamma!r}, expected null or a list of floats")

    def optional(key: str, parse, what: str):
        """raw[key] parsed, None where absent; a malformed value is a corrupt file."""
        if raw.get(key) is None:
            return None
        try:
            return parse(raw[key])
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise corrupt(f"{what} is malformed ({err})") from None

    reach = optional("reach", ReachCalibration.from_dict, "the reach calibration")
    stale = optional("stale", StaleOrder.from_dict, "the stale order")
    return DrafterCheckpoint(path, model.eval(), config, fingerprint, raw["metrics"],
                             None if gamma is None else tuple(gamma), reach, stale)
