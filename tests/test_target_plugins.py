"""Target plugins: an installed package teaches spot-eval a model_type through the `spot_eval.targets` entry-point
group (spot_eval.checkpoints.model_types), without a fork; `check_target` / `spot-eval check-target` checks the
invariants the engine relies on. The package is a real distribution written into tmp_path (a .dist-info directory
and the module its entry points name), found by importlib.metadata as an installed one is."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import run_cli, tiny_qwen3, write_checkpoint
from test_dual_cache import tiny_llada, write_llada
from torch import nn
from transformers import Qwen3Config, Qwen3ForCausalLM
from transformers.models.qwen3.modeling_qwen3 import Qwen3Model

from spot import DecodeConfig, generate
from spot.targets import BlockCausalTarget
from spot.targets.checkpoint import FAMILIES, Family, register_family
from spot.targets.dual_cache import FrozenCanvas
from spot_eval.checkpoints import model_types
from spot_eval.checkpoints.target import load_target, read_target
from spot_eval.harness.target_check import BATCH, CACHED, REFERENCE, check_target
from spot_eval.method import PluginWarning

PACKAGE, VERSION = "spot_eval_tiny_target", "0.1.0"
SPOT_EVAL = str(Path(sys.executable).with_name("spot-eval"))

# The plugin's module: SDAR's architecture (transformers' Qwen3) under a model_type of its own, with its reference
# generate written from SDAR's definition (a full block-causal forward per step, no cache) independently of spot.
PLUGIN = '''
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from spot_eval.plugin import ModelType, TargetFamily


def reference(model, prompt_ids, config):
    """Draft-free single-commit greedy decoding: blocks on the grid from position 0, each step commits the masked
    position whose token is likeliest (the mask token left out of the softmax; ties to the leftmost)."""
    k, n, mask = config.block_length, len(prompt_ids), model.config.mask_token_id
    end = n + config.gen_length
    tokens = torch.full((end,), mask)
    tokens[:n] = torch.tensor(prompt_ids)
    for start in range(n // k * k, end, k):
        seen = torch.arange(start + k) // k
        attend = (seen[None, :] <= seen[:, None])[None, None]  # block-causal
        while (tokens[start : start + k] == mask).any():
            logits = model(input_ids=tokens[None, : start + k], attention_mask=attend,
                           position_ids=torch.arange(start + k)[None]).logits[0, start:].double()
            logits[:, mask] = -torch.inf
            confidence, best = logits.softmax(-1).max(-1)
            confidence[tokens[start : start + k] != mask] = -1.0
            at = int(confidence.argmax())
            tokens[start + at] = best[at]
    return tokens[n:].tolist()


def shifted(model, prompt_ids, config):
    """Another family's tokens: the reference's, each one up."""
    return [(t + 1) % model.config.vocab_size for t in reference(model, prompt_ids, config)]


TINY = ModelType("tiny_sdar", TargetFamily(Qwen3Config, Qwen3ForCausalLM), reference)
SHIFTED = ModelType("tiny_shifted", TargetFamily(Qwen3Config, Qwen3ForCausalLM), shifted)
CLASH = ModelType("qwen3", TargetFamily(Qwen3Config, Qwen3ForCausalLM))
'''


@pytest.fixture(autouse=True)
def no_plugins_left():
    """Discovery reads the installed packages once per process and registers into the module-global FAMILIES: each
    test starts and ends with the built-in families only, and without the plugin's module imported."""
    kept = dict(FAMILIES)
    model_types.forget()
    yield
    model_types.forget()
    FAMILIES.clear()
    FAMILIES.update(kept)
    for name in [m for m in sys.modules if m.startswith(PACKAGE)]:
        del sys.modules[name]


def install(folder: Path, points: dict[str, str]) -> Path:
    """A distribution PACKAGE VERSION in `folder` (as pip leaves one in site-packages): its module, and the entry
    points `points` (name -> object reference) in the spot_eval.targets group. Put `folder` on sys.path to install."""
    folder.mkdir(exist_ok=True)
    (folder / f"{PACKAGE}.py").write_text(PLUGIN)
    info = folder / f"{PACKAGE}-{VERSION}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {VERSION}\n")
    (info / "entry_points.txt").write_text(f"[{model_types.GROUP}]\n" + "".join(f"{n} = {v}\n" for n, v in points.items()))
    return folder


def plugin_installed(tmp_path: Path, monkeypatch, **points: str) -> None:
    """The distribution installed for this test (its entry points `points`, else the one good model_type)."""
    monkeypatch.syspath_prepend(str(install(tmp_path / "site", points or {"tiny": f"{PACKAGE}:TINY"})))


