"""The SDAR-style adapter: exact piece logits, the cache, real SDAR configs, and bad checkpoints."""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import transformers
from conftest import EOS_ID, MASK_ID, tiny_qwen3, tiny_qwen3_moe, tiny_target, write_checkpoint
from safetensors import safe_open
from test_spiffy import calibrated
from transformers import Qwen3ForCausalLM, Qwen3MoeForCausalLM
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from spot import DecodeConfig, Sampling, generate
from spot.drafters import AdversarialDrafter, OracleDrafter, RandomDrafter
from spot.drafters.order_model import OrderModel
from spot.drafters.spiffy import SpiffyDrafter
from spot.drafters.spot import SpotDrafter
from spot.targets.block_causal import BlockCausalTarget
from spot.targets.checkpoint import read_checkpoint
from spot.targets.sdar import sdar_rms_norm, use_sdar_norms
from spot_eval.checkpoints.target import load_target, resolve_checkpoint, target_id

FIXTURES = Path(__file__).parent / "fixtures"


def random_states(n: int, k: int, committed: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    states = torch.randint(0, 60, (n, k), generator=g)
    states[:, committed:] = MASK_ID
    return states


@pytest.mark.parametrize("n_pieces", [1, 9, 21])
@pytest.mark.parametrize("cached", [False, True])
def test_piece_logits_equal_a_forward_of_that_single_state(n_pieces, cached):
    """Exact in fp32 on CPU; the message reports the max difference if a kernel breaks it."""
    target = tiny_target(16)
    prefix = torch.arange(32) % 60
    states = random_states(n_pieces, 16, committed=6)

    def fresh() -> None:
        target.start(prefix)
        if cached:  # build the cache first, so the pieces attend to cached (not pending) KV
            target.verify(states[:1], 32)

    fresh()
    together = target.verify(states, 32)  # [P, K, V]
    for r in range(n_pieces):
        fresh()
        alone = target.verify(states[r : r + 1], 32)[0]
        diff = (alone - together[r]).abs().max().item()
        assert diff == 0.0, f"piece {r} of {n_pieces}: max |logit difference| {diff:.3e}"


def block_causal_logits(model: Qwen3ForCausalLM, tokens: torch.Tensor, k: int) -> torch.Tensor:
    """SDAR's own definition, written independently: one forward over the whole sequence with
    tril(ones(nb, nb)) repeat-interleaved by the block length. Returns [L, V]."""
    n = tokens.numel()
    blocks = torch.arange(n) // k
    mask = (blocks[None, :] <= blocks[:, None])[None, None]
    return model(input_ids=tokens[None], attention_mask=mask, position_ids=torch.arange(n)[None]).logits[0]


def test_verify_matches_the_block_causal_full_forward():
    target = tiny_target(16)
    prefix = torch.arange(48) % 60
    state = random_states(1, 16, committed=4, seed=3)[0]
    target.start(prefix[:32])
    target.verify(state[None], 32)  # cache: blocks 0-1
    target.commit(prefix[32:48])  # pending: block 2 rides along with the next forward
    got = target.verify(state[None], 48)[0]
    with torch.no_grad():
        want = block_causal_logits(target.model, torch.cat([prefix, state]), 16)[48:]
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_pieces_never_stay_in_the_cache():
    target = tiny_target(16)
    target.start(torch.arange(16))
    target.verify(random_states(5, 16, 3), 16)
    assert target._stream.cache.get_seq_length() == 16
    target.commit(torch.arange(16))
    target.verify(random_states(3, 16, 3), 32)
    assert target._stream.cache.get_seq_length() == 32
    with pytest.raises(RuntimeError, match="active block starts at 16 but the cache and pending blocks end at 32"):
        target.verify(random_states(1, 16, 3), 16)


@pytest.mark.parametrize("name", ["sdar-8b-chat", "sdar-4b-chat"])
def test_real_sdar_configs_map_onto_qwen3(name, tmp_path):
    shutil.copytree(FIXTURES / name, tmp_path / name)
    parsed = read_checkpoint(tmp_path / name)
    config, info = parsed.config, parsed.info
    raw = json.loads((FIXTURES / name / "config.json").read_text())
    assert info.mask_id == 151669 and info.block_size == raw["block_size"]
    assert info.eos_ids == {151645, 151643}  # generation_config's <|im_end|> and <|endoftext|>
    for field in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                  "intermediate_size", "rope_theta", "rms_norm_eps", "vocab_size", "tie_word_embeddings"):
        value = getattr(config, field, None)
        if field == "rope_theta" and value is None:
            value = config.rope_parameters["rope_theta"]
        assert value == raw[field], field
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    index = json.loads((FIXTURES / name / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(index) == set(model.state_dict())


def test_a_local_sdar_style_directory_loads_and_decodes(tmp_path):
    path = write_checkpoint(tmp_path / "ckpt")
    target = BlockCausalTarget.from_pretrained(path)
    assert (target.mask_id, target.block_length, target.eos_ids) == (MASK_ID, 16, {EOS_ID})
    reference = tiny_qwen3()
    ids = torch.arange(20)[None]
    with torch.no_grad():
        assert torch.equal(target.model(input_ids=ids).logits, reference(input_ids=ids).logits)


def test_an_sdar_model_type_directory_loads_without_remote_code(tmp_path):
    path = write_checkpoint(tmp_path / "ckpt", {"model_type": "sdar", "architectures": ["SDARForCausalLM"],
                                                "auto_map": {"AutoConfig": "configuration_sdar.SDARConfig"}})
    assert BlockCausalTarget.from_pretrained(path).block_length == 16


def test_a_directory_without_mask_token_id_is_refused(tmp_path):
    path = write_checkpoint(tmp_path / "ckpt", {"mask_token_id": None})
    with pytest.raises(ValueError, match="has no 'mask_token_id'.*Add mask_token_id to config.json"):
        BlockCausalTarget.from_pretrained(path)


def test_a_tokenizer_without_the_mask_token_is_refused(tmp_path):
    path = write_checkpoint(tmp_path / "ckpt", tokenizer_vocab=MASK_ID)  # ids 0..62: no token 63
    with pytest.raises(ValueError, match="has no token for mask_token_id 63"):
        BlockCausalTarget.from_pretrained(path)


def test_a_block_length_that_disagrees_with_the_checkpoint_warns(tmp_path):
    path = write_checkpoint(tmp_path / "ckpt")
    with pytest.warns(UserWarning, match="decode block length 32 differs from the checkpoint's block_size 16"):
        target = BlockCausalTarget.from_pretrained(path, block_length=32)
    assert target.block_length == 32
    with pytest.raises(ValueError, match="block_length must be >= 1"):
        BlockCausalTarget.from_pretrained(path, block_length=0)


def test_a_missing_directory_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        BlockCausalTarget.from_pretrained(tmp_path / "nowhere")


# ---- SDAR as users run it: the MoE models, SDAR's numerics, no spurious warnings, hub ids ----


@pytest.mark.parametrize("exact", [False, True], ids=["packed", "exact"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_an_sdar_moe_checkpoint_loads_into_qwen3_moe_and_every_drafter_is_lossless(tmp_path, temperature, exact):
    reference_model = tiny_qwen3_moe(seed=3)
    path = write_checkpoint(tmp_path / "moe", {"model_type": "sdar_moe", "architectures": ["SDARMoeForCausalLM"],
                                               "auto_map": {"AutoConfig": "configuration_sdar_moe.SDARMoeConfig"}},
                            model=reference_model)
    with safe_open(path / "model.safetensors", "pt") as f:  # the per-expert names SDAR-30B-A3B ships
        names = set(f.keys())
    assert {"model.layers.0.mlp.gate.weight", "model.layers.1.mlp.experts.7.down_proj.weight"} <= names
    target = BlockCausalTarget.from_pretrained(path, exact=exact)
    assert isinstance(target.model, Qwen3MoeForCausalLM)
    ids = torch.arange(20)[None]
    with torch.no_grad():
        got, want = target.model(input_ids=ids).logits, reference_model(input_ids=ids).logits
    # The exact layout runs experts in fixed chunks (spot.targets.rows): other matmul shapes, the same numbers to rounding.
    assert torch.allclose(got, want, atol=1e-5, rtol=0) if exact else torch.equal(got, want)
    config = DecodeConfig(block_length=16, gen_length=40, sampling=Sampling(temperature), seed=4)
    prompt = list(range(1, 12))
    reference = generate(target, prompt, config, record=True)
    torch.manual_seed(0)
    graph = calibrated(target, 16, "single")
    drafters = [OracleDrafter(reference.trajectory), AdversarialDrafter(reference.trajectory, target.vocab_size),
                RandomDrafter(target.vocab_size, seed=2), SpotDrafter(OrderModel(), gate=0.9), SpiffyDrafter(graph, prune_to=3)]
    for drafter in drafters:
        for budget in (1, 8):
            got = generate(target, prompt, replace(config, budget=budget), drafter=drafter)
            assert got.token_ids == reference.token_ids, (drafter.name, budget)


def test_sdar_rmsnorm_multiplies_the_weight_in_fp32_and_rounds_once():
    """flash-attn's rms_norm_fn: x * rstd * w in fp32, stored in the input dtype. transformers' Qwen3RMSNorm
    rounds x * rstd to bf16 first: equal in fp32, apart by a rounding in bf16."""
    g = torch.Generator().manual_seed(0)
    x, weight = torch.randn(64, 128, generator=g), 1 + torch.randn(128, generator=g) / 3
    ours, theirs = Qwen3RMSNorm(128, eps=1e-6), Qwen3RMSNorm(128, eps=1e-6)
    ours.weight.data.copy_(weight)
    theirs.weight.data.copy_(weight)
    use_sdar_norms(ours)
    assert torch.equal(ours(x), theirs(x))  # fp32
    xb, wb = x.bfloat16(), weight.bfloat16()
    ours.weight, theirs.weight = torch.nn.Parameter(wb), torch.nn.Parameter(wb)
    normalised = xb.float() * torch.rsqrt(xb.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    assert torch.equal(ours(xb), (normalised * wb.float()).bfloat16())  # one rounding
    assert not torch.equal(ours(xb), theirs(xb))  # two roundings differ somewhere


def test_every_norm_of_a_loaded_target_is_sdars(tmp_path):
    target = BlockCausalTarget.from_pretrained(write_checkpoint(tmp_path / "ckpt"))
    norms = [m for m in target.model.modules() if "RMSNorm" in type(m).__name__]
    assert norms and all(m.forward.__func__ is sdar_rms_norm for m in norms)
    assert len(norms) == 2 * 2 + 2 * 2 + 1  # per layer: input, post-attention, q and k; and the final norm


def test_an_sdar_directory_loads_without_transformers_warnings(tmp_path, caplog):
    raw = json.loads((FIXTURES / "sdar-8b-chat" / "config.json").read_text())
    shapes = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size", "vocab_size", "max_position_embeddings", "mask_token_id", "eos_token_id",
              "bos_token_id", "block_size", "tie_word_embeddings")
    path = write_checkpoint(tmp_path / "sdar", {k: v for k, v in raw.items() if k not in shapes})
    transformers.logging.enable_propagation()
    try:
        with caplog.at_level(logging.WARNING, logger="transformers"), warnings.catch_warnings():
            warnings.simplefilter("error")
            BlockCausalTarget.from_pretrained(path)
    finally:
        transformers.logging.disable_propagation()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_an_unknown_model_type_is_refused_listing_the_supported_ones(tmp_path):
    path = write_checkpoint(tmp_path / "ckpt", {"model_type": "mamba"})
    with pytest.raises(ValueError, match="declares model_type .mamba., which spot-eval does not load; supported: sdar, qwen3, sdar_moe, qwen3_moe, llada2_moe, llada, Dream"):
        BlockCausalTarget.from_pretrained(path)


def hub_cache(home: Path, repo: str, source: Path) -> str:
    """`source` placed in a Hugging Face cache under HF_HOME=home as hub id `repo` (main -> one snapshot)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = home / "hub" / f"models--{repo.replace('/', '--')}"
    shutil.copytree(source, root / "snapshots" / commit)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    return repo


def test_a_hub_id_resolves_offline_from_the_cache_and_an_uncached_one_names_the_fetch(tmp_path, monkeypatch):
    from huggingface_hub import constants

    repo = hub_cache(tmp_path / "hf", "JetLM/SDAR-tiny-b16", write_checkpoint(tmp_path / "src"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    path = resolve_checkpoint(repo)
    assert path.is_dir() and (path / "config.json").is_file()
    target = load_target(path, None)
    assert (target.block_length, target.mask_id) == (16, MASK_ID)
    assert target_id(repo, path).startswith("JetLM/SDAR-tiny-b16@")
    with pytest.raises(FileNotFoundError) as err:
        resolve_checkpoint("JetLM/SDAR-8B-Chat-b32", revision="v1")
    message = str(err.value)
    assert "pretrained=JetLM/SDAR-8B-Chat-b32 at revision v1 is not in the Hugging Face cache" in message
    assert "HF_HUB_OFFLINE=1" in message and message.endswith("hf download JetLM/SDAR-8B-Chat-b32 --revision v1")
    with pytest.raises(FileNotFoundError, match="is not a directory, nor a hub id"):
        resolve_checkpoint("no/such/thing")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_moe_pieces_score_bit_for_bit_as_one_piece_forwards_in_the_exact_layout(dtype):
    """How many tokens each expert gets depends on the other pieces; the exact layout runs every expert on
    its group in fixed chunks (spot.targets.rows), so a piece's logits do not depend on them."""
    target = BlockCausalTarget(tiny_qwen3_moe(seed=3).to(dtype), MASK_ID, frozenset(), 16, exact=True)
    prefix = torch.arange(32) % 60
    states = random_states(21, 16, committed=7, seed=5)
    for pieces in (2, 9, 21):
        target.start(prefix)
        target.verify(states[:1], 32)
        together = target.verify(states[:pieces], 32)
        for r in range(pieces):
            assert torch.equal(target.verify(states[r : r + 1], 32)[0], together[r]), (pieces, r)
