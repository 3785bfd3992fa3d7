"""spot-eval's sandboxed `code_eval` (spot_eval/execution/code_eval) installed where `evaluate.load("code_eval")`
finds it with the hub offline: evaluate's module cache, `HF_MODULES_CACHE/evaluate_modules/metrics/
evaluate-metric--code_eval/<sha256 of the file>/code_eval.py`. With several copies there evaluate takes the
most recently written, so installing makes ours the one lm-eval's `mbpp` and `humaneval` load."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "code_eval" / "code_eval.py"
NAME = "evaluate-metric--code_eval"


def install_code_eval(modules_cache: Path | None = None) -> tuple[Path, list[Path]]:
    """Write the shim; returns (its file, the other copies found beside it, which it now outranks)."""
    import evaluate

    root = Path(modules_cache or evaluate.config.HF_MODULES_CACHE) / "evaluate_modules"
    text = SOURCE.read_bytes()
    folder = root / "metrics" / NAME / hashlib.sha256(text).hexdigest()
    folder.mkdir(parents=True, exist_ok=True)
    for package in (root, root / "metrics", root / "metrics" / NAME, folder):
        (package / "__init__.py").touch()
    target = folder / "code_eval.py"
    target.write_bytes(text)
    os.utime(target)  # the newest copy is the one evaluate loads
    others = [p for p in (root / "metrics" / NAME).iterdir() if p.is_dir() and p != folder and len(p.name) == 64]
    return target, others
