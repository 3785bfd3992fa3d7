"""LLaDA2.0 (inclusionAI, `model_type "llada2_moe"`): a native implementation without remote code.

A BailingMoeV2-style decoder, read from the published modeling file's behaviour [SRC: the hub's
modeling_llada2_moe.py as mirrored publicly; SGLang's llada2.py agrees]; the module names are the
published weight names, so a checkpoint loads as it is:

    model.word_embeddings                       [V, d]
    model.layers.N.input_layernorm              RMSNorm(d)
    model.layers.N.attention.query_key_value    [(H + 2 Hkv) hd, d]: q, k, v heads in that order
    model.layers.N.attention.query_layernorm    RMSNorm(hd) on every q head, before rotary
    model.layers.N.attention.key_layernorm      RMSNorm(hd) on every k head
    model.layers.N.attention.dense              [d, H hd]
    model.layers.N.post_attention_layernorm     RMSNorm(d)
    model.layers.N.mlp                          a SwiGLU MLP for N < first_k_dense_replace, else the MoE:
        gate.weight [E, d], gate.expert_bias [E]; experts.e.{gate,up,down}_proj; shared_experts.*
    model.norm, lm_head                         (untied)

Rotary position embedding covers the first `partial_rotary_factor` of each head (rotate-half
pairing within it); the router scores experts with a sigmoid in fp32, picks the `topk_group` best
of `n_group` expert groups (a group's score: its two best scores plus the expert bias), then the
top `num_experts_per_tok` experts by biased score, and weighs them by their unbiased scores,
normalised and scaled by `routed_scaling_factor`. RMSNorm normalises in fp32, rounds to the input
dtype and then multiplies by the weight. Attention follows the mask given (the target passes the
block-causal one); the model has no mask of its own.

Two choices are ours [INF]: each expert runs on its group of tokens in fixed chunks (spot.targets.rows), and
the experts' weighted outputs are added in expert order, so that a token's output does not depend
on which other tokens share the forward (the exact verify layout needs that, spot.targets.attention).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import PreTrainedConfig, PreTrainedModel
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from spot.targets.rows import DENSE_ROWS, in_chunks


@strict
class LLaDA2Config(PreTrainedConfig):
    """The published config.json's fields (LLaDA2.0-mini's values as defaults). It names no mask, EOS
    or block size: those come from the tokenizer and the model card (spot.targets.checkpoint.read_checkpoint)."""

    model_type = "llada2_moe"

    vocab_size: int = 157184
    hidden_size: int = 2048
    intermediate_size: int = 5120
    num_hidden_layers: int = 20
    num_attention_heads: int = 16
    num_key_value_heads: int = 4
    head_dim: int = 128
    hidden_act: str = "silu"
    moe_intermediate_size: int = 512
    num_experts: int = 256
    num_experts_per_tok: int = 8
    num_shared_experts: int = 1
    n_group: int = 8
    topk_group: int = 4
    routed_scaling_factor: float = 2.5
    first_k_dense_replace: int = 1
    partial_rotary_factor: float = 0.5
    rope_theta: float = 600000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 16384
    use_qk_norm: bool = True
    use_qkv_bias: bool = False
    use_bias: bool = False
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self, **kwargs):
        if self.num_experts % self.n_group:
            raise ValueError(f"num_experts {self.num_experts} is not a multiple of n_group {self.n_group}")
        super().__post_init__(**kwargs)


class LLaDA2RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(x.dtype)


class LLaDA2Rotary(nn.Module):
    """cos and sin [B, L, r] (r = rotary dims per head) at the given positions, in the activations' dtype."""

    def __init__(self, config: LLaDA2Config) -> None:
        super().__init__()
        self.dims = int(config.head_dim * config.partial_rotary_factor)
        exponents = torch.arange(0, self.dims, 2, dtype=torch.int64).float() / self.dims
        self.register_buffer("inv_freq", 1.0 / config.rope_theta**exponents, persistent=False)  # [r / 2]

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = position_ids[..., None].float() * self.inv_freq.float()  # [B, L, r / 2]
        angles = torch.cat([angles, angles], dim=-1)  # [B, L, r]
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary on the first r dims of every head (x: [B, H, L, hd]; cos, sin: [B, L, r]), rotate-half pairs."""
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    half = torch.cat([-rot[..., r // 2 :], rot[..., : r // 2]], dim=-1)
    rot = rot * cos[:, None] + half * sin[:, None]
    return torch.cat([rot, rest], dim=-1)


class LLaDA2Attention(nn.Module):
    def __init__(self, config: LLaDA2Config, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.num_key_value_groups = self.heads // self.kv_heads  # read by transformers' SDPA attention
        self.scaling = self.head_dim**-0.5
        self.is_causal = False  # the block-causal mask comes from the caller
        qkv = (self.heads + 2 * self.kv_heads) * self.head_dim
        self.query_key_value = nn.Linear(config.hidden_size, qkv, bias=config.use_qkv_bias)
        self.dense = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=config.use_bias)
        if config.use_qk_norm:
            self.query_layernorm = LLaDA2RMSNorm(self.head_dim, config.rms_norm_eps)
            self.key_layernorm = LLaDA2RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, hidden: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], attention_mask: torch.Tensor | None,
                cache: Cache | None, **kwargs) -> torch.Tensor:
        b, n, _ = hidden.shape
        qkv = self.query_key_value(hidden).view(b, n, self.heads + 2 * self.kv_heads, self.head_dim)
        q, k, v = qkv.split([self.heads, self.kv_heads, self.kv_heads], dim=2)  # [B, L, h, hd] each
        if self.config.use_qk_norm:
            q, k = self.query_layernorm(q), self.key_layernorm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, h, L, hd]
        q, k = _rotate(q, *rotary), _rotate(k, *rotary)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, sdpa_attention_forward)
        out, _ = attention(self, q, k, v, attention_mask, scaling=self.scaling, dropout=0.0, **kwargs)  # [B, L, H, hd]
        return self.dense(out.reshape(b, n, self.heads * self.head_dim))


class LLaDA2MLP(nn.Module):
    def __init__(self, config: LLaDA2Config, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, intermediate, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, config.hidden_size, bias=False)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


@dataclass(frozen=True)
class Routing:
    """experts, weights: [T, k] the chosen experts per token and their fp32 weights."""

    experts: torch.Tensor
    weights: torch.Tensor


class LLaDA2Gate(nn.Module):
    def __init__(self, config: LLaDA2Config) -> None:
        super().__init__()
        self.config = config
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))
        self.register_buffer("expert_bias", torch.zeros(config.num_experts))

    def forward(self, x: torch.Tensor) -> Routing:
        """x: [T, d] -> the routing (the module docstring's rule)."""
        c = self.config
        # fixed row chunks: a token's routing must not move with the tokens beside it (spot.targets.rows)
        scores = torch.sigmoid(in_chunks(lambda chunk: nn.functional.linear(chunk.float(), self.weight.float()), x, DENSE_ROWS))  # [T, E]
        biased = scores + self.expert_bias.float()
        groups = biased.view(-1, c.n_group, c.num_experts // c.n_group)  # [T, G, E / G]
        best_groups = groups.topk(2, dim=-1).values.sum(-1).topk(c.topk_group, dim=-1).indices  # [T, topk_group]
        keep = torch.zeros_like(groups[..., 0], dtype=torch.bool).scatter_(1, best_groups, True)  # [T, G]
        biased = groups.masked_fill(~keep[..., None], float("-inf")).view(-1, c.num_experts)
        experts = biased.topk(c.num_experts_per_tok, dim=-1).indices  # [T, k]
        weights = scores.gather(1, experts)
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20) * c.routed_scaling_factor
        return Routing(experts, weights)


class LLaDA2MoE(nn.Module):
    def __init__(self, config: LLaDA2Config) -> None:
        super().__init__()
        self.gate = LLaDA2Gate(config)
        self.experts = nn.ModuleList(LLaDA2MLP(config, config.moe_intermediate_size) for _ in range(config.num_experts))
        self.shared_experts = LLaDA2MLP(config, config.moe_intermediate_size * config.num_shared_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])  # [T, d]
        routing = self.gate(tokens)
        routed = torch.zeros(tokens.shape, dtype=torch.float32, device=x.device)  # [T, d]
        for expert in routing.experts.unique().tolist():  # ascending: every token sums its experts in one order
            rows, slot = torch.where(routing.experts == expert)  # [n] each
            y = in_chunks(self.experts[expert], tokens[rows]).float()  # [n, d]
            routed.index_add_(0, rows, y * routing.weights[rows, slot, None])
        return (routed.to(x.dtype) + self.shared_experts(tokens)).view(shape)


