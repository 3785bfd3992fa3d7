"""Target adapters: block-diffusion models behind the `Target` protocol."""

from spot.targets.base import Target
from spot.targets.block_causal import BlockCausalTarget
from spot.targets.checkpoint import CheckpointInfo, read_checkpoint

__all__ = ["CheckpointInfo", "BlockCausalTarget", "Target", "read_checkpoint"]
