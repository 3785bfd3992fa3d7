"""Block-causal targets with an exact prefix cache: SDAR (transformers' Qwen3 / Qwen3-MoE with SDAR's
numerics, spot.targets.sdar) and LLaDA2.0 (spot.targets.llada2), selected by config.json's
model_type (spot.targets.checkpoint). Attention is block-causal from position 0, so the KV of a
completed block never changes. The attention pattern reaches the model only as an explicit 4D
boolean mask argument (True = may attend):

    rows of the pending prefix  -> the cache, and pending columns of the same or an earlier block
    rows of piece r             -> the cache, the whole pending prefix, and piece r itself

"Pending" holds completed blocks (the prompt's complete blocks, then each finished block) whose
KV has not been computed yet: appending them rides along with the next verify forward instead of
costing a forward of its own. The KV of the pieces is never kept: after each forward the cache is
cropped back to the completed blocks.

With `exact=True` the same rows go through the model, but attention follows `PieceLayout`
(spot.targets.attention): each piece attends to exactly what it may see, in a batch of its own, so
its logits equal those of a one-piece forward of its state bit for bit, in any dtype. Without it,
the masked-out pieces still take part in the attention kernel's reductions, and a state's logits
move by rounding with the piece count (bench/verify_exactness.py).

Several requests in one forward (`verify_batch`) always take the per-piece layout: each request's rows
attend to its own cache. Exact, a request's logits are then those of its forward alone bit for bit; in the
packed layout they are not even alone, and the linear layers' rounding may also move with the rows beside
them (docs/guides/batching.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts, Qwen3MoeTopKRouter

from spot.targets.attention import PIECES, PieceLayout
from spot.targets.base import Call, ModelTarget, Verified
from spot.targets.checkpoint import Checkpoint, load
from spot.targets.memory import SAFE_FRACTION, free_bytes, layer_row_bytes
from spot.targets.placement import Placement, patch_forward
from spot.targets.rows import row_invariant_linears
from spot.targets.sdar import row_invariant_experts, row_invariant_router, use_sdar_norms


@dataclass
class PrefixCache:
    """One request's stream: the KV of its completed blocks (`cache`) and the completed blocks whose KV the
    next forward computes beside its pieces (`pending`, [Lp])."""

    cache: DynamicCache
    pending: torch.Tensor

    def commit(self, block: torch.Tensor) -> None:
        self.pending = torch.cat([self.pending, block.to(self.pending.device, torch.long)])


@dataclass(frozen=True)
class _Rows:
    """One call's rows of a forward: ids and positions [Lp + P*K + C*2K], and how they split."""

    ids: torch.Tensor
    positions: torch.Tensor
    cached: int
    pending: int
    pieces: int
    ahead: int


