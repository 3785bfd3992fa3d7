"""The target protocol: what a decoder needs from a block-diffusion model, nothing more.

A target holds a KV cache of what lies outside the active block: the completed blocks (exact for a
block-causal target, spot.targets.block_causal) or the whole canvas frozen at block start (a
bidirectional one, spot.targets.dual_cache). One `verify` forward scores P *pieces*: full copies of
the active block, each in a hypothetical state. Every piece attends to the cache and to itself
(bidirectionally), never to another piece, and carries the active block's absolute positions, so
piece r's logits are the target's logits at state r.

A target serves many requests at once: each request's cache is a *stream* (`Target.open`), and one
`verify_batch` forward scores the pieces of several streams, each against its own cache. A stream's rows
attend to its own cache and rows only, so a request's logits do not depend on which others share the
forward (bit for bit in the exact layout: spot.targets.attention). `start`, `verify` and `commit` are the
one-request view over the target's own stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from transformers import PreTrainedTokenizerBase

from spot.policy import BLOCK, Span
from spot.targets.placement import execution_device, weight_of


class Stream(Protocol):
    """One request's cache in a target (`Target.open`)."""

    def commit(self, block: torch.Tensor) -> None:
        """Append a finished block [K] to the cache (may be folded into the next forward)."""


@dataclass(frozen=True)
class Call:
    """One request's share of a `verify_batch` forward (`Target.verify`'s arguments, with its stream)."""

    stream: Stream
    pieces: torch.Tensor  # [P, K] int64 block states; row 0 the current state
    start: int  # absolute position of the active block's first token
    ahead: torch.Tensor | None = None  # [C, 2K] cross pieces (with `cross_block`)


@dataclass(frozen=True)
class Verified:
    """One call's outputs: logits [P + C, K, V] float32 and the LM-head inputs behind them, hidden [P + C, K, d]."""

    logits: torch.Tensor
    hidden: torch.Tensor


@runtime_checkable
class Target(Protocol):
    mask_id: int
    eos_ids: frozenset[int]
    block_length: int  # K
    vocab_size: int  # V
    max_positions: int
    device: torch.device
    logits_dtype: torch.dtype  # what the model computes its logits in (Verified holds them as float32, exactly)
    forwards: int  # model calls so far (prefill, verify and block commits alike)
    hidden: torch.Tensor | None  # [P, K, d] the last verify's LM-head inputs per piece and position (no extra forward)
    cross_block: bool  # whether `verify` takes cross pieces (`ahead`)
    # Where the first generated block starts: at the prompt's end (LLaDA's and Dream's reference generators,
    # whose blocks tile the generation only), else on the grid of whole blocks from position 0 (SDAR and
    # LLaDA2.0, trained block-causally on that grid), the prompt's last partial block decoded with the first
    # generated tokens.
    blocks_at_prompt_end: bool

    def open(self, prefix: torch.Tensor, positions: int | None = None) -> Stream:
        """A new request's stream; `prefix` [L] is the cache to build.

        The prefix is the prompt's complete blocks (L a multiple of K), or the whole prompt with
        `blocks_at_prompt_end`. Implementations may fold its forward into
        the first verify. positions: the request's canvas (prompt and generation in whole
        blocks), which a target attending past the active block needs.
        """

    def verify_batch(self, calls: Sequence[Call]) -> list[Verified]:
        """One forward (counted once) over every call's pieces, each call's against its own stream; a call's
        outputs are those `verify` gives for it alone (bit for bit in the exact layout)."""

    def start(self, prefix: torch.Tensor, positions: int | None = None) -> None:
        """Forget any previous request and open the target's own stream (`open`), which `verify` and `commit` use."""

    def verify(self, pieces: torch.Tensor, start: int, ahead: torch.Tensor | None = None) -> torch.Tensor:
        """One forward over P pieces of the active block, and C cross pieces (with `cross_block`).

        Args:
            pieces: [P, K] int64 block states; row 0 the current state.
            start: absolute position of the active block's first token.
            ahead: [C, 2K] cross pieces, each [a finished active block | a state of the next block]: the
                finished block's rows see what a piece sees, the next block's rows that and the finished block.
        Returns:
            [P + C, K, V] logits; row r < P is the target's output at state `pieces[r]`, row P + c the next
            block's at the state of cross piece c, as the next block's own verify would give them once the
            finished block is committed. `hidden` holds the same rows.
        """

    def commit(self, block: torch.Tensor) -> None:
        """Append a finished block [K] to the cache of the target's own stream (may be folded into the next forward)."""

    def embeddings(self) -> torch.Tensor:
        """[V, d] the token-embedding matrix (what a drafter may project the tokens it reads on)."""

    def max_pieces(self, context: int) -> int:
        """The most pieces one `verify` can hold in the device memory free now, with `context`
        positions before the active block (an estimate on the safe side)."""

    def ranked_span(self, start: int, positions: int, step: int) -> Span:
        """Where the block starting at `start` lies in the row this family's reference generator ranks at step
        `step` of the block (DecodeConfig.tie_break "topk"), on a canvas of `positions`."""


