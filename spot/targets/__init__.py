"""Target adapters: block-diffusion models behind the `Target` protocol."""

from __future__ import annotations

from pathlib import Path

import torch

from spot.targets.base import Target
from spot.targets.block_causal import BlockCausalTarget
from spot.targets.checkpoint import FAMILIES, CheckpointInfo, read_checkpoint
from spot.targets.dual_cache import DualCacheTarget


def from_pretrained(
    path: str | Path,
    block_length: int | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    exact: bool = False,
    cache: str | None = None,
) -> BlockCausalTarget | DualCacheTarget:
    """The target in a checkpoint directory, by its family's attention (config.json's model_type).

    exact: a block-causal target's per-piece verify layout (a bidirectional one always has it);
    cache: a bidirectional target's frozen-cache decoder (spot.targets.dual_cache; default dual)."""
    model_type = read_checkpoint(path)[1].model_type
    family = FAMILIES[model_type]
    if family.attention == "bidirectional":
        return DualCacheTarget.from_pretrained(path, block_length, device, dtype, cache or "dual")
    if cache is not None:
        raise ValueError(f"cache={cache!r} applies to bidirectional targets (llada, Dream); {path} holds a {model_type} "
                         "model, whose block-causal cache is exact: drop the cache option")
    return BlockCausalTarget.from_pretrained(path, block_length, device, dtype, exact=exact)


__all__ = ["BlockCausalTarget", "CheckpointInfo", "DualCacheTarget", "Target", "from_pretrained", "read_checkpoint"]
