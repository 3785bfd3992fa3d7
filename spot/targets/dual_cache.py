"""Bidirectional targets (LLaDA, Dream) decoded block by block with a frozen KV cache: the dual-cache decoder.

LLaDA and Dream attend over the whole canvas, prompt and generation alike, so a committed token
changes every position's KV and no cache is exact. Fast-dLLM's caches [SRC: NVlabs/Fast-dLLM] make
them fast by freezing KV for a whole block; here that approximation is *the decoder's definition*,
and speculation is exact relative to it:

    block start   one full forward over the canvas [committed blocks | block state | masks to the
                  end]; it decides the block's first step, and the KV of every canvas position
                  outside the live rows is kept, frozen, for the rest of the block.
    later steps   only the live rows are fed; they attend to [frozen KV | themselves].

`cache` says which rows are live in the later steps: "dual" (Fast-dLLM's dual cache: the block's K
positions; the default), "prefix" (its prefix cache: the block and the masked suffix), "none" (the
whole canvas: the uncached decoder, every step a full forward), "nosuffix" (the suffix skipped: the
canvas of each block ends with it, so the block-start forward covers [committed blocks | block] and
later steps recompute the block against the frozen prefix; no position ever sees a mask beyond its
block [INF: our reading of the paper's "suffix skip"]). A verify piece is one hypothetical
block state in the live rows; it attends to the frozen KV and to its own rows only, never to another
piece, in a batch of its own (as spot.targets.attention's exact layout), so its logits equal those
of a later forward that has its state as the current one, bit for bit.

With `shift` (Dream) position i's logits come from the hidden state at i - 1 (position 0's from its
own). The block's first position then reads a row before the block; where that row is frozen, its
final hidden state is frozen with the KV at block start [INF: Fast-dLLM instead commits the block's
first token from the block-start forward, which our policies need not do].

Blocks start at the prompt's end, as in LLaDA's generate.py and Fast-dLLM's generators [CODE]: the
canvas is [prompt | generation in whole blocks] (`blocks_at_prompt_end`; False puts them on the grid
from position 0, as for the block-causal targets).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel, PreTrainedTokenizerBase
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from spot.config import CACHES
from spot.policy import Span
from spot.targets.base import Call, ModelTarget, Verified
from spot.targets.checkpoint import Checkpoint, load
from spot.targets.memory import SAFE_FRACTION, free_bytes, layer_row_bytes
from spot.targets.placement import Placement
from spot.targets.rows import row_invariant_linears

FROZEN = "spot_frozen_canvas"
# The order of a live row's keys: "position" ([prefix | live rows | suffix], the reference's) or "frozen_first"
# ([frozen | live rows], this project's order before 2026-12-03; bench/key_order.py compares the two).
KEY_ORDERS = ("position", "frozen_first")


@dataclass
class FrozenLayout:
    """One request's rows of a forward, from row `offset` on: `canvas` rows of the full canvas (at block start,
    else 0), then `pieces` x `live` rows. frozen: [F] the canvas positions whose KV is frozen; kv: layer -> the
    frozen keys and values [1, Hkv, F, hd], filled by the block-start forward and read by every later one."""

    canvas: int
    pieces: int
    live: int
    frozen: torch.Tensor
    split: int  # where a piece's own keys go among the frozen ones: position order puts them after those before them
    kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    offset: int = 0

    @property
    def rows(self) -> int:
        return self.canvas + self.pieces * self.live


@dataclass
class FrozenCanvas:
    """One request's stream: the committed canvas (`tokens`, [start]) of a `length`-position canvas, the active
    block's frozen KV (`layout`, from its block-start forward on) and, with `shift`, the frozen final hidden
    state before the block (`before`, [d])."""

    tokens: torch.Tensor
    length: int
    layout: FrozenLayout | None = None
    before: torch.Tensor | None = None

    def commit(self, block: torch.Tensor) -> None:
        self.tokens = torch.cat([self.tokens, block.to(self.tokens.device, torch.long)])
        self.layout, self.before = None, None


def frozen_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    frozen_layout: tuple[FrozenLayout, ...] | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: query [1, H, R, hd], key/value [1, Hkv, R, hd] -> ([1, R, H, hd],
    None). Each request's rows (a FrozenLayout each, in row order) attend within the request only: canvas rows
    to its whole canvas; the rows of piece r to the frozen KV with piece r's own at `split` (in position order:
    [prefix | piece r | suffix], as Fast-dLLM's dual cache overwrites the block's slots, so that a
    reduced-precision sum over keys runs in the reference's order)."""
    if frozen_layout is None:  # a plain forward: transformers' SDPA on the mask given
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    outs = []
    for layout in frozen_layout:
        rows = slice(layout.offset, layout.offset + layout.rows)
        outs.append(_request_attention(module, query[:, :, rows], key[:, :, rows], value[:, :, rows], layout, scaling))
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


