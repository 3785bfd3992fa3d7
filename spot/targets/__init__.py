"""Target adapters: block-diffusion models behind the `Target` protocol."""

from __future__ import annotations

from pathlib import Path

import torch

from spot.targets.base import Target
from spot.targets.block_causal import BlockCausalTarget
from spot.targets.checkpoint import Checkpoint, CheckpointInfo, parsed, read_checkpoint
from spot.targets.dual_cache import DualCacheTarget
from spot.targets.placement import Placement


def from_pretrained(
    checkpoint: str | Path | Checkpoint,
    block_length: int | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    exact: bool = False,
    cache: str | None = None,
    placement: Placement | None = None,
) -> BlockCausalTarget | DualCacheTarget:
    """The target in a checkpoint directory (or one already parsed: it is read once), by its family's attention
    (config.json's model_type).

    exact: a block-causal target's per-piece verify layout (a bidirectional one always has it);
    cache: a bidirectional target's frozen-cache decoder (spot.targets.dual_cache; default dual);
    placement: the weights spread over devices or offloaded (spot.targets.placement), in place of `device`."""
    checkpoint = parsed(checkpoint)
    if checkpoint.family.attention == "bidirectional":
        return DualCacheTarget.from_pretrained(checkpoint, block_length, device, dtype, cache or "dual", placement=placement)
    if cache is not None:
        raise ValueError(f"cache={cache!r} applies to bidirectional targets (llada, Dream); {checkpoint.path} holds a "
                         f"{checkpoint.info.model_type} model, whose block-causal cache is exact: drop the cache option")
    return BlockCausalTarget.from_pretrained(checkpoint, block_length, device, dtype, exact=exact, placement=placement)


__all__ = ["BlockCausalTarget", "Checkpoint", "CheckpointInfo", "DualCacheTarget", "Placement", "Target", "from_pretrained",
           "read_checkpoint"]
