"""LLaDA (`llada`) and Dream (`Dream`): bidirectional targets under the frozen-cache decoder
(spot.targets.dual_cache). Directories with the published config fields and weight names load; the
decoder equals a slow implementation of its definition; pieces score bit for bit as one-piece forwards;
every drafter is lossless relative to it; the training commands and decode run on such a directory."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import torch
from conftest import tiny_target, write_checkpoint
from safetensors.torch import load_file, save_file
from test_llada2 import every_drafter_is_lossless, training_commands_work
from test_lm import lm_eval_runs_losslessly
from test_sdar_target import random_states
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import DynamicCache, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from spot import DecodeConfig, Sampling, generate
from spot.engine import finished
from spot.noise import gumbel, step_key
from spot.policy import decide
from spot.targets import DualCacheTarget, from_pretrained
from spot.targets.llada import LLaDAForCausalLM, llada_config
from spot_eval.cli import main

VOCAB, MASK, EOS = 64, 63, 62
LLADA_FIELDS = dict(model_type="llada", d_model=32, n_heads=4, n_kv_heads=4, n_layers=2, mlp_hidden_size=64, mlp_ratio=4,
                    embedding_size=VOCAB, vocab_size=VOCAB, max_sequence_length=512, rope_theta=10000.0, mask_token_id=MASK,
                    eos_token_id=EOS, pad_token_id=EOS, block_type="llama", layer_norm_type="rms", activation_type="silu",
                    rope_full_precision=True, weight_tying=False, include_bias=False, include_qkv_bias=False, init_std=0.3)


def _peaked(model, seed: int, dtype: torch.dtype):
    """A scaled head for peaked distributions, and EOS made unlikely so that requests run to length."""
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)
        model.lm_head.weight[EOS].mul_(0.2)
    return model.eval().to(dtype)


def tiny_llada(seed: int = 0, dtype: torch.dtype = torch.float32) -> LLaDAForCausalLM:
    torch.manual_seed(seed)
    return _peaked(LLaDAForCausalLM(llada_config(**LLADA_FIELDS)), seed, dtype)


def tiny_dream(seed: int = 0, dtype: torch.dtype = torch.float32) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.3, tie_word_embeddings=False)
    return _peaked(Qwen2ForCausalLM(config), seed, dtype)


def _tokenizer(path: Path) -> None:
    vocab = {f"t{i}": i for i in range(VOCAB - 2)} | {"<|endoftext|>": EOS, "<|mdm_mask|>": MASK}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", mask_token="<|mdm_mask|>").save_pretrained(path)


# Llama's weight names -> LLaDA-8B's published ones, written out from the hub's modeling_llada.py
# (independently of spot.targets.llada.KEY_MAPPING, which reads them the other way).
PUBLISHED = ((r"^model\.embed_tokens\.", "model.transformer.wte."), (r"^model\.norm\.", "model.transformer.ln_f."),
             (r"^lm_head\.", "model.transformer.ff_out."),
             (r"^model\.layers\.(\d+)\.input_layernorm\.", r"model.transformer.blocks.\1.attn_norm."),
             (r"^model\.layers\.(\d+)\.self_attn\.([qkv])_proj\.", r"model.transformer.blocks.\1.\2_proj."),
             (r"^model\.layers\.(\d+)\.self_attn\.o_proj\.", r"model.transformer.blocks.\1.attn_out."),
             (r"^model\.layers\.(\d+)\.post_attention_layernorm\.", r"model.transformer.blocks.\1.ff_norm."),
             (r"^model\.layers\.(\d+)\.mlp\.gate_proj\.", r"model.transformer.blocks.\1.ff_proj."),
             (r"^model\.layers\.(\d+)\.mlp\.up_proj\.", r"model.transformer.blocks.\1.up_proj."),
             (r"^model\.layers\.(\d+)\.mlp\.down_proj\.", r"model.transformer.blocks.\1.ff_out."))


def _published_name(name: str) -> str:
    return next(re.sub(ours, published, name) for ours, published in PUBLISHED if re.match(ours, name))


def write_llada(path: Path, model: LLaDAForCausalLM) -> Path:
    """A directory shaped like GSAI-ML/LLaDA-8B-Instruct's: OLMo-style config fields and weight names."""
    path.mkdir(parents=True)
    save_file({_published_name(k): v.contiguous() for k, v in model.state_dict().items()}, path / "model.safetensors",
              metadata={"format": "pt"})
    fields = LLADA_FIELDS | {"architectures": ["LLaDAModelLM"], "auto_map": {"AutoModel": "modeling_llada.LLaDAModelLM"}}
    (path / "config.json").write_text(json.dumps(fields))
    _tokenizer(path)
    return path


def write_dream(path: Path, model: Qwen2ForCausalLM) -> Path:
    """A directory shaped like Dream-org/Dream-v0-Instruct-7B's: Qwen2's fields and names, model_type Dream."""
    model.save_pretrained(path)
    raw = json.loads((path / "config.json").read_text())
    raw.update(model_type="Dream", architectures=["DreamModel"], auto_map={"AutoModel": "modeling_dream.DreamModel"},
               mask_token_id=MASK, eos_token_id=EOS, pad_token_id=EOS)
    (path / "config.json").write_text(json.dumps(raw))
    _tokenizer(path)
    return path