def _request_attention(module, query, key, value, layout: FrozenLayout, scaling: float | None) -> torch.Tensor:
    """One request's rows: query [1, H, R, hd], key/value [1, Hkv, R, hd] -> [1, H, R, hd]."""
    heads, dim = query.shape[1], query.shape[-1]
    kv_heads, groups = key.shape[1], heads // key.shape[1]
    c, p, n = layout.canvas, layout.pieces, layout.live
    outs = []
    if c:
        outs.append(F.scaled_dot_product_attention(
            query[:, :, :c], key[:, :, :c].repeat_interleave(groups, 1), value[:, :, :c].repeat_interleave(groups, 1), scale=scaling
        ))  # [1, H, C, hd]
        layout.kv[module.layer_idx] = (key[:, :, layout.frozen], value[:, :, layout.frozen])  # [1, Hkv, F, hd]
    if p:
        frozen_k, frozen_v = layout.kv.get(module.layer_idx, (key[:, :, :0], value[:, :, :0]))  # none frozen: no cache

        def per_piece(x: torch.Tensor, frozen: torch.Tensor) -> torch.Tensor:  # -> [P, H, F + n, hd]
            own = x[0, :, c:].reshape(kv_heads, p, n, dim).transpose(0, 1)  # [P, Hkv, n, hd]
            frozen = frozen.expand(p, -1, -1, -1)
            return torch.cat([frozen[:, :, : layout.split], own, frozen[:, :, layout.split :]], dim=2).repeat_interleave(groups, 1)

        q = query[0, :, c:].reshape(heads, p, n, dim).transpose(0, 1)  # [P, H, n, hd]
        out = F.scaled_dot_product_attention(q, per_piece(key, frozen_k), per_piece(value, frozen_v), scale=scaling)
        outs.append(out.transpose(0, 1).reshape(1, heads, p * n, dim))  # [1, H, P*n, hd]
    return torch.cat(outs, dim=2)


AttentionInterface.register(FROZEN, frozen_attention)


