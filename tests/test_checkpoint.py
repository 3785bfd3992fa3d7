"""One parse of a checkpoint directory (spot.targets.checkpoint.read_checkpoint) serves the whole load, and every
target family gets the same load-time checks: the tokenizer must hold the mask token, and a decode block length
the checkpoint was not trained with is reported."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import MASK_ID, tiny_qwen3_moe, write_checkpoint
from test_dual_cache import tiny_dream, tiny_llada, write_dream, write_llada
from test_llada2 import tiny_llada2, write_llada2
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import spot.targets.checkpoint
from spot.targets import BlockCausalTarget, DualCacheTarget, from_pretrained, read_checkpoint
from spot_eval.checkpoints.target import load_target
from spot_eval.harness.lm import SpotLM

FAMILIES = {
    "sdar": lambda path: write_checkpoint(path, {"model_type": "sdar"}),
    "sdar_moe": lambda path: write_checkpoint(path, {"model_type": "sdar_moe"}, model=tiny_qwen3_moe()),
    "llada2_moe": lambda path: write_llada2(path, tiny_llada2()),
    "llada": lambda path: write_llada(path, tiny_llada()),
    "Dream": lambda path: write_dream(path, tiny_dream()),
}


@pytest.fixture
def parses(monkeypatch) -> list[str]:
    """The directories read_checkpoint parses, wherever it was imported (every module holding the function)."""
    calls: list[str] = []
    original = spot.targets.checkpoint.read_checkpoint

    def counted(path):
        calls.append(str(path))
        return original(path)

    for module in list(sys.modules.values()):
        if getattr(module, "read_checkpoint", None) is original:
            monkeypatch.setattr(module, "read_checkpoint", counted)
    return calls


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_load_parses_the_checkpoint_once(tmp_path, family, parses):
    path = FAMILIES[family](tmp_path / family)
    parses.clear()
    target = from_pretrained(path)
    assert parses == [str(path)]
    parses.clear()
    assert load_target(path, None).block_length == target.block_length
    assert parses == [str(path)]
    parses.clear()
    assert load_target(read_checkpoint(path), None).mask_id == target.mask_id  # the call here parses; the load does not
    assert parses == [str(path)]


def test_lm_evals_model_parses_the_checkpoint_once(tmp_path, parses, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_checkpoint(tmp_path / "ckpt")
    parses.clear()
    SpotLM(pretrained=str(path), methods="", budgets="", gen_length=32, device="cpu", mlflow_tracking_uri=None)
    assert parses == [str(path)]


def _without_mask_token(path: Path) -> None:
    """Replace the directory's tokenizer with one that has every other token but the mask token; config.json keeps
    naming the mask id (LLaDA2.0's config.json names none, so it is added)."""
    raw = json.loads((path / "config.json").read_text())
    raw.setdefault("mask_token_id", MASK_ID)
    raw.setdefault("eos_token_id", MASK_ID - 1)
    (path / "config.json").write_text(json.dumps(raw))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (path / name).unlink(missing_ok=True)
    # Qwen2's tokenizer (Dream's) adds <|endoftext|> where the vocabulary lacks it, which would fill the mask's id.
    vocab = {f"t{i}": i for i in range(MASK_ID - 1)} | {"<|endoftext|>": MASK_ID - 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(path)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_refuses_a_tokenizer_without_the_mask_token(tmp_path, family):
    path = FAMILIES[family](tmp_path / family)
    _without_mask_token(path)
    with pytest.raises(ValueError, match=f"the tokenizer in {path} has no token for mask_token_id {MASK_ID}; add the mask"):
        from_pretrained(path)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_reports_a_block_length_it_was_not_trained_with(tmp_path, family):
    path = FAMILIES[family](tmp_path / family)
    trained = read_checkpoint(path).info.block_size
    with pytest.warns(UserWarning, match=f"decode block length 8 differs from the checkpoint's block_size {trained}"):
        assert from_pretrained(path, block_length=8).block_length == 8
    with pytest.raises(ValueError, match="block_length must be >= 1, got 0"):
        from_pretrained(path, block_length=0)


def test_a_target_class_refuses_the_other_attention_naming_the_class_that_loads_it(tmp_path):
    llada, sdar = FAMILIES["llada"](tmp_path / "llada"), FAMILIES["sdar"](tmp_path / "sdar")
    with pytest.raises(ValueError, match="attention is bidirectional, not BlockCausalTarget's: load it with spot.targets.DualCacheTarget"):
        BlockCausalTarget.from_pretrained(llada)
    with pytest.raises(ValueError, match="attention is block_causal, not DualCacheTarget's: load it with spot.targets.BlockCausalTarget"):
        DualCacheTarget.from_pretrained(sdar)
