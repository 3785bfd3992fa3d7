"""The embedded target's training code and the shipped checkpoint.

The training forward must see exactly what the decoder will show the model (block-causal, no
prompt masks), one seed must give one set of weights, and the shipped directory must load offline.
"""

from __future__ import annotations

import json
import random
import re
import warnings
from dataclasses import dataclass, replace

import torch
from conftest import MASK_ID, tiny_qwen3
from transformers import AutoTokenizer

from spot import DecodeConfig, generate
from spot.targets import BlockCausalTarget, read_checkpoint
from spot_eval.checkpoints.shipped import EMBEDDED_TARGET
from spot_eval.checkpoints.target import encode_prompt
from spot_eval.data.datasets import load
from spot_eval.training.train_target import (
    SPECIAL_TOKENS,
    Example,
    ModelSize,
    TrainConfig,
    block_diffusion_mask,
    diffusion_loss,
    make_batch,
    mask_answers,
    train,
)


@dataclass(frozen=True)
class ToyPair:
    source: str
    prompt: str
    answer: str


def toy_pairs(n: int = 60) -> list[ToyPair]:
    rng = random.Random(0)
    pairs = []
    for _ in range(n):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        pairs.append(ToyPair("toy", f"What is {a} plus {b}?", f"{a} + {b} = {a + b}\n#### {a + b}"))
    return pairs


TINY = TrainConfig(
    seed=3,
    steps=3,
    batch_tokens=256,
    max_tokens=64,
    vocab_size=300,
    heldout_fraction=0.1,
    eval_every=2,
    log_every=1,
    model=ModelSize(hidden=32, layers=2, heads=2, kv_heads=1, head_dim=16, intermediate=64),
)


