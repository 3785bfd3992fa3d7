"""spot: lossless speculative decoding for block-diffusion language models.

The library returns data and never prints, logs or writes files; I/O lives in `spot_eval`.
"""

from spot.config import DecodeConfig, Sampling
from spot.engine import BlockTrace, DecodeStats, Generation, Request, generate, generate_batch, generations
from spot.tree import DraftTree

__all__ = ["BlockTrace", "DecodeConfig", "DecodeStats", "DraftTree", "Generation", "Request", "Sampling", "generate", "generate_batch",
           "generations"]