def test_a_plugins_model_type_loads_and_decodes_as_the_architecture_it_names(tmp_path, monkeypatch):
    plugin_installed(tmp_path, monkeypatch)
    model = tiny_qwen3(seed=3)
    ours = write_checkpoint(tmp_path / "tiny", {"model_type": "tiny_sdar"}, model=model)
    built_in = write_checkpoint(tmp_path / "qwen3", model=model)
    target = load_target(ours, None)
    assert isinstance(target, BlockCausalTarget)
    assert read_target(ours).info.model_type == "tiny_sdar"
    assert model_types.origin("tiny_sdar") == f"package {PACKAGE} {VERSION}" and model_types.origin("qwen3") == "built in"
    assert model_types.reference("tiny_sdar").__module__ == PACKAGE and model_types.reference("qwen3") is None
    config = DecodeConfig(block_length=16, gen_length=40)
    prompt = list(range(1, 20))
    assert generate(target, prompt, config).token_ids == generate(load_target(built_in, None), prompt, config).token_ids


def test_without_the_package_the_model_type_is_unknown(tmp_path):
    path = write_checkpoint(tmp_path / "tiny", {"model_type": "tiny_sdar"})
    with pytest.raises(ValueError, match="declares model_type 'tiny_sdar', which spot-eval does not load"):
        read_target(path)
    with pytest.raises(ValueError, match=f"unknown model_type 'tiny_sdar'.*under {model_types.GROUP}"):
        model_types.origin("tiny_sdar")


def test_check_target_passes_on_a_plugin_and_compares_its_reference(tmp_path, monkeypatch):
    plugin_installed(tmp_path, monkeypatch)
    report = check_target(write_checkpoint(tmp_path / "tiny", {"model_type": "tiny_sdar"}, model=tiny_qwen3(seed=4)))
    assert report.passed, report.table()
    reference = next(c for c in report.checks if c.name == REFERENCE)
    assert reference.skipped is None and reference.note == "the same 45 tokens"  # a 19-token prompt to the 64th position
    table = report.table()
    assert f"model_type tiny_sdar (package {PACKAGE} {VERSION}), block-causal, K = 16" in table
    assert re.search(rf"\n  {REFERENCE} +pass    the same 45 tokens\n", table)
    assert table.endswith("PASS: the target keeps every invariant the engine relies on")


@pytest.mark.parametrize("family", ["qwen3", "llada"])
def test_check_target_passes_on_the_built_in_families(tmp_path, family):
    path = (write_checkpoint(tmp_path / family) if family == "qwen3" else write_llada(tmp_path / family, tiny_llada(seed=1)))
    report = check_target(path)
    assert report.passed, report.table()
    assert report.origin == "built in" and report.cache == (None if family == "qwen3" else "dual")
    assert next(c for c in report.checks if c.name == REFERENCE).skipped  # the built-in families give none
    assert "skip    the family gives no reference generate function" in report.table()


def test_a_reference_of_other_tokens_fails_with_the_first_that_differs(tmp_path, monkeypatch):
    plugin_installed(tmp_path, monkeypatch, shifted=f"{PACKAGE}:SHIFTED")
    report = check_target(write_checkpoint(tmp_path / "shifted", {"model_type": "tiny_shifted"}))
    assert not report.passed
    assert [c.name for c in report.checks if not c.passed] == [REFERENCE]
    counterexample = next(c for c in report.checks if c.name == REFERENCE).counterexample
    assert counterexample.startswith("token 0 of 45: spot-eval ") and "the reference" in counterexample
    assert "FAIL: see the first counterexample" in report.table()


