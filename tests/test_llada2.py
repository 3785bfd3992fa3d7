"""LLaDA2.0 (`llada2_moe`): the native model's published weight names and routing rule, a checkpoint
directory shaped like the published one (no mask, EOS or block size in config.json), exact pieces in
fp32 and bf16, and every drafter lossless under LLaDA2.0's own commit rule."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from test_lm import lm_eval_runs_losslessly
from test_sdar_target import random_states
from test_spiffy import calibrated
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from spot import DecodeConfig, Sampling, generate
from spot.config import SCHEDULED
from spot.drafters import AdversarialDrafter, OracleDrafter, RandomDrafter
from spot.drafters.freedave import FreeDaveDrafter
from spot.drafters.order_model import OrderModel
from spot.drafters.spiffy import SpiffyDrafter
from spot.drafters.spot import SpotDrafter
from spot.targets.block_causal import BlockCausalTarget
from spot.targets.checkpoint import read_checkpoint
from spot.targets.llada2 import LLaDA2Config, LLaDA2ForCausalLM, LLaDA2Gate
from spot_eval.checkpoints.drafter import load_checkpoint
from spot_eval.checkpoints.fingerprint import check_fingerprint, target_fingerprint
from spot_eval.checkpoints.target import load_target
from spot_eval.cli import main

VOCAB, MASK, EOS = 64, 63, 62


def tiny_llada2(seed: int = 0, dtype: torch.dtype = torch.float32) -> LLaDA2ForCausalLM:
    """Two layers (the first dense, as LLaDA2.0's), 8 experts in 4 groups, 2 a token plus a shared one,
    half of each head rotary; a wide initialisation and a scaled head for peaked distributions."""
    torch.manual_seed(seed)
    config = LLaDA2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=8, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2,
                          n_group=4, topk_group=2, max_position_embeddings=512, initializer_range=0.3)
    model = LLaDA2ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)
        for layer in model.model.layers[config.first_k_dense_replace:]:
            layer.mlp.gate.expert_bias.normal_(0.0, 0.1)  # a trained router's bias, so that it takes part
    return model.to(dtype)


def write_llada2(path: Path, model: LLaDA2ForCausalLM) -> Path:
    """A directory shaped like inclusionAI/LLaDA2.0-mini's: config.json without mask, EOS or block size;
    the tokenizer's special tokens <|mask|> and <|endoftext|> name them."""
    model.save_pretrained(path)
    raw = json.loads((path / "config.json").read_text())
    raw.update(architectures=["LLaDA2MoeModelLM"], auto_map={"AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig"})
    for field in ("mask_token_id", "eos_token_id", "block_size"):
        raw.pop(field, None)
    (path / "config.json").write_text(json.dumps(raw))
    vocab = {f"t{i}": i for i in range(VOCAB - 2)} | {"<|endoftext|>": EOS, "<|mask|>": MASK}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", mask_token="<|mask|>").save_pretrained(path)
    return path


def test_the_module_names_are_the_published_weight_names():
    model = tiny_llada2()
    c = model.config
    names = {"model.word_embeddings.weight", "model.norm.weight", "lm_head.weight"}
    for n in range(c.num_hidden_layers):
        layer = f"model.layers.{n}"
        names |= {f"{layer}.{m}.weight" for m in ("input_layernorm", "post_attention_layernorm", "attention.query_key_value",
                                                  "attention.query_layernorm", "attention.key_layernorm", "attention.dense")}
        projections = ("gate_proj", "up_proj", "down_proj")
        if n < c.first_k_dense_replace:
            names |= {f"{layer}.mlp.{p}.weight" for p in projections}
        else:
            names |= {f"{layer}.mlp.gate.weight", f"{layer}.mlp.gate.expert_bias"}
            names |= {f"{layer}.mlp.shared_experts.{p}.weight" for p in projections}
            names |= {f"{layer}.mlp.experts.{e}.{p}.weight" for e in range(c.num_experts) for p in projections}
    assert set(model.state_dict()) == names
    qkv = model.model.layers[0].attention.query_key_value.weight
    assert qkv.shape == ((c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim, c.hidden_size)


def test_the_router_picks_groups_by_their_two_best_biased_scores_and_weighs_by_the_unbiased_ones():
    config = LLaDA2Config(hidden_size=2, num_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2, routed_scaling_factor=2.5)
    gate = LLaDA2Gate(config)
    logits = torch.tensor([2.0, -3.0, 0.5, 0.4, -1.0, -1.0, 1.0, -2.0])  # groups {0, 1} {2, 3} {4, 5} {6, 7}
    with torch.no_grad():
        gate.weight.copy_(torch.stack([logits, torch.zeros(8)], dim=1))
        gate.expert_bias.copy_(torch.tensor([0.0, 0.0, 0.0, 0.0, 0.9, 0.0, 0.0, 0.0]))
    routing = gate(torch.tensor([[1.0, 0.0]]))
    s = torch.sigmoid(logits)
    # Group scores with the bias: 0.93, 1.22, 1.44, 0.85: groups 1 and 2. The best biased experts there: 4
    # (0.27 + 0.9), then 2 (0.62); expert 0 (0.88, the best unbiased) sits in a group left out. The weights
    # are the unbiased scores of 4 and 2.
    assert routing.experts.tolist() == [[4, 2]]
    expected = torch.stack([s[4], s[2]]) / (s[4] + s[2]) * 2.5
    assert torch.allclose(routing.weights[0], expected)


def test_a_published_style_directory_loads_with_its_ids_from_the_tokenizer(tmp_path):
    model = tiny_llada2(seed=1)
    path = write_llada2(tmp_path / "llada2", model)
    info = read_checkpoint(path).info
    assert (info.mask_id, info.eos_ids, info.block_size) == (MASK, frozenset({EOS}), 32)
    target = BlockCausalTarget.from_pretrained(path)
    assert isinstance(target.model, LLaDA2ForCausalLM) and target.block_length == 32
    # verify's logits are the model's own under LLaDA2.0's block-causal mask (blocks from position 0)
    ids = torch.randint(0, VOCAB - 2, (64,))
    block = torch.arange(64) // 32
    with torch.no_grad():
        full = model(ids[None], torch.arange(64)[None], attention_mask=(block[None, :] <= block[:, None])[None, None])[0]
    target.start(ids[:32])
    assert torch.allclose(target.verify(ids[None, 32:], 32)[0], full[32:], atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_pieces_score_bit_for_bit_as_one_piece_forwards_in_the_exact_layout(dtype):
    target = BlockCausalTarget(tiny_llada2(seed=2, dtype=dtype), MASK, frozenset({EOS}), 16, exact=True)
    prefix = torch.arange(32) % 60
    states = random_states(21, 16, committed=7, seed=5)
    for riding in (True, False):
        for pieces in (2, 9, 21):
            target.start(prefix)
            if not riding:
                target.verify(states[:1], 32)
            together = target.verify(states[:pieces], 32)
            for r in range(pieces):
                target.start(prefix)
                if not riding:
                    target.verify(states[:1], 32)
                assert torch.equal(target.verify(states[r : r + 1], 32)[0], together[r]), (riding, pieces, r)


def test_the_logits_dtype_is_the_models_without_an_output_embedding_accessor():
    """confidence_dtype=model computes in Target.logits_dtype; a model whose get_output_embeddings finds no head (a
    plugin's, or a remote-code one) has the target read the model's parameters' dtype."""
    model = tiny_llada2(seed=1, dtype=torch.bfloat16)
    model.get_output_embeddings = lambda: None
    assert BlockCausalTarget(model, MASK, frozenset({EOS}), 16).logits_dtype == torch.bfloat16


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_drafter_is_lossless_under_llada2s_commit_rule(temperature):
    """LLaDA2.0's generate: commit every masked position whose confidence is above the threshold when
    at least the scheduled count are, else the scheduled count by confidence (policy `dynamic`)."""
    target = BlockCausalTarget(tiny_llada2(seed=3), MASK, frozenset({EOS}), 16, exact=True)
    every_drafter_is_lossless(target, "dynamic", temperature)


def every_drafter_is_lossless(target, policy: str, temperature: float) -> None:
    """Under `policy` (threshold 0.5; 16 steps a block for a scheduled one) and `single`: the oracle, adversarial,
    random and an untrained SPOT drafter (Spiffy too under single), budgets 1 and 8, token-identical to
    draft-free; the oracle never needs more forwards."""
    prompt = list(range(1, 12))
    steps = 16 if policy in SCHEDULED else None
    for config in (DecodeConfig(policy=policy, threshold=0.5, steps=steps, block_length=16, gen_length=40,
                                sampling=Sampling(temperature), seed=4),
                   DecodeConfig(block_length=16, gen_length=40, sampling=Sampling(temperature), seed=4)):
        reference = generate(target, prompt, config, record=True)
        torch.manual_seed(0)
        drafters = [OracleDrafter(reference.trajectory), AdversarialDrafter(reference.trajectory, VOCAB),
                    RandomDrafter(VOCAB, seed=2), SpotDrafter(OrderModel(), gate=0.9), FreeDaveDrafter()]
        if config.policy == "single":
            graph = calibrated(target, 16, "single")
            drafters += [SpiffyDrafter(graph, prune_to=3), SpiffyDrafter(graph, prune_to=3, order="calibration")]
        for drafter in drafters:
            for budget in (1, 8):
                got = generate(target, prompt, replace(config, budget=budget), drafter=drafter)
                assert got.token_ids == reference.token_ids, (config.policy, drafter.name, budget)
                assert got.stats.forwards <= reference.stats.forwards or drafter.name != "oracle"


def training_commands_work(path: Path, tmp_path: Path, capsys) -> Path:
    """collect, train-drafter, calibrate-reach and spiffy-calibrate on the target in `path`; the drafters
    carry its fingerprint and decode token-identically to draft-free through `spot-eval decode` (SPOT at
    budget auto, Spiffy at 3). Returns the SPOT drafter."""
    out, drafter, graph = tmp_path / "traj", tmp_path / "spot.pt", tmp_path / "spiffy.json"
    main(["collect", "--target", str(path), "--out", str(out), "--prompts", "3", "--gen-length", "64", "--no-chat",
          "--shard-size", "2", "--temperatures", "0,1"])
    assert json.loads(capsys.readouterr().out)["decoded"] == 3
    main(["train-drafter", "--trajectories", str(out), "--out", str(drafter), "--steps", "3", "--batch-size", "32",
          "--heldout", "0.34"])
    capsys.readouterr()
    check_fingerprint(load_checkpoint(drafter).fingerprint, target_fingerprint(load_target(path, None), "single"))
    main(["calibrate-reach", "--drafter", str(drafter), "--trajectories", str(out), "--budget", "4", "--all-blocks"])
    assert json.loads(capsys.readouterr().out)["stale"]["trees"] > 0
    main(["spiffy-calibrate", "--target", str(path), "--out", str(graph), "--prompts", "2", "--gen-length", "64", "--no-chat"])
    capsys.readouterr()
    decoded = {}
    for method, extra in (("draft_free", []), ("spot", ["--drafter", str(drafter), "--budget", "auto"]),
                          ("spiffy", ["--drafter", str(graph), "--budget", "3"])):
        main(["decode", "--pretrained", str(path), "--method", method, *extra, "--prompt", "t1 t2 t3", "--gen-length", "64",
              "--json", "--threads", "1"])
        decoded[method] = json.loads(capsys.readouterr().out)["token_ids"]
    assert decoded["spot"] == decoded["draft_free"] == decoded["spiffy"] and len(decoded["draft_free"]) == 64
    return drafter


@pytest.mark.slow
def test_the_training_commands_and_decode_work_on_a_llada2_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # budget=auto's profile
    training_commands_work(write_llada2(tmp_path / "llada2", tiny_llada2(seed=4)), tmp_path, capsys)


@pytest.mark.slow
def test_lm_eval_runs_a_llada2_directory(tmp_path, capsys):
    lm_eval_runs_losslessly(capsys, write_llada2(tmp_path / "llada2", tiny_llada2(seed=6)), tmp_path)
