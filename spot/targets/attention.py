"""Per-piece attention: the exact verify layout, where a piece's logits do not depend on the other pieces.

In the packed layout (spot.targets.block_causal) all pieces share one sequence, and a 4D mask hides the
other pieces from each one. The hidden keys still pass through the attention kernel's blocked
reductions, so a state's logits move with the number of pieces and its slot among them (up to
1.3e-5 in fp32 and 0.125 in bf16 on the embedded target: bench/verify_exactness.py). A near-tie
then flips, and a speculative method writes other tokens than draft-free decoding.

Here every query attends to exactly the keys it may see, with nothing masked beside them: the
rows of piece r to [cache | pending prefix | piece r], all P pieces in one batched call; the
pending rows to [cache | pending] under their block-causal mask. Several requests share a forward
as consecutive runs of rows, each with its own cache: a request's attention is the very call it
makes alone. Each piece thus runs the very computation a one-piece forward of its state runs. The rest of the network treats every token
row alike, provided a linear layer's output row does not depend on how many rows the matrix has:
CPU kernels do not promise it (oneDNN's AMX bf16 kernels split the reduction by row count), so in
this layout every linear layer and every MoE expert runs on fixed-size row chunks
(spot.targets.rows); on CUDA flash attention's split heuristics depend on the batch too (README,
"Exactness").

The layout reaches the attention as a keyword argument of the model's forward (`piece_layout=`, a
PieceLayout per request, which transformers hands every attention call; the model runs without a
cache of its own, and each layer appends a request's keys and values to that request's cache), and
`piece_attention` is registered with transformers as the attention implementation `PIECES`. Without a layout it is transformers' SDPA
attention on the mask it is given, so one model serves an exact and a packed target alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.cache_utils import Cache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

PIECES = "spot_pieces"


@dataclass(frozen=True)
class PieceLayout:
    """One request's rows in a verify forward, from row `offset` on: `pending` rows of completed blocks, then
    `pieces` x `block` rows, then `ahead` cross pieces of 2 x `block` rows: [a finished active block | a state
    of the next block].

    cache: the request's KV of its `cached` completed blocks' positions; each layer appends the request's rows
    to it (the caller crops the pieces' off again). pending_mask: [pending, cached + pending] bool, block-causal
    among the pending rows (None without them).
    """

    offset: int
    cached: int
    pending: int
    pieces: int
    block: int
    pending_mask: torch.Tensor | None
    cache: Cache
    ahead: int = 0

    @property
    def rows(self) -> int:
        return self.pending + (self.pieces + 2 * self.ahead) * self.block


def piece_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    piece_layout: tuple[PieceLayout, ...] | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: query, key, value [1, H or Hkv, q, d] (the forward's rows, no
    cache) -> ([1, q, H, d], no weights). With `piece_layout` (one per request, in row order) each request's rows
    attend to its own cache and rows only, and the mask transformers prepared is not used."""
    if piece_layout is None:  # the packed layout: its mask tensor (and the cache transformers updated)
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    outs = []
    for layout in piece_layout:
        rows = slice(layout.offset, layout.offset + layout.rows)
        keys, values = layout.cache.update(key[:, :, rows], value[:, :, rows], module.layer_idx)  # [1, Hkv, cached + q, d]
        outs.append(_request_attention(query[:, :, rows], keys, values, layout, scaling))
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


def _request_attention(query, key, value, layout: PieceLayout, scaling: float | None) -> torch.Tensor:
    """One request's rows: query [1, H, q, d], key/value [1, Hkv, cached + q, d] -> [1, H, q, d]."""
    heads, dim = query.shape[1], query.shape[-1]
    groups = heads // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)  # [1, H, cached + q, d]: grouped-query heads, as repeat_kv
    value = value.repeat_interleave(groups, dim=1)
    prefix = layout.cached + layout.pending
    p, k = layout.pieces, layout.block

    def per_piece(x: torch.Tensor) -> torch.Tensor:  # [1, H, L, d] -> [P, H, prefix + K, d]
        own = x[0, :, prefix : prefix + p * k].reshape(heads, p, k, dim).transpose(0, 1)  # [P, H, K, d]
        return torch.cat([x[:, :, :prefix].expand(p, heads, prefix, dim), own], dim=2)

    q = query[0, :, layout.pending : layout.pending + p * k].reshape(heads, p, k, dim).transpose(0, 1).contiguous()  # [P, H, K, d]
    out = F.scaled_dot_product_attention(q, per_piece(key), per_piece(value), scale=scaling)  # [P, H, K, d]
    out = out.transpose(0, 1).reshape(1, heads, p * k, dim)  # [1, H, P*K, d]
    if layout.ahead:
        out = torch.cat([out, _ahead_attention(query, key, value, layout, scaling)], dim=2)
    if layout.pending:
        rows = F.scaled_dot_product_attention(
            query[:, :, : layout.pending], key[:, :, :prefix], value[:, :, :prefix],
            attn_mask=layout.pending_mask, scale=scaling,
        )  # [1, H, Lp, d]
        out = torch.cat([rows, out], dim=2)
    return out


def _ahead_attention(query, key, value, layout: PieceLayout, scaling: float | None) -> torch.Tensor:
    """The cross pieces' rows ([1, H, C*2K, d]; query, key, value one request's as _request_attention's, heads repeated).

    A cross piece's finished-block rows attend to [cache | pending | themselves] under an all-True mask of
    the very shape the draft-free decoder's pending rows use when that block rides along with the next
    block's first forward, so their keys and values come out as that forward's do; its next-block rows
    attend to [cache | pending | finished block | themselves], as a piece of that forward does."""
    heads, dim = query.shape[1], query.shape[-1]
    prefix, k, c = layout.cached + layout.pending, layout.block, layout.ahead
    first = layout.pending + layout.pieces * k  # the first cross row among the queries

    def rows(x: torch.Tensor, start: int) -> torch.Tensor:  # [1, H, L, d] -> [C, H, 2K, d], the cross pieces' rows
        return x[0, :, start : start + c * 2 * k].reshape(heads, c, 2 * k, dim).transpose(0, 1)

    own_q, own_k, own_v = rows(query, first), rows(key, layout.cached + first), rows(value, layout.cached + first)

    def keys(x: torch.Tensor, own: torch.Tensor, n: int) -> torch.Tensor:  # [C, H, prefix + n, d]
        return torch.cat([x[:, :, :prefix].expand(c, heads, prefix, dim), own[:, :, :n]], dim=2)

    done = torch.ones(k, prefix + k, dtype=torch.bool, device=query.device)
    finished = F.scaled_dot_product_attention(own_q[:, :, :k].contiguous(), keys(key, own_k, k), keys(value, own_v, k),
                                              attn_mask=done, scale=scaling)  # [C, H, K, d]
    following = F.scaled_dot_product_attention(own_q[:, :, k:].contiguous(), keys(key, own_k, 2 * k), keys(value, own_v, 2 * k),
                                               scale=scaling)  # [C, H, K, d]
    out = torch.cat([finished, following], dim=2)  # [C, H, 2K, d]
    return out.transpose(0, 1).reshape(1, heads, c * 2 * k, dim)


AttentionInterface.register(PIECES, piece_attention)