TARGETS = {"llada": (tiny_llada, write_llada, False), "dream": (tiny_dream, write_dream, True)}


def reference_decode(model, shift: bool, prompt: list[int], config: DecodeConfig, cache: str, at_prompt_end: bool = True) -> list[int]:
    """Draft-free decoding written from the frozen-cache definition, on transformers' own SDAR-free path:
    at block start a full forward over the canvas with a DynamicCache; each later step feeds the live rows
    with a DynamicCache holding the frozen positions' keys and values, under an all-true mask. Blocks start at
    the prompt's end (LLaDA's generate.py), or on the grid from position 0."""
    k, n = config.block_length, len(prompt)
    end = n + config.gen_length
    origin = n if at_prompt_end else 0
    whole = origin + -(-(end - origin) // k) * k
    tokens = torch.full((whole,), MASK)
    tokens[:n] = torch.tensor(prompt)

    def forward(ids, positions, past):
        mask = torch.ones(1, 1, len(ids), len(ids) + (past.get_seq_length() if past is not None else 0), dtype=torch.bool)
        return model.model(input_ids=ids[None], position_ids=positions[None], attention_mask=mask, cache=past,
                           use_cache=past is not None).last_hidden_state[0]

    out = []
    with torch.no_grad():
        for block in range((n - origin) // k, (whole - origin) // k):
            start = origin + block * k
            lo, hi = max(n - start, 0), min(end - start, k)
            length = start + k if cache == "nosuffix" else whole  # the canvas this block sees
            live = torch.arange(0 if cache == "none" else start, start + k if cache in ("dual", "nosuffix") else length)
            step, frozen, before = 0, None, None
            while not finished(tokens[start : start + k], lo, hi, MASK, frozenset({EOS})):
                source = (torch.arange(start, start + k) - int(shift)).clamp(min=0)
                if step == 0 or cache == "none":
                    full = DynamicCache(config=model.config)
                    hidden = forward(tokens[:length], torch.arange(length), full)
                    rows = hidden[source]
                    kept = torch.ones(length, dtype=torch.bool)
                    kept[live] = False
                    frozen = DynamicCache(config=model.config)
                    for i, layer in enumerate(full.layers):
                        frozen.update(layer.keys[:, :, kept], layer.values[:, :, kept], i)
                    before = hidden[start - 1] if start else None
                else:
                    hidden = forward(tokens[live], live, copy.deepcopy(frozen))
                    rows = torch.stack([hidden[s - live[0]] if s >= live[0] else before for s in source.tolist()])
                logits = model.lm_head(rows).float()  # [K, V]
                noise = None
                if config.sampling.temperature:
                    noise = gumbel(step_key(config.seed, 0, block, step), k, VOCAB, torch.device("cpu"))
                tokens[start : start + k], _ = decide(tokens[start : start + k], logits, noise, config, MASK, step)
                step += 1
            out += tokens[start + lo : start + hi].tolist()
            if config.stop_at_eos and EOS in out:
                return out[: out.index(EOS)]
    return out


@pytest.mark.parametrize("name", list(TARGETS))
def test_a_published_style_directory_loads_by_its_model_type(tmp_path, name):
    build, write, shift = TARGETS[name]
    model = build(seed=1)
    path = write(tmp_path / name, model)
    target = from_pretrained(path)
    assert isinstance(target, DualCacheTarget) and target.shift == shift
    assert (target.mask_id, target.eos_ids, target.block_length) == (MASK, frozenset({EOS}), 32)
    loaded = target.model.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in model.state_dict().items())
    prompt, config = list(range(1, 12)), DecodeConfig(gen_length=40)
    in_memory = DualCacheTarget(model, MASK, frozenset({EOS}), 32, shift=shift)
    assert generate(target, prompt, config).token_ids == generate(in_memory, prompt, config).token_ids  # buffers too
    if name == "llada":
        published = set(load_file(path / "model.safetensors"))
        assert {"model.transformer.wte.weight", "model.transformer.ln_f.weight", "model.transformer.ff_out.weight",
                "model.transformer.blocks.1.attn_out.weight", "model.transformer.blocks.1.ff_proj.weight"} <= published


def test_a_directory_without_the_published_weight_names_is_refused(tmp_path):
    path = write_llada(tmp_path / "llada", tiny_llada())
    weights = load_file(path / "model.safetensors")
    save_file({k.replace("attn_out", "o_proj"): v for k, v in weights.items()}, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="lacks 2 weights that a LLaDAForCausalLM needs"):
        from_pretrained(path)


def test_a_tokenizer_without_the_mask_token_is_refused(tmp_path):
    path = write_llada(tmp_path / "llada", tiny_llada())
    vocab = {f"t{i}": i for i in range(VOCAB - 2)} | {"<|endoftext|>": EOS}  # no <|mdm_mask|>
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(path)
    with pytest.raises(ValueError, match=f"the tokenizer in {path} has no token for mask_token_id {MASK}; add the mask token"):
        DualCacheTarget.from_pretrained(path)


@pytest.mark.parametrize("name", list(TARGETS))
@pytest.mark.parametrize("cache", ["dual", "prefix", "none", "nosuffix"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_decoder_equals_a_slow_implementation_of_its_definition(name, cache, temperature):
    build, _, shift = TARGETS[name]
    model = build(seed=2)
    config = DecodeConfig(block_length=8, gen_length=28, sampling=Sampling(temperature), seed=3)
    for prompt in (list(range(1, 12)), list(range(5, 21))):  # a partial and a whole prompt block
        for at_prompt_end in (True, False):
            slow = reference_decode(model, shift, prompt, config, cache, at_prompt_end)
            target = DualCacheTarget(model, MASK, frozenset({EOS}), 8, cache=cache, shift=shift, blocks_at_prompt_end=at_prompt_end)
            assert list(generate(target, prompt, config).token_ids) == slow, (name, cache, prompt, at_prompt_end)
            assert len(slow) == 28


@pytest.mark.parametrize("name", list(TARGETS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_pieces_score_bit_for_bit_as_one_piece_forwards(name, dtype):
    """At block start (beside the canvas forward) and later (against the frozen KV) alike."""
    build, _, shift = TARGETS[name]
    target = DualCacheTarget(build(seed=3, dtype=dtype), MASK, frozenset({EOS}), 16, shift=shift)
    prefix = torch.arange(32) % 60
    states = random_states(21, 16, committed=7, seed=5)
    states[0] = MASK
    for at_start in (True, False):
        for pieces in (2, 9, 21):
            target.start(prefix, 80)
            if not at_start:
                target.verify(states[:1], 32)
            together = target.verify(states[:pieces], 32)
            for r in range(1, pieces):
                target.start(prefix, 80)
                target.verify(states[:1], 32)  # the block-start forward: freezes the same KV
                assert torch.equal(target.verify(states[r : r + 1], 32)[0], together[r]), (at_start, pieces, r)


@pytest.mark.parametrize("name", list(TARGETS))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_drafter_is_lossless_relative_to_the_dual_cache_decoder(name, temperature):
    build, _, shift = TARGETS[name]
    target = DualCacheTarget(build(seed=4), MASK, frozenset({EOS}), 16, shift=shift)
    every_drafter_is_lossless(target, "threshold", temperature)


@pytest.mark.slow
def test_the_training_commands_and_decode_work_on_a_llada_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # budget=auto's profile
    path = write_llada(tmp_path / "llada", tiny_llada(seed=5))
    drafter = training_commands_work(path, tmp_path, capsys)
    # Drafters belong to the decoder they were trained on: the uncached one refuses this one.
    with pytest.raises(SystemExit):
        main(["decode", "--pretrained", str(path), "--cache", "none", "--method", "spot", "--drafter", str(drafter),
              "--budget", "2", "--prompt", "t1", "--gen-length", "32"])
    assert "differs in cache: 'dual' vs 'none'" in capsys.readouterr().err


def test_the_cache_option_belongs_to_bidirectional_targets(tmp_path):
    with pytest.raises(ValueError, match="cache='none' applies to bidirectional targets .* drop the cache option"):
        from_pretrained(write_checkpoint(tmp_path / "sdar"), cache="none")
    target = from_pretrained(write_dream(tmp_path / "dream", tiny_dream()), cache="prefix")
    assert target.cache == "prefix"
    # a frozen canvas is re-read at every block's start, so no block can ride behind the one before it
    with pytest.raises(ValueError, match="cross_block needs a target whose completed blocks never change"):
        generate(target, [1, 2, 3], DecodeConfig(block_length=target.block_length, gen_length=8, cross_block=True))


@pytest.mark.slow
def test_lm_eval_runs_a_llada_directory(tmp_path, capsys):
    lm_eval_runs_losslessly(capsys, write_llada(tmp_path / "llada", tiny_llada(seed=6)), tmp_path)


@pytest.mark.parametrize("name", ["sdar", *TARGETS])
def test_a_verify_leaves_the_lm_heads_inputs_and_the_embeddings_are_the_models(name):
    """What SPOT-Sets' drafter reads: the pieces' final hidden states, at no extra forward, and the token embeddings."""
    if name == "sdar":
        target = tiny_target(16)
    else:
        build, _, shift = TARGETS[name]
        target = DualCacheTarget(build(seed=7), MASK, frozenset({EOS}), 16, shift=shift)
    states = random_states(3, 16, committed=5, seed=1)
    target.start(torch.arange(16) % 50, 48)
    for _ in range(2):  # the block-start forward (the prefix riding along), then a later one
        logits = target.verify(states, 16)
        forwards = target.forwards
        assert target.hidden.shape == (3, 16, target.model.config.hidden_size)
        with torch.inference_mode():
            assert torch.allclose(target.model.lm_head(target.hidden).float(), logits, atol=1e-5)
        assert target.forwards == forwards
    assert target.embeddings() is target.model.get_input_embeddings().weight
