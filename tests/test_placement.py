"""Targets spread by a device map (spot.targets.placement): on a CPU-only machine the same accelerate dispatch a
multi-GPU run uses, with layers offloaded to disk, must decode token for token as the unsplit target, with the
same forward counts, under every kind of drafter, both verify layouts, both frozen caches, batch 1 and 3, T = 0
and 1; and the model's own patches (row-invariant linears, SDAR's norms) must run beneath the offload hooks."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from conftest import ROOT, run_cli, run_lm_eval_here, tiny_qwen3_moe, write_checkpoint
from test_dual_cache import TARGETS
from test_llada2 import tiny_llada2, write_llada2
from test_sdar_target import hub_cache

from spot import DecodeConfig, Request, Sampling, generate, generate_batch
from spot.drafters import OracleDrafter
from spot.drafters.freedave import FreeDaveDrafter
from spot.targets import Placement, from_pretrained
from spot.targets.checkpoint import empty_model
from spot.targets.placement import execution_device, largest_layer
from spot_eval.checkpoints.target import read_target
from spot_eval.harness.placement import gpu_share, parse_device_map, plan_placement
from spot_eval.harness.settings import TargetSettings


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


def settings(**given) -> TargetSettings:
    return TargetSettings(**given)


def test_a_strategy_spills_what_the_memory_does_not_hold_and_every_moe_family_decodes_split_as_whole(tmp_path):
    """SDAR's MoE (Qwen3-MoE) and LLaDA2.0 (a dense first layer, grouped experts), planned by the harness from
    lm-eval's names: the CPU holds what max_cpu_memory allows, the rest of the layers (their experts and router
    with them) goes to disk, and the split target decodes as the whole one."""
    checkpoints = {"sdar_moe": write_checkpoint(tmp_path / "sdar_moe", {"model_type": "sdar_moe"}, model=tiny_qwen3_moe(seed=3)),
                   "llada2_moe": write_llada2(tmp_path / "llada2", tiny_llada2(seed=1))}
    for name, path in checkpoints.items():
        checkpoint = read_target(path)
        whole = from_pretrained(checkpoint, exact=True)
        layer = largest_layer(empty_model(checkpoint, torch.float32))[1]
        held = sum(p.numel() * 4 for p in whole.model.parameters()) - layer // 2  # less than all: some layer spills
        planned = plan_placement(settings(device_map="sequential", max_cpu_memory=str(held), offload_folder=str(tmp_path / name)),
                                 "cpu", checkpoint, torch.float32)
        assert dict(planned.bytes_by_device).keys() == {"cpu", "disk"}, name
        parted = from_pretrained(checkpoint, exact=True, placement=planned.placement)
        on_disk = [m for m, where in parted.model.hf_device_map.items() if where == "disk"]
        experts = [n for n, _ in parted.model.named_parameters() if "experts" in n and any(n.startswith(m + ".") for m in on_disk)]
        assert experts and all(dict(parted.model.named_parameters())[n].device.type == "meta" for n in experts), name
        config = DecodeConfig(block_length=whole.block_length, gen_length=whole.block_length, stop_at_eos=False)
        assert lean(parted, config) == lean(whole, config), name


def lean(target, config):
    """(token ids, forwards) of one prompt draft-free and under FreeDave, at T = 0 and 1: the MoE checks' share of
    `decodes`, which the dense targets run whole."""
    out = []
    for temperature in (0.0, 1.0):
        base = replace(config, sampling=Sampling(temperature))
        for budget, drafter in ((0, None), (6, FreeDaveDrafter())):
            got = generate(target, list(range(1, 12)), replace(base, budget=budget), drafter=drafter)
            out.append((got.token_ids, got.stats.forwards))
    return out


EMBEDDED = None  # the shipped target's checkpoint, parsed once (its sizes are what the refusals quote)


def embedded():
    global EMBEDDED
    if EMBEDDED is None:
        from spot_eval.checkpoints.shipped import EMBEDDED_TARGET

        EMBEDDED = read_target(EMBEDDED_TARGET)
    return EMBEDDED


@pytest.mark.parametrize("given, device, gpus, message", [
    ({"parallelize": True}, "cpu", 0, "parallelize=true spreads the target over GPUs, and this run decodes on the CPU"),
    ({"device_map": "model.embed_tokens:cuda:1"}, "cpu", 0, r"puts model.embed_tokens on cuda:1, and 0 GPU\(s\) are visible"),
    ({"device_map": "model.layerz.0:cpu"}, "cpu", 0, "names model.layerz.0, which Qwen3ForCausalLM does not have"),
    ({"device_map": "model.layers.0:cpu"}, "cpu", 0, "places no device for lm_head, model.embed_tokens, model.layers.1"),
    ({"device_map": "model:cpu+lm_head:disk", "offload_folder": "OFF"}, "cpu", 0,
     "tied weights lm_head.weight and model.embed_tokens.weight on different devices"),
    ({"device_map": "model:cpu+lm_head:gpu"}, "cpu", 0, "device 'gpu' is not cpu, disk, N or cuda:N"),
    ({"device_map": "model.layers.0"}, "cpu", 0, "'model.layers.0' is not module:device"),
    ({"device_map": "nowhere.json"}, "cpu", 0, "device_map=nowhere.json: no such file"),
    ({"device_map": "sequential", "max_cpu_memory": "10MB"}, "cpu", 0, r"keeps 3 module\(s\) on disk .*give offload_folder=DIR"),
    ({"device_map": "sequential", "max_cpu_memory": "lots"}, "cpu", 0, "max_cpu_memory='lots' is not a size"),
    ({"device_map": "sequential", "offload_folder": "FILE/offload"}, "cpu", 0, "offload_folder=.* cannot be created: .*FILE is not a writable directory"),
    ({"parallelize": True, "max_memory_per_gpu": "1MB"}, "cuda:0", 2,
     r"max_memory_per_gpu=1MB holds no layer of this target: model.layers.0 alone takes 3.0 MiB in float32"),
])
def test_each_bad_placement_is_one_line_naming_the_fix_before_any_weight_loads(tmp_path, given, device, gpus, message):
    (tmp_path / "FILE").write_text("a file, not a folder")
    given = {k: v.replace("OFF", str(tmp_path / "off")).replace("FILE", str(tmp_path / "FILE")) if isinstance(v, str) else v
             for k, v in given.items()}
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(ValueError, match=message):
        plan_placement(settings(**given), device, embedded(), torch.float32, gpus=gpus, local=(1, 0), free={"cpu": 2**34})
    assert sorted(tmp_path.rglob("*")) == before  # nothing left behind


def test_processes_take_every_nth_gpu_and_more_processes_than_gpus_are_refused():
    assert gpu_share(4, 2, 0) == (0, 2) and gpu_share(4, 2, 1) == (1, 3) and gpu_share(8, 1, 0) == tuple(range(8))
    with pytest.raises(ValueError, match=r"parallelize=true with 3 processes on this machine and 2 GPU\(s\) visible.*"
                                         r"--num_processes 2"):
        gpu_share(2, 3, 0)


def test_a_map_is_read_from_pairs_or_a_json_file_and_a_strategy_is_planned_for_hypothetical_gpus(tmp_path, capsys):
    pairs = "+".join(f"{m}:{d}" for m, d in split(4, "model.embed_tokens", "model.norm", "model.rotary_emb", "lm_head"))
    (tmp_path / "map.json").write_text(json.dumps(dict(parse_device_map(pairs))))
    assert parse_device_map(str(tmp_path / "map.json")) == parse_device_map(pairs)
    assert parse_device_map("model:cuda:1+lm_head:0") == (("model", 1), ("lm_head", 0))
    run = run_cli(capsys, "placement", "--gpus", "2", "--max-memory-per-gpu", "12MB", "--json")
    plan = json.loads(run.stdout)
    assert run.returncode == 0 and plan["dtype"] == "bfloat16" and "not available" not in run.stderr
    assert set(plan["bytes"]) == {"0", "1"} and sum(plan["bytes"].values()) == 4_721_536 * 2  # its parameters, bf16
    run = run_cli(capsys, "placement", "--device-map", pairs, "--offload-folder", str(tmp_path / "off"))
    shown = [line.split() for line in run.stdout.splitlines()]
    assert run.returncode == 0 and ["cpu", "12.0", "MiB", "(67%", "of", "the", "weights,", "6", "module(s))"] in shown
    assert ["disk", "6.0", "MiB", "(33%", "of", "the", "weights,", "2", "module(s))"] in shown
    assert not (tmp_path / "off").exists()  # planned, not loaded: nothing written


def test_a_hub_checkpoint_is_planned_from_its_config_alone_without_its_weights(tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    from spot_eval.checkpoints.shipped import EMBEDDED_TARGET

    (tmp_path / "src").mkdir()
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "src" / name).write_bytes((EMBEDDED_TARGET / name).read_bytes())
    repo = hub_cache(tmp_path / "hf", "spot/embedded-config-only", tmp_path / "src")  # no model.safetensors
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    run = run_cli(capsys, "placement", "--pretrained", repo, "--gpus", "2", "--max-memory-per-gpu", "12MB", "--json")
    assert run.returncode == 0, run.stderr
    assert set(json.loads(run.stdout)["bytes"]) == {"0", "1"}


@pytest.mark.slow
def test_lm_eval_decodes_a_target_split_over_cpu_and_disk_as_the_whole_one(tmp_path, capsys):
    """The issue's line on the tests' tiny target: the real lm_eval entry point, model_args device_map (pairs)
    and offload_folder, every method lossless with the same tokens and forwards as the unsplit run; run.json and
    MLflow carry each device's peak."""
    checkpoint = write_checkpoint(tmp_path / "ckpt")
    layers = json.loads((checkpoint / "config.json").read_text())["num_hidden_layers"]
    pairs = "+".join(f"{m}:{d}" for m, d in split(layers, "model.embed_tokens", "model.norm", "model.rotary_emb", "lm_head"))
    runs = {}
    for name, extra in {"whole": "", "split": f",device_map={pairs},offload_folder={tmp_path / 'off'}"}.items():
        args = (f"pretrained={checkpoint},methods=oracle@4+freedave@4,gen_length=32,device=cpu,"
                f"mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'},output_dir={tmp_path / name}{extra}")
        run = run_lm_eval_here(capsys, "--model", "spot", "--model_args", args, "--tasks", "spot_gsm8k",
                               "--include_path", str(ROOT / "tasks"), "--limit", "1", cwd=tmp_path)
        assert run.returncode == 0, run.stderr[-2000:]
        runs[name] = [(r["doc_id"], r["label"], r["token_ids"], r["forwards"], r["lossless"])
                      for r in map(json.loads, (tmp_path / name / "samples.jsonl").read_text().splitlines())]
    assert runs["split"] == runs["whole"] and {r[-1] for r in runs["split"]} == {True}
    record = json.loads((tmp_path / "split" / "run.json").read_text())
    assert record["devices"] == ["cpu", "disk"] and record["peak_memory_mb_by_device"]["cpu"] > 0
    assert record["device_map"]["model.layers.1"] == "disk" and "spot-eval: peak memory cpu" in run.stdout