class LLaDA2Layer(nn.Module):
    def __init__(self, config: LLaDA2Config, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = LLaDA2RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attention = LLaDA2Attention(config, layer_idx)
        self.post_attention_layernorm = LLaDA2RMSNorm(config.hidden_size, config.rms_norm_eps)
        dense = layer_idx < config.first_k_dense_replace
        self.mlp = LLaDA2MLP(config, config.intermediate_size) if dense else LLaDA2MoE(config)

    def forward(self, h: torch.Tensor, rotary, attention_mask, cache, **kwargs) -> torch.Tensor:
        h = h + self.attention(self.input_layernorm(h), rotary, attention_mask, cache, **kwargs)
        return h + self.mlp(self.post_attention_layernorm(h))


class LLaDA2PreTrainedModel(PreTrainedModel):
    config_class = LLaDA2Config
    base_model_prefix = "model"
    _supports_sdpa = True
    _supports_attention_backend = True
    _no_split_modules = ["LLaDA2Layer"]  # a device map places whole layers (spot.targets.placement)

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, LLaDA2Gate):
            nn.init.normal_(module.weight, std=self.config.initializer_range)
            nn.init.zeros_(module.expert_bias)
        elif isinstance(module, LLaDA2RMSNorm):
            nn.init.ones_(module.weight)
        elif isinstance(module, LLaDA2Rotary):
            exponents = torch.arange(0, module.dims, 2, dtype=torch.int64).float() / module.dims
            module.inv_freq.copy_(1.0 / self.config.rope_theta**exponents)