class DualCacheTarget(ModelTarget):
    """A bidirectional target under the frozen-cache decoder of the module docstring."""

    exact = True  # pieces always score as one-piece forwards (the module docstring)

    def __init__(
        self,
        model: PreTrainedModel,
        mask_id: int,
        eos_ids: frozenset[int],
        block_length: int,
        tokenizer: PreTrainedTokenizerBase | None = None,
        name: str = "",
        cache: str = "dual",
        shift: bool = False,
        blocks_at_prompt_end: bool = True,
        key_order: str = "position",
    ) -> None:
        if cache not in CACHES:
            raise ValueError(f"cache {cache!r} is not one of {', '.join(CACHES)}")
        if key_order not in KEY_ORDERS:
            raise ValueError(f"key_order {key_order!r} is not one of {', '.join(KEY_ORDERS)}")
        model.set_attn_implementation(FROZEN)
        row_invariant_linears(model)
        for module in model.modules():
            if hasattr(module, "is_causal"):
                module.is_causal = False  # a plain forward (no layout, no mask) sees the whole canvas too
        super().__init__(model, mask_id, eos_ids, block_length, tokenizer, name)
        self.cache = cache
        self.shift = shift
        self.blocks_at_prompt_end = blocks_at_prompt_end
        self.key_order = key_order

    @classmethod
    def from_pretrained(
        cls,
        checkpoint: str | Path | Checkpoint,
        block_length: int | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        cache: str = "dual",
        trust_remote_code: bool = False,
        placement: Placement | None = None,
    ) -> DualCacheTarget:
        """Load a LLaDA or Dream checkpoint directory (weights, tokenizer, ids; block size from the family), or one
        already parsed; `placement` spreads its weights (spot.targets.placement) in place of `device`."""
        parts = load(checkpoint, "bidirectional", cls.__name__, block_length, device, dtype, trust_remote_code, placement)
        info = parts.checkpoint.info
        return cls(parts.model, info.mask_id, info.eos_ids, parts.block_length, parts.tokenizer, info.path, cache,
                   parts.checkpoint.family.shift)

    # -- the Target protocol ----------------------------------------------------------------------

    def open(self, prefix: torch.Tensor, positions: int | None = None) -> FrozenCanvas:
        if prefix.numel() % self.block_length and not self.blocks_at_prompt_end:
            raise ValueError(f"prefix length {prefix.numel()} is not a multiple of the block length {self.block_length}")
        if positions is None or (positions - prefix.numel()) % self.block_length or positions <= prefix.numel():
            raise ValueError(f"a bidirectional target needs the request's canvas length in whole blocks after the "
                             f"{prefix.numel()}-token prefix, got positions={positions}")
        return FrozenCanvas(prefix.to(self.device, torch.long), positions)

    @torch.inference_mode()
    def verify_batch(self, calls: Sequence[Call]) -> list[Verified]:
        """Each call's pieces [P, K] (row 0 the current state: at block start it fills the canvas) -> logits [P, K, V]."""
        layouts, ids, positions, offset = [], [], [], 0
        for call in calls:
            if call.ahead is not None:
                raise ValueError("a bidirectional target takes no cross pieces (cross_block is off for it)")
            layout, call_ids, call_positions = self._call_rows(call.stream, call.pieces.to(self.device), call.start)
            layout.offset, offset = offset, offset + layout.rows
            layouts.append(layout)
            ids.append(call_ids)
            positions.append(call_positions)
        hidden = self.model.model(
            input_ids=torch.cat(ids)[None], position_ids=torch.cat(positions)[None], attention_mask=None,
            use_cache=False, frozen_layout=tuple(layouts),
        ).last_hidden_state[0]  # [sum of the calls' rows, d]
        return self._counted([self._outputs(call.stream, call.start, hidden) for call in calls])

    def _call_rows(self, stream: FrozenCanvas, pieces: torch.Tensor, start: int) -> tuple[FrozenLayout, torch.Tensor, torch.Tensor]:
        """One call's layout (the stream's, set up at block start) and its rows' ids and positions."""
        k = pieces.shape[1]
        if start != stream.tokens.numel():
            raise RuntimeError(f"active block starts at {start} but the committed canvas ends at {stream.tokens.numel()}")
        if start + k > stream.length:
            raise ValueError(f"block ending at position {start + k} is past the canvas ({stream.length} positions)")
        end = start + k if self.cache == "nosuffix" else stream.length  # the canvas this block sees
        lo, hi = self._live(start, end)
        masks = torch.full((end - start - k,), self.mask_id, dtype=torch.long, device=self.device)
        canvas = stream.layout is None and self.cache != "none"  # block start: compute the KV to freeze
        if canvas:
            live = torch.zeros(end, dtype=torch.bool, device=self.device)
            live[lo:hi] = True
            frozen = torch.nonzero(~live)[:, 0]
            split = lo if self.key_order == "position" else len(frozen)  # the frozen positions before the live rows: 0..lo-1
            stream.layout = FrozenLayout(end, 0, hi - lo, frozen, split)
        elif stream.layout is None:  # no cache: nothing is frozen
            stream.layout = FrozenLayout(0, 0, hi - lo, torch.empty(0, dtype=torch.long, device=self.device), 0)
        fed = pieces[1:] if canvas else pieces  # [P', K]: the pieces fed as live rows
        rows = torch.cat([stream.tokens.expand(len(fed), -1), fed, masks.expand(len(fed), -1)], dim=1)[:, lo:hi]  # [P', n]
        ids = [rows.reshape(-1)]
        positions = [torch.arange(lo, hi, device=self.device).repeat(len(fed))]
        if canvas:
            ids.insert(0, torch.cat([stream.tokens, pieces[0], masks]))  # [L]
            positions.insert(0, torch.arange(end, device=self.device))
        stream.layout.canvas = end if canvas else 0
        stream.layout.pieces = len(fed)
        return stream.layout, torch.cat(ids), torch.cat(positions)

    def _outputs(self, stream: FrozenCanvas, start: int, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A call's logits [P, K, V] and hidden states [P, K, d] from the forward's hidden states."""
        layout, k = stream.layout, self.block_length
        lo = self._live(start, start + k)[0]  # the first live position (the canvas's end does not move it)
        hidden = hidden[layout.offset : layout.offset + layout.rows]  # this call's rows
        c, n = layout.canvas, layout.live
        source = torch.arange(start, start + k, device=self.device) - int(self.shift)
        source = source.clamp(min=0)  # [K]: the hidden row each block position's logits read
        if c and self.shift and start > 0 and lo == start:
            stream.before = hidden[start - 1].clone()
        live_hidden = hidden[c:].view(layout.pieces, n, hidden.shape[-1])  # [P', n, d]
        own = live_hidden[:, (source - lo).clamp(min=0)]  # [P', K, d]
        if source[0] < lo:  # the row before the block is frozen
            own[:, 0] = stream.before
        block_hidden = torch.cat([hidden[source][None], own]) if c else own  # [P, K, d]
        return self.model.lm_head(block_hidden), block_hidden

    def max_pieces(self, context: int) -> int:
        """context: the canvas positions (the engine passes the request's)."""
        config = self.model.config
        element = next(self.model.parameters()).element_size()
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        live = self._rows(context)
        per_row = layer_row_bytes(config, element, context) + 2 * config.num_key_value_heads * head_dim * element  # + fresh KV
        per_piece = live * per_row + self.block_length * self.vocab_size * (element + 4)  # + logits and their fp32 copy
        budget = SAFE_FRACTION * free_bytes(self.device) - context * per_row  # less the block-start canvas
        return max(int(budget // per_piece), 0)

    def ranked_span(self, start: int, positions: int, step: int) -> Span:
        """The rows the reference ranks at step `step`: those its forward fed, as the live rows of this cache mode
        are (`_live`): the whole canvas at the block-start forward (Fast-dLLM's get_transfer_index ranks all of
        x there) and at every step without a cache; later the block and its suffix (prefix), or the block (dual)."""
        lo, hi = (0, positions) if step == 0 else self._live(start, positions)
        return Span(start - lo, hi - start - self.block_length)

    def _live(self, start: int, end: int) -> tuple[int, int]:
        """The canvas positions [lo, hi) a piece recomputes with the active block at `start`, the canvas
        ending at `end`."""
        lo = 0 if self.cache == "none" else start
        hi = start + self.block_length if self.cache in ("dual", "nosuffix") else end
        return lo, hi

    def _rows(self, context: int) -> int:
        """Live rows per piece for the widest case (the first block) of a `context`-position canvas."""
        return self.block_length if self.cache in ("dual", "nosuffix") else context
