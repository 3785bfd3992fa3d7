"""Methods from outside the repository: discovery (installed packages' entry points, plugin files named on the
command line), the method description's checks, the conformance check on bad drafters, and what a run, `spot-eval
decode` and the reports do with a plugin's method, good or broken."""

from __future__ import annotations

import itertools
import json
import textwrap
import warnings
from pathlib import Path

import pytest
from conftest import ROOT, run_cli, run_lm_eval_here, write_checkpoint

from spot_eval import registry
from spot_eval.harness.conformance import FACTORS, LOSSLESS, TREES, UNTOUCHED, check_method, grid, pairwise
from spot_eval.harness.methods import parse_methods
from spot_eval.method import Method, PluginWarning
from spot_eval.reports import plots, table2

# A plugin file: the FreeDave chain under another name (a real method, lossless), and two broken ones.
CHAIN = '''
from spot.drafters.freedave import FreeDaveDrafter
from spot_eval.plugin import Method

CHAIN = Method("chain", lambda b: FreeDaveDrafter(name="chain"), display="My chain", colour="#123456",
               cost="nothing: the stale chain")
'''
BROKEN = '''
import time

import torch
from spot_eval.plugin import DraftTree, Method


class Raises:
    name = "raises"

    def __init__(self):
        self.calls = 0

    def draft(self, ctx):
        self.calls += 1
        if self.calls > 2:
            raise KeyError("the plugin's own bug")
        return DraftTree.root_only(ctx.state)


class Hangs:
    name = "hangs"

    def draft(self, ctx):
        time.sleep(30)


class OutOfVocabulary:
    name = "oov"

    def draft(self, ctx):
        node = ctx.state.clone()
        node[(node == ctx.mask_id).nonzero()[0, 0]] = 10**6
        return DraftTree(torch.stack([ctx.state, node]), ((), (0,)))


RAISES = Method("raises", lambda b: Raises())
HANGS = Method("hangs", lambda b: Hangs())
OOV = Method("oov", lambda b: OutOfVocabulary())
'''


@pytest.fixture(autouse=True)
def fresh_registry():
    """Each test discovers afresh, and leaves no plugin behind for the next."""
    registry.forget_plugins()
    yield
    registry.forget_plugins()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(write_checkpoint(tmp_path_factory.mktemp("plugins") / "ckpt"))