class LLaDA2Model(LLaDA2PreTrainedModel):
    def __init__(self, config: LLaDA2Config) -> None:
        super().__init__(config)
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LLaDA2Layer(config, i) for i in range(config.num_hidden_layers))
        self.norm = LLaDA2RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = LLaDA2Rotary(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:  # the published name, not transformers' embed_tokens
        return self.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.word_embeddings = value

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        use_cache: bool = False,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        """input_ids, position_ids: [B, L]; attention_mask: [B, 1, L, cached + L] bool (True: may attend), None
        for none (every row sees every key); cache: grown by the L new positions when given."""
        h = self.word_embeddings(input_ids)  # [B, L, d]
        rotary = self.rotary(h, position_ids)
        for layer in self.layers:
            h = layer(h, rotary, attention_mask, cache, **kwargs)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(h), cache=cache if use_cache else None)


class LLaDA2ForCausalLM(LLaDA2PreTrainedModel):
    """The published `LLaDA2MoeModelLM`'s weights: `model` and an untied `lm_head`."""

    def __init__(self, config: LLaDA2Config) -> None:
        super().__init__(config)
        self.model = LLaDA2Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, **kwargs) -> torch.Tensor:
        """[B, L, V] logits (no shift: position i's own distribution)."""
        return self.lm_head(self.model(input_ids, position_ids, **kwargs).last_hidden_state)
