"""spot: lossless speculative decoding for block-diffusion language models.

The library returns data and never prints, logs or writes files; I/O lives in `spot_eval`.

The names below load on first use (PEP 562): `spot.config` is read without torch by front doors that only
parse settings (the `spot-eval` command line answers --help and refuses bad flags before torch loads).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_HOMES = {
    "DecodeConfig": "spot.config", "Sampling": "spot.config", "DraftTree": "spot.tree",
    **dict.fromkeys(("BlockTrace", "DecodeStats", "Generation", "Request", "generate", "generate_batch", "generations"),
                    "spot.engine"),
}
__all__ = ["BlockTrace", "DecodeConfig", "DecodeStats", "DraftTree", "Generation", "Request", "Sampling", "generate", "generate_batch",
           "generations"]

if TYPE_CHECKING:
    from spot.config import DecodeConfig, Sampling
    from spot.engine import (
        BlockTrace,
        DecodeStats,
        Generation,
        Request,
        generate,
        generate_batch,
        generations,
    )
    from spot.tree import DraftTree


def __getattr__(name: str) -> object:
    if name not in _HOMES:
        raise AttributeError(f"module 'spot' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