def test_training_mask_is_bd3lm_2l_layout():
    """L = 4, block 2: rows/columns 0-3 are x_t, 4-7 are x_0."""
    expected = torch.tensor(
        [
            [1, 1, 0, 0, 0, 0, 0, 0],  # x_t block 0: its own block only
            [1, 1, 0, 0, 0, 0, 0, 0],
            [0, 0, 1, 1, 1, 1, 0, 0],  # x_t block 1: its own block and clean block 0
            [0, 0, 1, 1, 1, 1, 0, 0],
            [0, 0, 0, 0, 1, 1, 0, 0],  # x_0 block 0: clean blocks <= 0
            [0, 0, 0, 0, 1, 1, 0, 0],
            [0, 0, 0, 0, 1, 1, 1, 1],  # x_0 block 1: clean blocks <= 1
            [0, 0, 0, 0, 1, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(block_diffusion_mask(4, 2), expected)


def test_masking_touches_answer_positions_only():
    sizes = [(5, 3), (23, 17), (40, 1), (16, 16)]  # (tokens, prompt tokens)
    examples = [Example(ids=tuple(range(10, 10 + n)), n_prompt=p) for n, p in sizes]
    batch = make_batch(examples, block=8)
    assert batch.n_real.tolist() == [8, 24, 40, 16]  # EOS-filled to whole blocks
    assert batch.x0[0, 5:].tolist() == [SPECIAL_TOKENS.index("<|endoftext|>")] * 35
    pos = torch.arange(batch.x0.shape[1])[None]
    answer = (pos >= batch.n_prompt[:, None]) & (pos < batch.n_real[:, None])
    ever = torch.zeros_like(answer)
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        xt, masked = mask_answers(batch, 8, generator)
        assert not (masked & ~answer).any(), "a prompt or batch-padding position was masked"
        assert torch.equal(xt, torch.where(masked, SPECIAL_TOKENS.index("<|MASK|>"), batch.x0))
        ever |= masked
    assert torch.equal(ever, answer)


def test_training_forward_matches_the_decoder():
    """The x_t logits of the 2L forward equal BlockCausalTarget.verify's logits for the same block state."""
    k = 8
    model = tiny_qwen3(seed=1)
    x0 = torch.randint(0, MASK_ID, (1, 3 * k), generator=torch.Generator().manual_seed(0))
    xt = x0.clone()
    xt[0, 2 * k + 1 : 2 * k + 6] = MASK_ID
    length = x0.shape[1]
    with torch.no_grad():
        hidden = model.model(
            input_ids=torch.cat([xt, x0], dim=1),
            position_ids=torch.arange(length).repeat(2)[None],
            attention_mask=block_diffusion_mask(length, k)[None, None],
            use_cache=False,
        ).last_hidden_state
        trained = model.lm_head(hidden[0, 2 * k : 3 * k])  # [K, V]
    target = BlockCausalTarget(model, mask_id=MASK_ID, eos_ids=frozenset({62}), block_length=k)
    target.start(x0[0, : 2 * k])
    decoded = target.verify(xt[0, 2 * k :][None], 2 * k)[0]
    torch.testing.assert_close(trained, decoded, atol=1e-5, rtol=1e-5)
    masked = xt == MASK_ID
    loss, count = diffusion_loss(model, x0, xt, masked, k)
    assert count == 5 and torch.isfinite(loss)


def test_tiny_training_run_is_deterministic_and_decodes(tmp_path):
    logs = [train(TINY, toy_pairs(), tmp_path / name) for name in ("a", "b")]
    assert logs[0]["curve"] == logs[1]["curve"]
    weights = [BlockCausalTarget.from_pretrained(tmp_path / name).model.state_dict() for name in ("a", "b")]
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])

    assert json.loads((tmp_path / "a" / "training_log.json").read_text())["steps"] == TINY.steps
    target = BlockCausalTarget.from_pretrained(tmp_path / "a")
    prompt = target.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 3 plus 4?"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt == "<|im_start|>user\nWhat is 3 plus 4?<|im_end|>\n<|im_start|>assistant\n"
    ids = target.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    result = generate(target, ids, DecodeConfig(gen_length=40), decode=target.tokenizer.decode)
    assert result.finish_reason in ("eos", "length") and isinstance(result.text, str)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # block 16 differs from the declared block_size 32, by design
        target16 = BlockCausalTarget.from_pretrained(tmp_path / "a", block_length=16)
    assert generate(target16, ids, DecodeConfig(block_length=16, gen_length=20)).stats.forwards >= 1


def test_time_cap_stops_early_and_says_so(tmp_path):
    log = train(replace(TINY, minutes=0.0), toy_pairs(), tmp_path)
    assert log["steps"] == 1 and log["stopped_early"] and len(log["curve"]) == 1
    assert (tmp_path / "model.safetensors").is_file()


def test_shipped_target_loads_offline():
    info = read_checkpoint(EMBEDDED_TARGET).info
    raw = json.loads((EMBEDDED_TARGET / "config.json").read_text())
    assert raw["model_type"] == "qwen3" and raw["block_size"] == 32 == info.block_size
    assert info.mask_id == raw["mask_token_id"] == SPECIAL_TOKENS.index("<|MASK|>")
    assert info.eos_ids == {SPECIAL_TOKENS.index("<|im_end|>"), SPECIAL_TOKENS.index("<|endoftext|>")}
    size = sum(f.stat().st_size for f in EMBEDDED_TARGET.rglob("*") if f.is_file())
    assert size <= 30 * 2**20, f"the shipped target is {size / 2**20:.1f} MiB"

    tokenizer = AutoTokenizer.from_pretrained(EMBEDDED_TARGET)
    assert tokenizer.convert_ids_to_tokens(info.mask_id) == "<|MASK|>"
    chat = [{"role": "user", "content": "2+2?"}]
    text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"

    target = BlockCausalTarget.from_pretrained(EMBEDDED_TARGET)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    result = generate(target, ids, DecodeConfig(block_length=32, gen_length=32), decode=tokenizer.decode)
    assert result.stats.forwards >= 1 and isinstance(result.text, str)


def test_shipped_target_answers_in_the_shape_of_its_training_data():
    """GSM8K answers of the training set carry `<<a*b=c>>` calculator annotations; the drafters learn
    the commit orders of such answers, so a retrained target must keep writing them."""
    target = BlockCausalTarget.from_pretrained(EMBEDDED_TARGET)
    tokenizer = target.tokenizer
    texts = []
    for row in load("gsm8k_test")[:3]:
        ids = encode_prompt(target, row["question"], chat=True)
        texts.append(generate(target, ids, DecodeConfig(block_length=32, gen_length=64), decode=tokenizer.decode).text)
    assert sum(bool(re.search(r"<<[^>]*=[^>]*>>", t)) for t in texts) >= 2, texts
