"""Row-invariant expert groups: a token's output must not depend on how many tokens share its expert.

In a verify forward, how many tokens an MoE expert gets depends on the other pieces, so the exact
layout (spot.targets.attention) needs every expert's output row to be the same whatever its group's
size. CPU kernels break that in three ways, all measured here: a matmul of one to three rows takes
another path than one of four or more (fp32); an elementwise kernel runs the last partial stretch of
a buffer through a tail loop with other rounding than its vectorised body (the last row of an odd
16-wide group came out 6e-8 off); and a bf16 matmul of more than 64 rows accumulates in another
order than a smaller one (one output of a 184-row expert group rounded one bf16 step away from the
same row in an 8-row group). An expert therefore runs on chunks of exactly ROWS rows, the last one
padded with zero rows: every token meets the same kernels on the same shapes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

ROWS = 8


def in_chunks(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """fn applied to x ([n, d], n >= 1) in chunks of ROWS rows, zero-padded: [n, d_out]."""
    n = x.shape[0]
    m = -(-n // ROWS) * ROWS
    if m != n:
        x = torch.cat([x, x.new_zeros(m - n, x.shape[1])])
    return torch.cat([fn(chunk) for chunk in x.split(ROWS)])[:n]
