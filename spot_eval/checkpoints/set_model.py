"""SPOT-Sets' learned set model on disk, with the target's projections it reads through.

One `torch.save`d dict, read back with `torch.load(path, weights_only=True)`:

    {"format": "spot-set-model/1", "state_dict": {...}, "projections": {"hidden": {...}, "embedding": {...}},
     "sha256": "...", "config": SetModelConfig.to_dict(), "fingerprint": target_fingerprint(...),
     "threshold": 0.9, "metrics": {...held-out rates...}}

`sha256` covers the weights and both projections (torch's zip reader does not check the bytes it
reads). The fingerprint names the target the projections were fitted on and the model trained for:
another target's model is refused, except by `spot-eval train-sets --init-from`, which refits the
projections on the new target and continues training.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from spot.drafters.set_model import LearnedSets, Projection, SetModel, SetModelConfig
from spot_eval.checkpoints.atomic_file import write_atomically
from spot_eval.checkpoints.drafter import projected_sha256, read_payload
from spot_eval.checkpoints.fingerprint import IDENTITY, check_fingerprint, target_fingerprint

FORMAT = "spot-set-model/1"
KEYS = ("format", "state_dict", "projections", "sha256", "config", "fingerprint", "threshold", "metrics")
FIX = "train one for this target (spot-eval collect --policy threshold --hidden-dims 64, then spot-eval train-sets)"


@dataclass(frozen=True)
class SetModelFile:
    """A loaded, verified set-model file (the model in eval mode, on the CPU)."""

    path: str
    model: SetModel
    hidden: Projection
    embedding: Projection
    fingerprint: dict
    threshold: float
    metrics: dict


def save_set_model(path: str | Path, model: SetModel, hidden: Projection, embedding: Projection, fingerprint: dict,
                   threshold: float, metrics: dict) -> None:
    """Write atomically (temp file + rename)."""
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    projections = {"hidden": hidden.to_dict(), "embedding": embedding.to_dict()}
    payload = {"format": FORMAT, "state_dict": state, "projections": projections, "sha256": projected_sha256(state, projections),
               "config": model.config.to_dict(), "fingerprint": dict(fingerprint), "threshold": float(threshold),
               "metrics": metrics}
    write_atomically(path, lambda tmp: torch.save(payload, tmp))


def load_set_model(path: str | Path) -> SetModelFile:
    """Load and verify; every way the file can be damaged or foreign is a ValueError naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"set model {path} does not exist; {FIX}")

    def corrupt(why: str) -> ValueError:
        return ValueError(f"set model {path} is corrupt or not a set model ({why}); {FIX}")

    raw = read_payload(path, FORMAT, KEYS, corrupt)
    try:
        if projected_sha256(raw["state_dict"], raw["projections"]) != raw["sha256"]:
            raise corrupt("the weights or projections do not match their recorded sha256")
        model = SetModel(SetModelConfig(**raw["config"]))
        model.load_state_dict(raw["state_dict"], strict=True)
        hidden, embedding = (Projection.from_dict(raw["projections"][k]) for k in ("hidden", "embedding"))
    except (TypeError, RuntimeError, KeyError, AttributeError) as err:
        raise corrupt(f"{type(err).__name__}: {str(err)[:300]}") from None
    if [k for k in IDENTITY if k not in raw["fingerprint"]]:
        raise corrupt("the target fingerprint is incomplete")
    return SetModelFile(str(path), model.eval(), hidden, embedding, raw["fingerprint"], float(raw["threshold"]), raw["metrics"])


def set_model_for_target(target, policy: str, threshold: float, path: str | Path) -> LearnedSets:
    """The set model of `path` as SetsDrafter's predictor, checked to belong to this target, block length and
    policy, and to have been trained at this threshold; on the target's device."""
    loaded = load_set_model(path)
    check_fingerprint(loaded.fingerprint, target_fingerprint(target, policy), what=f"set model {path} was trained", fix=FIX)
    if loaded.threshold != threshold:
        raise ValueError(f"set model {path} was trained at threshold {loaded.threshold}, but decoding uses {threshold}; {FIX}")
    embeddings = target.embeddings().detach()
    model = loaded.model.to(target.device)
    return LearnedSets(model, loaded.hidden, loaded.embedding(embeddings))
