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

# Drafter method -> {policy: file name}, {k} the block length; one file per method, policy and block length, trained
# for the embedded target. SPOT and Spiffy ship for the single policy and for the threshold policy (τ = 0.9); SPOT-Sets,
# whose drafts are sets, for the threshold policy only. Its default is the learned set model (sets_b32.pt); the stale set
# predictor (sets_b32.json) ships beside it for `sets@8:PATH`.
_SPOT = {"single": "spot_b{k}.pt", "threshold": "spot_threshold_b{k}.pt"}
_SETS = {"threshold": "sets_b{k}.pt"}
_SPIFFY = {"single": "spiffy_b{k}.json", "threshold": "spiffy_threshold_b{k}.json"}  # Spiffy v1 and v4 verify one graph
_SPOT_R = {"single": "spot_r_b{k}.pt"}  # the refresh head with SPOT's order model inside
_SETS_R = {"threshold": "spot_r_b{k}.pt"}  # the same file: SPOT-RS reads its head and the rule fitted into it
_DRAFTER_FILES = {"spot": _SPOT, "spot_gamma": _SPOT, "hybrid": _SPOT, "spot_r": _SPOT_R, "spot_rc": _SPOT_R, "spiffy": _SPIFFY, "spiffy_v1": _SPIFFY,
                  "sets": _SETS, "sets_max": _SETS, "sets_r": _SETS_R}


def shipped_drafter(method: str, block_length: int, policy: str = "single") -> Path | None:
    """The shipped drafter file of `method` for `block_length` under `policy` (it may not exist: see `exists()`),
    None when the method ships no file for that policy.

    SPOT, SPOT-gamma and the hybrid share one checkpoint (SPOT-gamma reads the fitted gamma stored in it); SPOT-Sets and its
    max-commit variant one set model."""
    if method not in _DRAFTER_FILES:
        raise ValueError(f"no drafter ships for method {method!r}; shipped methods: {', '.join(_DRAFTER_FILES)}")
    name = _DRAFTER_FILES[method].get(policy)
    return None if name is None else DRAFTERS / name.format(k=block_length)


def shipped_policies(method: str) -> tuple[str, ...]:
    """The policies `method` ships drafters for."""
    return tuple(_DRAFTER_FILES[method])