class BlockCausalTarget(ModelTarget):
    """A block-diffusion target over a transformers-style causal LM (see the module docstring)."""

    def __init__(
        self,
        model: PreTrainedModel,
        mask_id: int,
        eos_ids: frozenset[int],
        block_length: int,
        tokenizer: PreTrainedTokenizerBase | None = None,
        name: str = "",
        exact: bool = False,
    ) -> None:
        self.exact = exact
        model.set_attn_implementation(PIECES)  # transformers' SDPA when given a mask (the packed layout)
        if exact:
            row_invariant_linears(model)
            for module in model.modules():
                if isinstance(module, Qwen3MoeExperts):
                    patch_forward(module, row_invariant_experts)
                elif isinstance(module, Qwen3MoeTopKRouter):
                    patch_forward(module, row_invariant_router)
        use_sdar_norms(model)
        super().__init__(model, mask_id, eos_ids, block_length, tokenizer, name)
        self.cross_block = True  # a completed block's KV never changes, so the next block can ride behind it

    @classmethod
    def from_pretrained(
        cls,
        checkpoint: str | Path | Checkpoint,
        block_length: int | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        attn_implementation: str = "sdpa",
        trust_remote_code: bool = False,
        exact: bool = False,
        placement: Placement | None = None,
    ) -> BlockCausalTarget:
        """Load a local SDAR-style checkpoint directory (weights, tokenizer, ids, block size), or one already parsed.

        exact: verify in the per-piece layout (the class docstring), whatever `attn_implementation` says.
        placement: spreads the weights (spot.targets.placement) in place of `device`."""
        parts = load(checkpoint, "block_causal", cls.__name__, block_length, device, dtype, trust_remote_code, placement,
                     attn_implementation=attn_implementation)
        info = parts.checkpoint.info
        return cls(parts.model, info.mask_id, info.eos_ids, parts.block_length, parts.tokenizer, info.path, exact)

    # -- the Target protocol ----------------------------------------------------------------------

    def open(self, prefix: torch.Tensor, positions: int | None = None) -> PrefixCache:
        if prefix.numel() % self.block_length:
            raise ValueError(f"prefix length {prefix.numel()} is not a multiple of the block length {self.block_length}")
        return PrefixCache(DynamicCache(config=self.model.config), prefix.to(self.device, torch.long))

    @torch.inference_mode()
    def verify_batch(self, calls: Sequence[Call]) -> list[Verified]:
        rows = [self._rows(call) for call in calls]
        if len(calls) == 1 and not self.exact:
            outputs = [self._packed(calls[0].stream, rows[0])]
        else:
            outputs = self._per_piece(calls, rows)
        for call, r in zip(calls, rows, strict=True):  # keep the completed blocks only
            call.stream.cache.crop(-(r.pieces + 2 * r.ahead) * self.block_length)
            call.stream.pending = call.stream.pending[:0]
        return self._counted(outputs)

    def _rows(self, call: Call) -> _Rows:
        stream, k = call.stream, self.block_length
        n_pieces = call.pieces.shape[0]  # pieces: [P, K]
        n_ahead = 0 if call.ahead is None else call.ahead.shape[0]  # ahead: [C, 2K]
        cached, n_pending, start = stream.cache.get_seq_length(), stream.pending.numel(), call.start
        if cached + n_pending != start:
            raise RuntimeError(f"active block starts at {start} but the cache and pending blocks end at {cached + n_pending}")
        end = start + (2 if n_ahead else 1) * k
        if end > self.max_positions:
            raise ValueError(f"block ending at position {end} exceeds the model's {self.max_positions} positions")
        ids = [stream.pending, call.pieces.to(self.device).reshape(-1)]
        positions = [torch.arange(cached, start, device=self.device), torch.arange(start, start + k, device=self.device).repeat(n_pieces)]
        if n_ahead:
            ids.append(call.ahead.to(self.device).reshape(-1))
            positions.append(torch.arange(start, start + 2 * k, device=self.device).repeat(n_ahead))
        return _Rows(torch.cat(ids), torch.cat(positions), cached, n_pending, n_pieces, n_ahead)

    def _packed(self, stream: PrefixCache, rows: _Rows) -> tuple[torch.Tensor, torch.Tensor]:
        """One request in one sequence under a 4D mask, its cache the model's (the module docstring)."""
        mask = self._mask(rows.cached, rows.pending, rows.pieces, rows.ahead)  # [1, 1, L, cached + L]
        hidden = self.model.model(
            input_ids=rows.ids[None], position_ids=rows.positions[None], cache=stream.cache, use_cache=True, attention_mask=mask,
        ).last_hidden_state[0, rows.pending :]  # [P*K + C*2K, d]
        return self._outputs(hidden, rows)

    def _per_piece(self, calls: Sequence[Call], rows: list[_Rows]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every request's rows one after another, each attending to its own cache (spot.targets.attention)."""
        layouts, offset = [], 0
        for call, r in zip(calls, rows, strict=True):
            mask = self._pending_mask(r.cached, r.pending)
            layouts.append(PieceLayout(offset, r.cached, r.pending, r.pieces, self.block_length, mask, call.stream.cache, r.ahead))
            offset += r.ids.numel()
        hidden = self.model.model(
            input_ids=torch.cat([r.ids for r in rows])[None], position_ids=torch.cat([r.positions for r in rows])[None],
            use_cache=False, attention_mask=None, piece_layout=tuple(layouts),
        ).last_hidden_state[0]  # [sum of the calls' rows, d]
        return [self._outputs(hidden[layout.offset + r.pending : layout.offset + layout.rows], r) for layout, r in zip(layouts, rows, strict=True)]

    def _outputs(self, hidden: torch.Tensor, rows: _Rows) -> tuple[torch.Tensor, torch.Tensor]:
        """A call's piece and cross rows' hidden states [P*K + C*2K, d] -> (logits [P + C, K, V], hidden [P + C, K, d]):
        the pieces' rows, then each cross piece's next-block rows (its finished block's rows give no logits)."""
        k, d = self.block_length, hidden.shape[-1]
        own = hidden[: rows.pieces * k].view(rows.pieces, k, d)
        following = hidden[rows.pieces * k :].view(rows.ahead, 2, k, d)[:, 1]  # [C, K, d]
        hidden = torch.cat([own, following]) if rows.ahead else own  # [P + C, K, d]
        return self.model.lm_head(hidden), hidden

    def max_pieces(self, context: int) -> int:
        config = self.model.config
        element = next(self.model.parameters()).element_size()
        kv_per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * element
        per_position = (
            self.vocab_size * (element + 4)  # logits, and their float32 copy
            + layer_row_bytes(config, element, context + self.block_length)
            + kv_per_token  # the pieces' keys and values, cached until the crop
        )
        return int(SAFE_FRACTION * free_bytes(self.device) // (self.block_length * per_position))

    def _pending_mask(self, cached: int, n_pending: int) -> torch.Tensor | None:
        """[Lp, cached + Lp]: a pending row sees the cache and the pending rows of its own or an earlier block."""
        if n_pending == 0:
            return None
        block = torch.arange(cached, cached + n_pending, device=self.device) // self.block_length  # [Lp]
        cache_visible = torch.ones(n_pending, cached, dtype=torch.bool, device=self.device)
        return torch.cat([cache_visible, block[None, :] <= block[:, None]], dim=1)

    def _mask(self, cached: int, n_pending: int, n_pieces: int, n_ahead: int = 0) -> torch.Tensor:
        """[1, 1, L, cached + L] (L = Lp + P*K + C*2K), the packed layout: pending rows as `_pending_mask`;
        piece rows see the cache, the whole pending prefix and their own piece, never another piece; a cross
        piece's rows see the cache, the pending prefix and its own rows of the same or the earlier block."""
        k = self.block_length
        # each row's piece (cross pieces after the pieces) and block within it (0, or 1 for a next-block row)
        piece_id = torch.cat([torch.arange(n_pieces, device=self.device).repeat_interleave(k),
                              n_pieces + torch.arange(n_ahead, device=self.device).repeat_interleave(2 * k)])
        block = torch.cat([torch.zeros(n_pieces * k, dtype=torch.long, device=self.device),
                           torch.arange(2, device=self.device).repeat_interleave(k).repeat(n_ahead)])
        n = piece_id.numel()
        own = (piece_id[:, None] == piece_id[None, :]) & (block[None, :] <= block[:, None])
        piece_rows = torch.cat([torch.ones(n, cached + n_pending, dtype=torch.bool, device=self.device), own], dim=1)
        if n_pending == 0:
            return piece_rows[None, None]
        pending_rows = torch.cat(
            [self._pending_mask(cached, n_pending), torch.zeros(n_pending, n, dtype=torch.bool, device=self.device)], dim=1
        )  # [Lp, cached + L]
        return torch.cat([pending_rows, piece_rows])[None, None]