def plugin_file(folder: Path, text: str, name: str = "my_methods.py") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def installed_package(site: Path, name: str, entry_points: dict[str, str], module: str, source: str) -> None:
    """A distribution as pip installs one: its module and a dist-info folder with the entry points."""
    dist = site / f"{name.replace('-', '_')}-0.3.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.3.0\n")
    (dist / "entry_points.txt").write_text("[spot_eval.methods]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))
    (site / f"{module}.py").write_text(textwrap.dedent(source))


# -- discovery ------------------------------------------------------------------------------------------------------


def test_an_installed_packages_methods_join_the_built_in_ones_with_their_package_named(tmp_path, monkeypatch):
    installed_package(tmp_path, "acme-drafters", {"chain": "acme_methods:CHAIN", "broken": "acme_broken:NOTHING",
                                                  "clash": "acme_methods:SPOT"}, "acme_methods", CHAIN + '''
SPOT = Method("spot", lambda b: None)
''')
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(PluginWarning) as said:
        entries = registry.entries()
    assert entries["chain"].method.display == "My chain" and str(entries["chain"].origin) == "package acme-drafters 0.3.0"
    assert entries["spot"].origin == registry.BUILT_IN  # built-in names win
    lines = [str(w.message) for w in said]
    assert any("'broken' of package acme-drafters 0.3.0 does not import" in line and "ModuleNotFoundError" in line for line in lines)
    assert any("'spot' of package acme-drafters 0.3.0" in line and "clashes with the 'spot' of built in" in line for line in lines)
    assert len(lines) == 2
    assert parse_methods("chain@4+spot@8", "")[0].origin == entries["chain"].origin  # a run names it like a built-in


def test_a_plugin_file_or_module_adds_its_methods_and_a_bad_one_is_refused_with_the_fix(tmp_path, monkeypatch):
    path = plugin_file(tmp_path, CHAIN)
    [added] = registry.load_plugins([str(path)])
    assert added.method.name == "chain" and added.origin == registry.Origin("file", str(path.resolve()))
    assert registry.load_plugins([str(path)]) == (added,)  # named twice (every rank, every run): loaded once
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.forget_plugins()
    assert registry.load_plugins(["my_methods"])[0].origin == registry.Origin("file", "my_methods")
    with pytest.raises(ValueError, match=r"plugins=nowhere\.py: no such file"):
        registry.load_plugins(["nowhere.py"])
    with pytest.raises(ValueError, match=r"holds no spot_eval.plugin.Method at its top level"):
        registry.load_plugins([str(plugin_file(tmp_path, "X = 1\n", "empty.py"))])
    with pytest.raises(ValueError, match=r"does not import: ZeroDivisionError: division by zero"):
        registry.load_plugins([str(plugin_file(tmp_path, "1 / 0\n", "crash.py"))])


def test_a_plugin_method_whose_name_is_taken_is_named_and_the_rest_of_its_file_loads(tmp_path):
    path = plugin_file(tmp_path, CHAIN + '''
FREEDAVE = Method("freedave", lambda b: None)
''')
    with pytest.warns(PluginWarning, match=r"method 'freedave' of file .*my_methods.py clashes with the 'freedave' of built in"):
        added = registry.load_plugins([str(path)])
    assert [e.method.name for e in added] == ["chain"] and registry.entry("freedave").origin == registry.BUILT_IN
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # importing a built-in's Method into a plugin file is no clash
        registry.load_plugins([str(plugin_file(tmp_path, "from spot_eval.families import FAMILIES\nFIRST = FAMILIES[1]\n"
                                                         + CHAIN.replace('"chain"', '"chain2"'), "imports.py"))])


def test_the_other_spelling_of_a_plugin_is_refused_with_the_one_that_works():
    with pytest.raises(ValueError, match=r"plugins=my_drafter\.py and methods=NAME@8"):
        parse_methods("my_drafter.py:MyDrafter@8", "")
    with pytest.raises(ValueError, match=r"unknown method 'nosuch@4'.*plugins=FILE, or install its package"):
        parse_methods("nosuch@4", "")


@pytest.mark.parametrize(("fields", "message"), [
    ({"name": "My-Method"}, "use lower-case letters"),
    ({"colour": "blue"}, "colour 'blue' is not #RRGGBB"),
    ({"acceptance": "greedy"}, "acceptance 'greedy'; choose from exact, max_commit"),
    ({"build": "not callable"}, "build must be a function"),
])
def test_a_method_description_is_checked_where_it_is_written(fields, message):
    with pytest.raises(ValueError, match=message):
        Method(**{"name": "mine", "build": lambda b: None, **fields})


def test_a_method_without_a_colour_keeps_one_colour_everywhere_and_the_reports_draw_it():
    m = Method("mine", lambda b: None)
    assert m.display == "mine" and m.colour == Method("mine", None).colour  # the same in a process without the plugin
    registry.remember({"mine": {"display": "Mine", "colour": "#ABCDEF", "hatch": "", "acceptance": "exact", "origin": "x"}})
    assert plots.style("mine@8")["color"] == "#ABCDEF" and table2.display_name("mine@8") == "Mine @8"
    assert plots.style("spot@8")["color"] == "#0072B2"  # a built-in keeps its own, whatever a run.json says


# -- the conformance check ------------------------------------------------------------------------------------------


def test_pairwise_cells_hold_every_pair_of_settings_and_are_the_same_every_time():
    rows = pairwise(FACTORS)
    for a, b in itertools.combinations(FACTORS, 2):
        assert {(r[a], r[b]) for r in rows} == set(itertools.product(FACTORS[a], FACTORS[b])), (a, b)
    assert rows == pairwise(FACTORS) and len(rows) <= 10  # 4 policies x 2 temperatures is the least possible: 8
    full = grid(quick=False)
    assert len(full) == 4 * 2 ** 5 and len(set(full)) == len(full)


@pytest.mark.slow
def test_the_conformance_check_names_each_breach_and_the_engine_keeps_the_output_exact(tiny):
    """A drafter that writes its Gumbel scores into the noise it is handed stays lossless (the engine's copies), and
    the check names the write; one whose trees hold a token outside the vocabulary fails the trees check."""
    scribbler = Method("scribbler", lambda b: _Scribbler())
    report = check_method(scribbler, quick=True, checkpoint=tiny)
    assert not report.passed
    checks = {c.name: c for c in report.checks}
    assert checks[LOSSLESS].passed and checks[TREES].passed
    assert "the drafter wrote into the noise of step" in checks[UNTOUCHED].counterexample
    assert "FAIL" in report.table() and "first:" in report.table()
    registry.load_plugins([])
    oov = check_method(Method("oov", lambda b: _OutOfVocabulary()), quick=True, checkpoint=tiny)
    assert "outside the vocabulary" in {c.name: c for c in oov.checks}[TREES].counterexample


class _Scribbler:
    name = "scribbler"

    def draft(self, ctx):
        from spot.drafters.freedave import FreeDaveDrafter

        noise = ctx.gumbel(ctx.step)
        if noise is not None:
            noise += 1.0  # in place: z = gumbel; z += logits
        return FreeDaveDrafter().draft(ctx)


class _OutOfVocabulary:
    name = "oov"

    def draft(self, ctx):
        import torch

        from spot.tree import DraftTree

        masked = (ctx.state == ctx.mask_id).nonzero()
        if not len(masked):
            return DraftTree.root_only(ctx.state)
        node = ctx.state.clone()
        node[masked[0, 0]] = 10**6
        return DraftTree(torch.stack([ctx.state, node]), ((), (0,)))


# -- a run with a plugin's method -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_lm_eval_runs_a_plugin_file_beside_the_built_ins_and_a_broken_one_stops_alone(tiny, tmp_path, capsys):
    chain = plugin_file(tmp_path, CHAIN)
    broken = plugin_file(tmp_path, BROKEN, "broken.py")
    args = (f"pretrained={tiny},methods=chain@4+raises@4+freedave@4,plugins={chain}+{broken},gen_length=32,device=cpu,"
            f"mlflow_tracking_uri=sqlite:///{tmp_path}/m.db,output_dir={tmp_path}/run")
    run = run_lm_eval_here(capsys, "--model", "spot", "--model_args", args, "--tasks", "spot_gsm8k", "--include_path",
                           str(ROOT / "tasks"), "--limit", "2", cwd=tmp_path)
    assert run.returncode == 1, run.stderr[-3000:]
    table = run.stdout[run.stdout.index("forward_ratio"):]
    assert "chain@4" in table and "freedave@4" in table and "raises@4" not in table.split("lossless:")[0]
    said = f"method raises@4 (file {broken.resolve()}) failed while decoding spot_gsm8k doc"
    assert said in run.stdout and "drafter 'raises' raised KeyError: \"the plugin's own bug\"" in run.stdout
    assert "1 method(s) failed and were stopped (raises@4); the others finished" in run.stderr
    run_json = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run_json["methods"]["chain"] == {"display": "My chain", "colour": "#123456", "hatch": "", "acceptance": "exact",
                                           "origin": f"file {chain.resolve()}"}
    assert run_json["failed_methods"]["raises@4"]["origin"] == f"file {broken.resolve()}"
    assert "KeyError" in (tmp_path / "run" / "failures.log").read_text()
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").open()]
    assert all(s["lossless"] for s in samples if s["label"] == "chain@4") and {s["label"] for s in samples} >= {"chain@4", "freedave@4"}


@pytest.mark.slow
@pytest.mark.parametrize(("method", "extra", "said"), [
    ("raises", [], "drafter 'raises' raised KeyError"),
    ("oov", [], "drafter 'oov' returned token 1000000 at node 1"),
    ("hangs", ["--draft-timeout", "1"], "took longer than the 1 s one draft may take (draft_timeout=1); stopped as hung"),
])
def test_decode_reports_a_broken_plugin_as_the_plugins_failure_not_the_users(method, extra, said, tiny, tmp_path, capsys):
    broken = plugin_file(tmp_path, BROKEN, "broken.py")
    run = run_cli(capsys, "decode", "--pretrained", tiny, "--method", method, "--budget", "2", "--gen-length", "48",
                  "--prompt", "t1 t2 t3", "--plugins", str(broken), *extra)
    assert run.returncode == 1, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: method {method}@2 (file {broken.resolve()}) failed: ") and said in last
    assert "Traceback" in run.stderr  # the plugin's traceback, for its author


def test_methods_lists_each_method_with_where_it_comes_from(tmp_path, capsys):
    chain = plugin_file(tmp_path, CHAIN)
    run = run_cli(capsys, "methods", "--plugins", str(chain), "--json")
    rows = {r["name"]: r for r in map(json.loads, run.stdout.splitlines())}
    assert rows["chain"]["origin"] == f"file {chain.resolve()}" and rows["chain"]["new_target"] == "nothing: the stale chain"
    assert rows["spot"]["origin"] == "built in" and rows["spot"]["reads"] == "an order-model checkpoint"
    assert not rows["sets_max"]["exact"] and "draft_free" not in rows
    table = run_cli(capsys, "methods").stdout
    assert table.splitlines()[0].split() == ["method", "from", "exact", "reads", "a", "new", "target", "costs"]


@pytest.mark.slow
def test_the_docs_worked_example_is_a_plugin_that_passes_the_conformance_check(tiny, tmp_path):
    """docs/plugins.md's example, pasted into a file as a reader would, loads, and conforms on every quick cell."""
    page = (ROOT / "docs" / "plugins.md").read_text()
    example = next(body for body in page.split("```python\n")[1:] if "Method(" in body).split("```")[0]
    [entry] = registry.load_plugins([str(plugin_file(tmp_path, example, "confident_chain.py"))])
    assert entry.method.name == "confident_chain" and len(example.splitlines()) <= 45
    report = check_method("confident_chain", quick=True, checkpoint=tiny)
    assert report.passed, report.table()


# -- the example plugin package, installed as a user installs it (the README's test command does) -------------------

INSTALL = "pip install ./examples/prompt-lookup (the README's test command installs it)"


def installed_lookup() -> registry.Entry:
    found = registry.entries().get("lookup")
    assert found is not None and found.origin.kind == "package", f"the example plugin is not installed: {INSTALL}"
    return found


@pytest.mark.slow
def test_the_installed_example_is_listed_with_its_package_and_passes_the_quick_check(tmp_path, tiny):
    """Through the console script, as a user runs it; on a tiny target (`--pretrained`), as the quick check on the
    embedded one takes about a minute of CI."""
    import os
    import subprocess

    from conftest import LM_EVAL

    assert str(installed_lookup().origin) == "package spot-eval-prompt-lookup 0.1.0"
    spot_eval = str(Path(LM_EVAL).with_name("spot-eval"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    listed = subprocess.run([spot_eval, "methods"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    [line] = [x for x in listed.stdout.splitlines() if x.startswith("lookup ")]
    assert "package spot-eval-prompt-lookup 0.1.0" in line and " yes " in line
    checked = subprocess.run([spot_eval, "check-method", "lookup", "--quick", "--threads", "1", "--pretrained", tiny],
                             capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert checked.returncode == 0, checked.stdout + checked.stderr[-2000:]
    assert "PASS: every output equals draft-free's" in checked.stdout and "FAIL" not in checked.stdout
    assert "lookup@8" in checked.stdout and "freedave@8" in checked.stdout  # ranked beside the rivals
    assert f"prompts on {tiny}," in checked.stdout


@pytest.mark.slow
def test_lm_eval_runs_the_installed_example_beside_freedave_lossless(tmp_path, capsys):
    """The issue's line: the example's row is printed, lossless 1.000, beside FreeDave's."""
    installed_lookup()
    args = f"methods=lookup@4+freedave@4,device=cpu,threads=1,mlflow_tracking_uri=sqlite:///{tmp_path}/m.db,output_dir={tmp_path}/run"
    run = run_lm_eval_here(capsys, "--model", "spot", "--model_args", args, "--tasks", "spot_mbpp", "--include_path",
                           str(ROOT / "tasks"), "--apply_chat_template", "--confirm_run_unsafe_code", "--limit", "2",
                           cwd=tmp_path, env={"HF_ALLOW_CODE_EVAL": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {line.split()[1]: line.split() for line in run.stdout.splitlines() if line.startswith("spot_mbpp ")}
    assert rows["lookup@4"][-1] == "1.000" and rows["freedave@4"][-1] == "1.000", run.stdout
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())["methods"]["lookup"]
    assert recorded["origin"] == "package spot-eval-prompt-lookup 0.1.0" and recorded["display"] == "Prompt lookup"


def test_a_method_that_drafts_longer_than_its_verifies_take_gets_a_warning_with_its_share():
    import pandas as pd

    from spot_eval.harness.session import slow_drafter_lines

    table = pd.DataFrame([
        {"task": "t", "label": "draft_free", "seconds": 1.0, "drafter_seconds": 0.0, "target_seconds": 0.9},
        {"task": "t", "label": "slow@4", "seconds": 2.0, "drafter_seconds": 1.2, "target_seconds": 0.7},
        {"task": "t", "label": "quick@4", "seconds": 1.0, "drafter_seconds": 0.1, "target_seconds": 0.8},
    ])
    [line] = slow_drafter_lines(table)
    assert line.startswith("spot-eval: WARNING slow@4 on t: drafting took 60% of its wall time") and "(35%)" in line
    assert slow_drafter_lines(table.drop(columns="target_seconds")) == []  # results from before target_seconds was kept
