"""Target adapters: block-diffusion models behind the `Target` protocol."""

from spot.targets.base import Target
from spot.targets.sdar import CheckpointInfo, SDARTarget, read_checkpoint

__all__ = ["CheckpointInfo", "SDARTarget", "Target", "read_checkpoint"]
