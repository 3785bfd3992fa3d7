"""Row-invariant layers: a token's output must not depend on how many tokens share its matmul.

In a verify forward, how many tokens an MoE expert gets depends on the other pieces, so the exact
layout (spot.targets.attention) needs every expert's output row to be the same whatever its group's
size. CPU kernels break that in three ways, all measured here: a matmul of one to three rows takes
another path than one of four or more (fp32); an elementwise kernel runs the last partial stretch of
a buffer through a tail loop with other rounding than its vectorised body (the last row of an odd
16-wide group came out 6e-8 off); and a bf16 matmul of more than 64 rows accumulates in another
order than a smaller one (one output of a 184-row expert group rounded one bf16 step away from the
same row in an 8-row group). An expert therefore runs on chunks of exactly ROWS rows, the last one
padded with zero rows: every token meets the same kernels on the same shapes.

Dense layers need the same on CPUs with AMX: oneDNN's AMX bf16 kernels split the reduction by the row
count, so a [n, 768] x [768, 256] product (the embedded target's down projection) rounded 3-4 outputs
of its first rows one bf16 step apart at 64-192 rows against 1024, where the AVX-512 kernels of the
CPU this was first measured on gave the same rows at any count. In the exact layout every linear layer
therefore runs on chunks of exactly DENSE_ROWS rows (`row_invariant_linears`): larger than ROWS, since
dense layers see hundreds of rows per verify and a chunk costs a kernel call.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from spot.targets.placement import patch_forward

ROWS = 8
DENSE_ROWS = 64


def in_chunks(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, rows: int = ROWS) -> torch.Tensor:
    """fn applied to x ([n, d], n >= 1) in chunks of `rows` rows, zero-padded: [n, d_out]."""
    n = x.shape[0]
    m = -(-n // rows) * rows
    if m != n:
        x = torch.cat([x, x.new_zeros(m - n, x.shape[1])])
    return torch.cat([fn(chunk) for chunk in x.split(rows)])[:n]


def row_invariant_linears(model: nn.Module) -> None:
    """Every nn.Linear of `model` runs on chunks of DENSE_ROWS rows (the module docstring), beneath any accelerate
    hook (spot.targets.placement.patch_forward)."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            patch_forward(module, _chunked_linear)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear on chunks of DENSE_ROWS rows: x [..., d_in] -> [..., d_out], each row as in any other call."""
    rows = x.reshape(-1, x.shape[-1])  # [n, d_in]
    if rows.shape[0] == 0:
        return F.linear(x, weight, bias)
    out = in_chunks(lambda chunk: F.linear(chunk, weight, bias), rows, DENSE_ROWS)  # [n, d_out]
    return out.view(*x.shape[:-1], out.shape[-1])


def _chunked_linear(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return linear(x, self.weight, self.bias)
