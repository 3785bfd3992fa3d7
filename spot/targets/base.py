"""The target protocol: what a decoder needs from a block-diffusion model, nothing more.

A target holds a KV cache of what lies outside the active block: the completed blocks (exact for a
block-causal target, spot.targets.block_causal) or the whole canvas frozen at block start (a
bidirectional one, spot.targets.dual_cache). One `verify` forward scores P *pieces*: full copies of
the active block, each in a hypothetical state. Every piece attends to the cache and to itself
(bidirectionally), never to another piece, and carries the active block's absolute positions, so
piece r's logits are the target's logits at state r.
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

    def start(self, prefix: torch.Tensor, positions: int | None = None) -> None:
        """Forget any previous request; `prefix` [L] (L a multiple of K) is the cache to build.

        The prefix is the prompt's complete blocks. Implementations may fold its forward into
        the first `verify` call. positions: the request's canvas (prompt and generation in whole
        blocks), which a target attending past the active block needs.
        """

    def verify(self, pieces: torch.Tensor, start: int) -> torch.Tensor:
        """One forward over P pieces of the active block.

        Args:
            pieces: [P, K] int64 block states; row 0 the current state.
            start: absolute position of the active block's first token.
        Returns:
            [P, K, V] logits; row r is the target's output at state `pieces[r]`.
        """

    def commit(self, block: torch.Tensor) -> None:
        """Append a finished block [K] to the cache (may be folded into the next forward)."""

    def max_pieces(self, context: int) -> int:
        """The most pieces one `verify` can hold in the device memory free now, with `context`
        positions before the active block (an estimate on the safe side)."""
