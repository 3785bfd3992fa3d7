"""The fingerprint that ties trajectories, drafters and Spiffy graphs to the target they came from.

It identifies what a drafter was trained on: the target's weights and tokenizer, the block length
and the commit policy. Trajectory manifests, drafter checkpoints and Spiffy graphs carry the same
dict, so collect, train-drafter, spiffy-calibrate and the loaders all compare one thing.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from spot.targets.base import LoadedTarget

# What must agree between a drafter and the target it drafts for; "model" (the directory name) is
# informational, so a copied or renamed target directory still matches.
IDENTITY = ("tokenizer_sha256", "weights_digest", "block_length", "policy")
# Compared where either side has it: a bidirectional target's frozen-cache decoder (its trajectories differ per cache).
OPTIONAL_IDENTITY = ("cache",)
_DIGEST_SPAN = 1 << 20  # bytes hashed at each end of a weight file
TRAIN_DRAFTER = "train a drafter for this target and block length (spot-eval collect, then spot-eval train-drafter)"


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def weights_digest(directory: Path) -> str:
    """sha256 over each weight file's name, size, first and last MiB.

    Hashing whole files would cost a minute for an 8B target at every load; the ends hold the
    safetensors header and the first and last tensors' values, which any retraining changes.
    """
    files = sorted(p for p in directory.iterdir() if p.suffix in (".safetensors", ".bin"))
    if not files:
        raise ValueError(f"{directory} holds no *.safetensors or *.bin weights to fingerprint")
    digest = hashlib.sha256()
    for path in files:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(_DIGEST_SPAN)
            f.seek(max(size - _DIGEST_SPAN, 0))
            tail = f.read(_DIGEST_SPAN)
        digest.update(f"{path.name}:{size}:".encode() + head + tail)
    return digest.hexdigest()


def target_fingerprint(target: LoadedTarget, policy: str) -> dict:
    """The identity of (target, block length, commit policy) that trajectories and drafters carry."""
    directory = Path(target.name)
    tokenizer = directory / "tokenizer.json"
    if not target.name or not tokenizer.is_file():
        raise ValueError(
            f"cannot fingerprint target {target.name!r}: load it from a model directory with a tokenizer.json "
            "(spot.targets.from_pretrained)"
        )
    return {
        "model": directory.resolve().name,
        "tokenizer_sha256": _sha256_file(tokenizer),
        "weights_digest": weights_digest(directory),
        "block_length": target.block_length,
        "policy": policy,
    } | ({"cache": target.cache} if target.cache is not None else {})


def fingerprint_mismatch(recorded: dict, actual: dict) -> list[str]:
    """The identity fields on which two fingerprints differ, as 'field: recorded vs actual'."""
    return [f"{k}: {recorded.get(k)!r} vs {actual.get(k)!r}" for k in IDENTITY + OPTIONAL_IDENTITY if recorded.get(k) != actual.get(k)]


def check_fingerprint(
    recorded: dict, actual: dict, what: str = "this drafter was trained", fix: str = TRAIN_DRAFTER
) -> None:
    """Raise ValueError naming both fingerprints when a file was made for another target."""
    differences = fingerprint_mismatch(recorded, actual)
    if differences:
        raise ValueError(
            f"{what} for target {json.dumps(recorded)} but is used with target {json.dumps(actual)} "
            f"(differs in {'; '.join(differences)}); {fix}"
        )
