"""Row-invariant kernels (spot.targets.rows): a row's output does not depend on how many rows share the call."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

from spot.targets import BlockCausalTarget
from spot.targets.rows import row_invariant_linears
from spot.targets.sdar import row_invariant_router
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


def test_the_qwen3_moe_router_routes_each_row_alike_at_any_row_count():
    # on the AMX CPU of 2026-12-02, with two torch threads, transformers' own router gave rows 7-106 other logits
    # alone than among 700 rows (with one thread the same rows)
    config = Qwen3MoeConfig(hidden_size=768, num_experts=64, num_experts_per_tok=8, norm_topk_prob=True)
    router = Qwen3MoeTopKRouter(config).to(torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        router.weight.copy_(0.05 * torch.randn(64, 768, generator=g))
    x = torch.randn(700, 768, generator=g).to(torch.bfloat16)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        check_router(router, x)
    finally:
        torch.set_num_threads(threads)


def check_router(router: nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        plain = router(x)
        chunked = row_invariant_router(router, x)
        torch.testing.assert_close(chunked[0].float(), plain[0].float(), rtol=0.02, atol=0.02)
        assert [t.shape for t in chunked] == [t.shape for t in plain]
        for start, n in ((0, 1), (0, 64), (7, 100), (40, 160), (0, 700)):
            part = row_invariant_router(router, x[start : start + n])
            assert all(torch.equal(a, b[start : start + n]) for a, b in zip(part, chunked, strict=True)), (start, n)
