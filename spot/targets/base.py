"""The target protocol: what a decoder needs from a block-diffusion model, nothing more.

A target holds an exact prefix KV cache of completed blocks. One `verify` forward scores P
*pieces*: full copies of the active block, each in a hypothetical state. Every piece attends to
the cache and to itself (bidirectionally), never to another piece, and carries the active block's
absolute positions, so piece r's logits are the target's logits at state r.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class Target(Protocol):
    mask_id: int
    eos_ids: frozenset[int]
    block_length: int  # K
    vocab_size: int  # V
    max_positions: int
    device: torch.device
    forwards: int  # model calls so far (prefill, verify and block commits alike)

    def start(self, prefix: torch.Tensor) -> None:
        """Forget any previous request; `prefix` [L] (L a multiple of K) is the cache to build.

        The prefix is the prompt's complete blocks. Implementations may fold its forward into
        the first `verify` call.
        """

    def verify(self, pieces: torch.Tensor, start: int) -> torch.Tensor:
        """One forward over P pieces of the active block.

        Args:
            pieces: [P, K] int64 block states.
            start: absolute position of the active block's first token.
        Returns:
            [P, K, V] logits; row r is the target's output at state `pieces[r]`.
        """

    def commit(self, block: torch.Tensor) -> None:
        """Append a finished block [K] to the cache (may be folded into the next forward)."""

    def max_pieces(self, context: int) -> int:
        """The most pieces one `verify` can hold in the device memory free now, with `context`
        positions before the active block (an estimate on the safe side)."""