@runtime_checkable
class LoadedTarget(Target, Protocol):
    """A target loaded from a checkpoint directory (spot.targets.from_pretrained; block-causal or frozen-cache alike):
    the protocol, and what the harness reads beside it."""

    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase | None
    name: str  # the checkpoint directory it was loaded from ("" for a model built in memory)
    exact: bool  # whether a verify's pieces score bit for bit as one-piece forwards
    cache: str | None  # a frozen-cache target's decoder (spot.targets.dual_cache.CACHES); None for an exact prefix cache


class ModelTarget:
    """What the targets over a transformers model share: the protocol's attributes, counting forwards,
    the embeddings."""

    def __init__(self, model, mask_id: int, eos_ids: frozenset[int], block_length: int, tokenizer=None, name: str = "") -> None:
        if block_length < 1:
            raise ValueError(f"block_length must be >= 1, got {block_length}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.mask_id = mask_id
        self.eos_ids = frozenset(eos_ids)
        self.block_length = block_length
        self.vocab_size = int(model.config.vocab_size)
        self.max_positions = int(model.config.max_position_embeddings)
        self.device = execution_device(model)
        head = model.get_output_embeddings()  # the logits come out in the LM head's dtype
        self.logits_dtype = (head.weight if head is not None else next(model.parameters())).dtype
        self.forwards = 0
        self.hidden: torch.Tensor | None = None
        self.cross_block = False
        self.blocks_at_prompt_end = False
        self.cache: str | None = None
        self._stream: Stream | None = None

    def embeddings(self) -> torch.Tensor:
        return weight_of(self.model.get_input_embeddings())

    def ranked_span(self, start: int, positions: int, step: int) -> Span:
        """The block alone: SDAR's and LLaDA2.0's generators rank the block's confidences."""
        return BLOCK

    # -- the one-request view: the target's own stream --------------------------------------------

    def start(self, prefix: torch.Tensor, positions: int | None = None) -> None:
        self._stream = self.open(prefix, positions)

    def verify(self, pieces: torch.Tensor, start: int, ahead: torch.Tensor | None = None) -> torch.Tensor:
        if self._stream is None:
            raise RuntimeError("verify before start: start(prefix) opens the request")
        out = self.verify_batch([Call(self._stream, pieces, start, ahead)])[0]
        self.hidden = out.hidden
        return out.logits

    def commit(self, block: torch.Tensor) -> None:
        if self._stream is None:
            raise RuntimeError("commit before start: start(prefix) opens the request")
        self._stream.commit(block)

    def _counted(self, outputs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[Verified]:
        """A forward's (logits, hidden) per call as `Verified` (logits in float32), the forward counted and, on CUDA,
        finished (so that callers time the forward, not its launch)."""
        self.forwards += 1
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return [Verified(logits.float(), hidden) for logits, hidden in outputs]
