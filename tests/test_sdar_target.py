"""The SDAR-style adapter: exact piece logits, the cache, real SDAR configs, and bad checkpoints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import EOS_ID, MASK_ID, tiny_qwen3, tiny_target, write_checkpoint
from transformers import Qwen3ForCausalLM

from spot.targets.sdar import SDARTarget, read_checkpoint

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
    assert target._cache.get_seq_length() == 16
    target.commit(torch.arange(16))
    target.verify(random_states(3, 16, 3), 32)
    assert target._cache.get_seq_length() == 32
    with pytest.raises(RuntimeError, match="active block starts at 16 but the cache and pending blocks end at 32"):
        target.verify(random_states(1, 16, 3), 16)


@pytest.mark.parametrize("name", ["sdar-8b-chat", "sdar-4b-chat"])
def test_real_sdar_configs_map_onto_qwen3(name, tmp_path):
    shutil.copytree(FIXTURES / name, tmp_path / name)
    config, info = read_checkpoint(tmp_path / name)
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
    target = SDARTarget.from_pretrained(path)
    assert (target.mask_id, target.block_length, target.eos_ids) == (MASK_ID, 16, {EOS_ID})
    reference = tiny_qwen3()
    ids = torch.arange(20)[None]
    with torch.no_grad():
        assert torch.equal(target.model(input_ids=ids).logits, reference(input_ids=ids).logits)


def test_an_sdar_model_type_directory_loads_without_remote_code(tmp_path):
    path = write_checkpoint(tmp_path / "ckpt", {"model_type": "sdar", "architectures": ["SDARForCausalLM"],
                                                "auto_map": {"AutoConfig": "configuration_sdar.SDARConfig"}})
    assert SDARTarget.from_pretrained(path).block_length == 16


def test_a_directory_without_mask_token_id_is_refused(tmp_path):
    path = write_checkpoint(tmp_path / "ckpt", {"mask_token_id": None})
    with pytest.raises(ValueError, match="has no 'mask_token_id'.*Add mask_token_id to config.json"):
        SDARTarget.from_pretrained(path)


def test_a_tokenizer_without_the_mask_token_is_refused(tmp_path):
    path = write_checkpoint(tmp_path / "ckpt", tokenizer_vocab=MASK_ID)  # ids 0..62: no token 63
    with pytest.raises(ValueError, match="has no token for mask_token_id 63"):
        SDARTarget.from_pretrained(path)


def test_a_block_length_that_disagrees_with_the_checkpoint_warns(tmp_path):
    path = write_checkpoint(tmp_path / "ckpt")
    with pytest.warns(UserWarning, match="decode block length 32 differs from the checkpoint's block_size 16"):
        target = SDARTarget.from_pretrained(path, block_length=32)
    assert target.block_length == 32
    with pytest.raises(ValueError, match="block_length must be >= 1"):
        SDARTarget.from_pretrained(path, block_length=0)


def test_a_missing_directory_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        SDARTarget.from_pretrained(tmp_path / "nowhere")
