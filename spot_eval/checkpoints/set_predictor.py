"""SPOT-Sets' stale set predictor as a file: small JSON, checked against its target and threshold on load.

    {"format": "spot-sets-stale/1", "fingerprint": target_fingerprint(...), "threshold": 0.9,
     "predictor": StaleSets.to_dict(), "fit": {...per-depth likelihood and exact-set rates...}}
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from spot.drafters.sets import StaleSets
from spot_eval.checkpoints.atomic_file import write_atomically
from spot_eval.checkpoints.fingerprint import check_fingerprint, target_fingerprint

FORMAT = "spot-sets-stale/1"


@dataclass(frozen=True)
class SetPredictorFile:
    path: str
    fingerprint: dict
    threshold: float
    predictor: StaleSets
    fit: dict


def write_set_predictor(path: str | Path, fingerprint: dict, threshold: float, predictor: StaleSets, fit: dict) -> None:
    """Write atomically (temp file + rename)."""
    raw = {"format": FORMAT, "fingerprint": fingerprint, "threshold": threshold, "predictor": predictor.to_dict(), "fit": fit}
    write_atomically(path, lambda tmp: tmp.write_text(json.dumps(raw, indent=1) + "\n"))


def load_set_predictor(path: str | Path) -> SetPredictorFile:
    """Raises ValueError naming the file when it is not a set predictor or is damaged."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
        if raw.get("format") != FORMAT:
            raise ValueError(f"format {raw.get('format')!r}, expected {FORMAT!r}")
        return SetPredictorFile(str(path), raw["fingerprint"], float(raw["threshold"]), StaleSets.from_dict(raw["predictor"]),
                                raw.get("fit", {}))
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is not a valid set predictor ({err}); fit one with spot-eval fit-sets") from None


def set_predictor_for_target(model, policy: str, threshold: float, path: str | Path) -> StaleSets:
    """The predictor of `path`, checked to belong to this target, block length and policy, and to have been
    fitted at this threshold."""
    loaded = load_set_predictor(path)
    fix = "fit one for this target (spot-eval collect --policy threshold --threshold TAU, then spot-eval fit-sets)"
    check_fingerprint(loaded.fingerprint, target_fingerprint(model, policy), what=f"set predictor {path} was fitted", fix=fix)
    if loaded.threshold != threshold:
        raise ValueError(f"set predictor {path} was fitted at threshold {loaded.threshold}, but decoding uses {threshold}; {fix}")
    return loaded.predictor
