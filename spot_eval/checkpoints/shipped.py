"""What this project ships, and which file serves which target and block length.

The files live under `spot_eval/assets/` (package data): the embedded target (`assets/target/`,
a small SDAR-architecture model this project trained) and the drafters trained for it
(`assets/drafters/`). This module is the one place that maps a request for "the shipped drafter"
to a path; the loaders beside it check that the file really belongs to the target at hand.
"""

from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).resolve().parent.parent / "assets"
EMBEDDED_TARGET = ASSETS / "target"  # the small SDAR-architecture target this project trains and ships
DRAFTERS = ASSETS / "drafters"

# Drafter method -> (file stem, suffix); one file per block length, trained for the embedded target.
# SPOT-Sets' default is the learned set model (sets_b32.pt); the stale set predictor (sets_b32.json) ships beside
# it for `sets@8:PATH`.
_DRAFTER_FILES = {"spot": ("spot", "pt"), "spot_gamma": ("spot", "pt"), "spiffy": ("spiffy", "json"), "sets": ("sets", "pt"),
                  "sets_max": ("sets", "pt")}


def shipped_drafter(method: str, block_length: int) -> Path:
    """The shipped drafter file of `method` for `block_length` (it may not exist: see `exists()`).

    SPOT and SPOT-gamma share one checkpoint (SPOT-gamma reads the fitted gamma stored in it); SPOT-Sets and its
    max-commit variant one set model."""
    if method not in _DRAFTER_FILES:
        raise ValueError(f"no drafter ships for method {method!r}; shipped methods: {', '.join(_DRAFTER_FILES)}")
    stem, suffix = _DRAFTER_FILES[method]
    return DRAFTERS / f"{stem}_b{block_length}.{suffix}"
