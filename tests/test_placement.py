"""Targets spread by a device map (spot.targets.placement): on a CPU-only machine the same accelerate dispatch a
multi-GPU run uses, with layers offloaded to disk, must decode token for token as the unsplit target, with the
same forward counts, under every kind of drafter, both verify layouts, both frozen caches, batch 1 and 3, T = 0
and 1; and the model's own patches (row-invariant linears, SDAR's norms) must run beneath the offload hooks."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import write_checkpoint
from test_dual_cache import TARGETS

from spot import DecodeConfig, Request, Sampling, generate, generate_batch
from spot.drafters import OracleDrafter
from spot.drafters.freedave import FreeDaveDrafter
from spot.targets import Placement, from_pretrained
from spot.targets.placement import execution_device


def split(layers: int, *head: str) -> tuple[tuple[str, str], ...]:
    """Every other decoder layer on disk, the rest (and `head`, the modules outside the layers) on the CPU."""
    return (*((name, "cpu") for name in head),
            *((f"model.layers.{i}", "disk" if i % 2 else "cpu") for i in range(layers)))


def decodes(target, prompts, config, drafters):
    """(token ids, forwards) of each prompt, draft-free and under each drafter, one at a time and as one batch."""
    out = []
    for temperature in (0.0, 1.0):
        base = replace(config, sampling=Sampling(temperature))
        for prompt in prompts:
            reference = generate(target, prompt, base, record=True)
            out.append((reference.token_ids, reference.stats.forwards))
            for drafter in drafters(reference):
                got = generate(target, prompt, replace(base, budget=6), drafter=drafter)
                out.append((got.token_ids, got.stats.forwards))
        batch = generate_batch(target, [Request(p, replace(base, budget=6), FreeDaveDrafter(), number=i)
                                        for i, p in enumerate(prompts)], 3)
        out += [(r.token_ids, r.stats.forwards) for r in batch]
    return out


def drafters(reference):
    return [FreeDaveDrafter(), OracleDrafter(reference.trajectory)]


@pytest.mark.parametrize("exact", [False, True])
def test_a_block_causal_target_split_over_cpu_and_disk_decodes_as_the_whole_one(tmp_path, exact):
    path = write_checkpoint(tmp_path / "ckpt")
    whole = from_pretrained(path, exact=exact)
    layers = whole.model.config.num_hidden_layers
    placement = Placement(split(layers, "model.embed_tokens", "model.norm", "model.rotary_emb", "lm_head"),
                          offload_folder=str(tmp_path / "offload"))
    parted = from_pretrained(path, exact=exact, placement=placement)
    assert set(parted.model.hf_device_map.values()) == {"cpu", "disk"} and execution_device(parted.model).type == "cpu"
    assert parted.model.model.layers[1].self_attn.q_proj.weight.device.type == "meta"  # offloaded, read in per forward
    assert torch.equal(parted.embeddings(), whole.embeddings())
    config = DecodeConfig(block_length=whole.block_length, gen_length=40, policy="threshold", threshold=0.5)
    prompts = [list(range(3, 3 + n)) for n in (5, 17, 30)]
    assert decodes(parted, prompts, config, drafters) == decodes(whole, prompts, config, drafters)


@pytest.mark.parametrize("cache", ["dual", "prefix"])
def test_a_dual_cache_target_split_over_cpu_and_disk_decodes_as_the_whole_one(tmp_path, cache):
    build, write, _ = TARGETS["llada"]
    path = write(tmp_path / "llada", build(seed=5))
    whole = from_pretrained(path, cache=cache)
    layers = whole.model.config.num_hidden_layers
    placement = Placement(split(layers, "model.embed_tokens", "model.norm", "model.rotary_emb", "lm_head"),
                          offload_folder=str(tmp_path / "offload"))
    parted = from_pretrained(path, cache=cache, placement=placement)
    assert "disk" in parted.model.hf_device_map.values()
    config = DecodeConfig(block_length=whole.block_length, gen_length=2 * whole.block_length, stop_at_eos=False)
    prompts = [list(range(1, 12)), list(range(2, 9))]
    assert decodes(parted, prompts, config, drafters) == decodes(whole, prompts, config, drafters)


def test_every_familys_model_keeps_its_decoder_layers_whole_under_a_device_map():
    """accelerate's automatic maps split a model only between the modules `_no_split_modules` names: each family's
    decoder layer is one of them, so no layer the exact layout runs whole is ever spread over two devices."""
    from spot.targets.checkpoint import FAMILIES

    for model_type, family in FAMILIES.items():
        with torch.device("meta"):  # the default configs are full-sized: shapes only
            model = family.model(family.config(num_hidden_layers=2))
        assert type(model.model.layers[0]).__name__ in model._no_split_modules, model_type