class _LeakyEmbedding(nn.Embedding):
    """Each row's embedding plus the mean over every row of the forward: a token's output depends on the rows beside
    it, as a model that normalises over the batch would."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = super().forward(ids)  # [1, L, d]
        return out + out.mean(dim=-2, keepdim=True)


class LeakyQwen3(Qwen3ForCausalLM):
    def __init__(self, config: Qwen3Config) -> None:
        super().__init__(config)
        self.model.embed_tokens = _LeakyEmbedding(config.vocab_size, config.hidden_size, config.pad_token_id)


class _PositionBlind(Qwen3Model):
    def forward(self, *args, position_ids=None, **kwargs):  # the positions dropped: each forward counts from 0
        return super().forward(*args, **kwargs)


class PositionBlindQwen3(Qwen3ForCausalLM):
    def __init__(self, config: Qwen3Config) -> None:
        super().__init__(config)
        self.model = _PositionBlind(config)
        self.post_init()


@pytest.mark.parametrize(("model", "check", "says"), [(LeakyQwen3, BATCH, "stream 0 (16-token prompt), logits, piece "),
                                                      (PositionBlindQwen3, CACHED, "piece ")])
def test_a_broken_target_fails_the_matching_check_with_a_counterexample(tmp_path, model, check, says):
    register_family("broken", Family(Qwen3Config, model))
    report = check_target(write_checkpoint(tmp_path / "broken", {"model_type": "broken"}))
    found = next(c for c in report.checks if c.name == check)
    assert report.origin == "register_family" and not report.passed and not found.passed
    assert found.counterexample.startswith(says) and "(max |difference| " in found.counterexample, found.counterexample
    assert re.search(rf"\n  {re.escape(check)} +FAIL    {re.escape(says)}", report.table())


def test_a_bidirectional_stream_that_keeps_the_frozen_cache_past_a_commit_fails_the_cached_check(tmp_path, monkeypatch):
    """The frozen-cache decoder's cache is its definition, not the uncached forward: what it must keep is a fresh
    block-start forward after every commit."""

    def commit_keeping_the_frozen_kv(self, block):
        self.tokens = torch.cat([self.tokens, block.to(self.tokens.device, torch.long)])

    monkeypatch.setattr(FrozenCanvas, "commit", commit_keeping_the_frozen_kv)
    report = check_target(write_llada(tmp_path / "llada", tiny_llada(seed=1)))
    assert [c.name for c in report.checks if not c.passed] == [CACHED]
    assert re.search(rf"\n  {CACHED} +FAIL    piece 0, position \d+, token \d+: .* through the cache, .* from a fresh "
                     r"stream \(max \|difference\| ", report.table())


def test_a_package_that_does_not_import_or_clashes_is_named_once_and_the_rest_still_load(tmp_path, monkeypatch):
    plugin_installed(tmp_path, monkeypatch, missing="spot_eval_tiny_target_gone:TINY", clash=f"{PACKAGE}:CLASH",
                     tiny=f"{PACKAGE}:TINY")
    built_in = FAMILIES["qwen3"]
    with pytest.warns(PluginWarning) as caught:
        read_target(write_checkpoint(tmp_path / "tiny", {"model_type": "tiny_sdar"}))
    lines = sorted(str(w.message) for w in caught if w.category is PluginWarning)
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"spot-eval: model_type 'qwen3' of package {PACKAGE} {VERSION} (entry point 'clash') "
                               "clashes with the 'qwen3' of built in, which keeps it")
    assert lines[1].startswith(f"spot-eval: the target plugin 'missing' of package {PACKAGE} {VERSION} does not import "
                               "(ModuleNotFoundError")
    assert all("\n" not in line for line in lines)
    assert FAMILIES["qwen3"] is built_in and model_types.origin("tiny_sdar") == f"package {PACKAGE} {VERSION}"
    with warnings.catch_warnings(record=True) as again:  # the packages are read once per process
        warnings.simplefilter("always")
        read_target(tmp_path / "tiny")
    assert not [w for w in again if w.category is PluginWarning]


def test_register_family_refuses_a_taken_model_type_and_an_attention_no_target_decodes():
    with pytest.raises(ValueError, match="model_type 'qwen3' is taken by Qwen3ForCausalLM's family, which keeps it; "
                                         "LeakyQwen3's family needs a model_type of its own"):
        register_family("qwen3", Family(Qwen3Config, LeakyQwen3))
    with pytest.raises(ValueError, match="model_type 'causal_lm': attention 'causal' is not one a target decodes; "
                                         "choose block_causal or bidirectional"):
        register_family("causal_lm", Family(Qwen3Config, Qwen3ForCausalLM, "causal"))
    assert "causal_lm" not in FAMILIES
    with pytest.raises(ValueError, match="ModelType 'tiny': family must be a spot_eval.plugin.TargetFamily, got type"):
        model_types.ModelType("tiny", Qwen3ForCausalLM)


def test_a_bad_directory_is_the_users_error(tmp_path, capsys):
    done = run_cli(capsys, "check-target", str(tmp_path / "nowhere"))
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].startswith(f"error: {tmp_path / 'nowhere'} "
                                                                                      "is not a model directory")


@pytest.mark.slow
def test_the_console_script_prints_the_table_and_exits_1_on_a_failed_check(tmp_path):
    """Once through the console script, on the failing plugin (the passing one is checked in-process above)."""
    site = install(tmp_path / "site", {"tiny": f"{PACKAGE}:TINY", "shifted": f"{PACKAGE}:SHIFTED"})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    bad = write_checkpoint(tmp_path / "shifted", {"model_type": "tiny_shifted"})
    done = subprocess.run([SPOT_EVAL, "check-target", str(bad)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1, done.stderr
    assert f"model_type tiny_shifted (package {PACKAGE} {VERSION})" in done.stdout
    assert re.search(rf"\n  {REFERENCE} +FAIL    token 0 of 45: ", done.stdout)
    assert "FAIL: see the first counterexample" in done.stdout
