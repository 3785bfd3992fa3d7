"""SDAR's numerics on transformers' Qwen3 / Qwen3-MoE modules (JetLM/SDAR-*-Chat[-bN], SDAR-30B-A3B).

SDAR checkpoints ship Qwen3 / Qwen3-MoE weight names under `model_type: "sdar"` / `"sdar_moe"` and
remote code; spot.targets.checkpoint maps their config.json to a plain `Qwen3Config` /
`Qwen3MoeConfig`, the weights load into `Qwen3ForCausalLM` / `Qwen3MoeForCausalLM` without remote
code, and the target (spot.targets.block_causal) computes every RMSNorm as SDAR does (`sdar_rms_norm`)
and, in the exact layout, Qwen3-MoE's router and experts row-invariantly (`row_invariant_router`,
`row_invariant_experts`).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeRMSNorm

from spot.targets.placement import patch_forward
from spot.targets.rows import DENSE_ROWS, in_chunks


def sdar_rms_norm(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """RMSNorm as SDAR's released inference path computes it (flash-attn's Triton `rms_norm_fn`), on a Qwen3
    RMSNorm's `weight` and `variance_epsilon`: the input normalised in fp32 and multiplied by the weight in fp32,
    then rounded to the input dtype once. transformers' Qwen3RMSNorm rounds the normalised input first and
    multiplies in the input dtype: the same in fp32, up to a rounding apart in bf16, where it was the main
    difference from SDAR's logits."""
    x = hidden_states.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
    return (x * self.weight.float()).to(hidden_states.dtype)


def row_invariant_experts(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
    """Qwen3-MoE's experts (transformers' Qwen3MoeExperts weights, gate_up_proj [E, 2F, d] and
    down_proj [E, d, F]) run on every expert's group of tokens in fixed chunks (spot.targets.rows): how many
    tokens an expert gets depends on the other pieces of a verify, and the exact layout needs a token's
    output not to.

    hidden_states: [T, d]; top_k_index, top_k_weights: [T, k]. Returns [T, d]: per token the weighted sum
    of its experts' outputs, added in expert order (the same order whatever the grouping)."""
    out = torch.zeros_like(hidden_states)
    for expert in top_k_index.unique().tolist():
        tokens, slot = torch.where(top_k_index == expert)  # [n] each

        def mlp(x: torch.Tensor, expert: int = expert) -> torch.Tensor:  # [ROWS, d] -> [ROWS, d]
            gate, up = nn.functional.linear(x, self.gate_up_proj[expert]).chunk(2, dim=-1)  # [ROWS, F] each
            return nn.functional.linear(self.act_fn(gate) * up, self.down_proj[expert])

        y = in_chunks(mlp, hidden_states[tokens])  # [n, d]
        out.index_add_(0, tokens, (y * top_k_weights[tokens, slot, None]).to(out.dtype))
    return out


def row_invariant_router(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Qwen3-MoE's router (transformers' Qwen3MoeTopKRouter) with its logits computed in fixed chunks of
    DENSE_ROWS rows (spot.targets.rows): a token's routing is a discrete choice, so its logits must not move
    with the number of tokens in the verify. hidden_states: [..., d]. Returns (logits [T, E], weights [T, k],
    experts [T, k]) as transformers' router does."""
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)  # [T, d]
    router_logits = in_chunks(lambda chunk: nn.functional.linear(chunk, self.weight), hidden_states, DENSE_ROWS)
    router_probs = nn.functional.softmax(router_logits, dtype=torch.float, dim=-1)
    router_top_value, router_indices = torch.topk(router_probs, self.top_k, dim=-1)  # [T, k]
    if self.norm_topk_prob:
        router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
    return router_logits, router_top_value.to(router_logits.dtype), router_indices


def use_sdar_norms(model: nn.Module) -> None:
    """Every Qwen3 / Qwen3-MoE RMSNorm of `model` (per-head q/k norms, layer and final norms) computed
    as SDAR computes it, on the same weights."""
    for module in model.modules():
        if isinstance(module, (Qwen3RMSNorm, Qwen3MoeRMSNorm)):
            patch_forward(module, sdar_rms_norm)
