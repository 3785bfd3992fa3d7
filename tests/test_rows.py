"""Row-invariant kernels (spot.targets.rows): a row's output does not depend on how many rows share the call."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from spot.targets import BlockCausalTarget
from spot.targets.rows import row_invariant_linears
from spot_eval.checkpoints.shipped import EMBEDDED_TARGET


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_chunked_linear_row_is_the_same_at_any_row_count_and_slot(dtype):
    # the embedded target's down projection: under oneDNN's AMX bf16 kernels a plain product of 64-192 rows
    # rounds a few outputs one bf16 step from the same rows in a 1024-row product
    g = torch.Generator().manual_seed(0)
    layer = nn.Linear(768, 256, bias=True).to(dtype)
    with torch.no_grad():
        layer.weight.copy_(0.05 * torch.randn(256, 768, generator=g))
        layer.bias.copy_(torch.randn(256, generator=g))
    row_invariant_linears(layer)
    x = torch.randn(1024, 768, generator=g).to(dtype)
    with torch.no_grad():
        full = layer(x)  # [1024, 256]
        for start, n in ((0, 1), (0, 64), (0, 65), (0, 160), (3, 1), (5, 96), (37, 300), (500, 524)):
            assert torch.equal(layer(x[start : start + n]), full[start : start + n]), (start, n)
        batched = layer(x[:96].view(3, 32, 768))  # [3, 32, 256]: leading dimensions kept
        assert batched.shape == (3, 32, 256) and torch.equal(batched.reshape(96, 256), full[:96])
        assert layer(x[:0]).shape == (0, 256)
        torch.testing.assert_close(full.float(), nn.functional.linear(x, layer.weight, layer.bias).float(),
                                   rtol=0.02, atol=0.02)


def test_the_exact_layout_chunks_every_linear_layer_and_the_packed_one_none():
    exact = BlockCausalTarget.from_pretrained(EMBEDDED_TARGET, exact=True)
    packed = BlockCausalTarget.from_pretrained(EMBEDDED_TARGET)
    linears = [m for m in exact.model.modules() if isinstance(m, nn.Linear)]
    assert linears and all("forward" in vars(m) for m in linears)
    assert not any("forward" in vars(m) for m in packed.model.modules() if isinstance(m, nn.Linear))
