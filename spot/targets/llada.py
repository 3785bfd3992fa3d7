"""LLaDA (GSAI-ML, `model_type "llada"`) on transformers' Llama building blocks, without remote code.

LLaDA-8B is a Llama-style transformer (RMSNorm, SwiGLU, rotary, no biases) under OLMo-style weight names
[SRC: the hub's modeling_llada.py, `LLaDALlamaBlock`]; `KEY_MAPPING` renames them to Llama's for
transformers' `from_pretrained(key_mapping=...)`:

    model.transformer.wte                        -> model.embed_tokens
    model.transformer.blocks.N.attn_norm         -> model.layers.N.input_layernorm
    model.transformer.blocks.N.{q,k,v}_proj      -> model.layers.N.self_attn.{q,k,v}_proj
    model.transformer.blocks.N.attn_out          -> model.layers.N.self_attn.o_proj
    model.transformer.blocks.N.ff_norm           -> model.layers.N.post_attention_layernorm
    model.transformer.blocks.N.ff_proj           -> model.layers.N.mlp.gate_proj  (SiLU(ff_proj x) * up_proj x)
    model.transformer.blocks.N.up_proj           -> model.layers.N.mlp.up_proj
    model.transformer.blocks.N.ff_out            -> model.layers.N.mlp.down_proj
    model.transformer.ln_f                       -> model.norm
    model.transformer.ff_out                     -> lm_head

Its numerics differ from Llama's in one place: with `rope_full_precision` (LLaDA-8B's setting) q and k
are rotated in fp32 and rounded back, where Llama rounds cos and sin to the activations' dtype
first; `LLaDAAttention` does the former. The attention is bidirectional over the whole canvas: the
model has no mask of its own, the caller passes one (spot.targets.dual_cache).
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

KEY_MAPPING = {
    r"^model\.transformer\.wte\.": "model.embed_tokens.",
    r"^model\.transformer\.ln_f\.": "model.norm.",
    r"^model\.transformer\.ff_out\.": "lm_head.",
    r"^model\.transformer\.blocks\.(\d+)\.attn_norm\.": r"model.layers.\1.input_layernorm.",
    r"^model\.transformer\.blocks\.(\d+)\.q_proj\.": r"model.layers.\1.self_attn.q_proj.",
    r"^model\.transformer\.blocks\.(\d+)\.k_proj\.": r"model.layers.\1.self_attn.k_proj.",
    r"^model\.transformer\.blocks\.(\d+)\.v_proj\.": r"model.layers.\1.self_attn.v_proj.",
    r"^model\.transformer\.blocks\.(\d+)\.attn_out\.": r"model.layers.\1.self_attn.o_proj.",
    r"^model\.transformer\.blocks\.(\d+)\.ff_norm\.": r"model.layers.\1.post_attention_layernorm.",
    r"^model\.transformer\.blocks\.(\d+)\.ff_proj\.": r"model.layers.\1.mlp.gate_proj.",
    r"^model\.transformer\.blocks\.(\d+)\.up_proj\.": r"model.layers.\1.mlp.up_proj.",
    r"^model\.transformer\.blocks\.(\d+)\.ff_out\.": r"model.layers.\1.mlp.down_proj.",
}

# LLaDA config fields whose other values select code this adapter does not implement -> the value it implements.
_SUPPORTED = {"block_type": "llama", "layer_norm_type": "rms", "activation_type": "silu", "alibi": False, "rope": True,
              "include_bias": False, "include_qkv_bias": False, "attention_layer_norm": False, "input_emb_norm": False,
              "scale_logits": False, "block_group_size": 1}


def llada_config(**raw) -> LlamaConfig:
    """LLaDA's config.json fields -> a LlamaConfig of the same model (LLaDA-8B's values as defaults)."""
    for name, value in _SUPPORTED.items():
        if raw.get(name, value) != value:
            raise ValueError(f"LLaDA config field {name}={raw[name]!r} is not supported (only {value!r}): spot-eval's "
                             "LLaDA adapter implements LLaDA-8B's architecture")
    d = raw.get("d_model", 4096)
    heads = raw.get("n_heads", 32)
    return LlamaConfig(
        vocab_size=raw.get("embedding_size") or raw.get("vocab_size", 126464),
        hidden_size=d,
        intermediate_size=raw.get("mlp_hidden_size") or raw.get("mlp_ratio", 4) * d,
        num_hidden_layers=raw.get("n_layers", 32),
        num_attention_heads=heads,
        num_key_value_heads=raw.get("n_kv_heads") or heads,
        max_position_embeddings=raw.get("max_sequence_length", 4096),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-5),
        rope_theta=raw.get("rope_theta", 500000.0),
        rope_full_precision=raw.get("rope_full_precision", True),
        tie_word_embeddings=raw.get("weight_tying", False),
        attention_bias=False,
        mask_token_id=raw.get("mask_token_id"),
        eos_token_id=raw.get("eos_token_id"),
        pad_token_id=raw.get("pad_token_id"),
        initializer_range=raw.get("init_std", 0.02),
    )


class LLaDARotaryEmbedding(LlamaRotaryEmbedding):
    """cos and sin in fp32 whatever the activations' dtype (`rope_full_precision`). transformers fills a
    loaded model's rotary buffers in modules whose class name holds "RotaryEmbedding": keep it."""

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return super().forward(x.float(), position_ids)


class LLaDAAttention(LlamaAttention):
    """Llama's attention, rotating q and k in fp32 (LLaDA's `rope_full_precision`), no cache: the caller
    passes the KV layout (spot.targets.dual_cache)."""

    def forward(self, hidden_states, position_embeddings, attention_mask=None, cache=None, **kwargs):
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)  # [B, H, L, hd]
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        cos, sin = position_embeddings  # fp32 (LLaDARotaryEmbedding)
        if not self.config.rope_full_precision:
            cos, sin = cos.to(v.dtype), sin.to(v.dtype)
        q, k = apply_rotary_pos_emb(q.to(cos.dtype), k.to(cos.dtype), cos, sin)
        q, k = q.to(v.dtype), k.to(v.dtype)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, sdpa_attention_forward)
        out, weights = attention(self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling, **kwargs)  # [B, L, H, hd]
        return self.o_proj(out.reshape(*hidden_states.shape[:-1], -1)), weights


class LLaDAForCausalLM(LlamaForCausalLM):
    """LLaDA-8B's weights in Llama's modules (`KEY_MAPPING`), with its fp32 rotary."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__(config)
        self.model.rotary_emb = LLaDARotaryEmbedding(config)
        for i, layer in enumerate(self.model.layers):
            layer.self_attn = LLaDAAttention(config, i)
            layer.self_attn.is_causal = False  # bidirectional wherever no mask is given
        self.post_init()
