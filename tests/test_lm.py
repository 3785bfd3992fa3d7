"""`lm_eval --model spot`: the real console script, the model contract, and the losslessness diff."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from conftest import SPOT_TASKS, existing_store, run_lm_eval_here, write_checkpoint
from lm_eval.api.instance import Instance
from mlflow import MlflowClient

from spot import DecodeConfig, generate
from spot.policy import Margins
from spot_eval.harness.lm import SpotArgs, SpotLM
from spot_eval.harness.lossless import diverge, first_difference
from spot_eval.harness.methods import parse_methods
from spot_eval.harness.session import RequestRecord
from spot_eval.reports.regression import describe
from spot_eval.reports.results import read_run

REPO = Path(__file__).resolve().parents[1]
OFFLINE = {**{k: v for k, v in os.environ.items() if k != "HF_ALLOW_CODE_EVAL"}, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch):
    """Every SpotLM of these tests opens its MLflow store and run directory in its own folder, never a shared one."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return str(write_checkpoint(tmp_path_factory.mktemp("lm") / "ckpt"))


@pytest.mark.slow
def test_the_real_lm_eval_console_script_runs_every_task_offline_into_one_mlflow_run(checkpoint, tmp_path):
    """The `lm_eval` console script with `--model spot`, strictly offline and with an empty HF cache, on all four
    tasks (the code tasks score in the sandbox without `evaluate`, so scoring needs no hub): every task scores, and
    the run's records, outcomes and one MLflow run (accuracy included) are complete. No device= in the model_args:
    lm-eval's own default (cuda:0) falls back to the CPU on a machine without CUDA, in one line. The run's last lines
    are its summary and the pointers to its files, after lm-eval's table. `python -m lm_eval` (the start-up
    registration under -m) runs under accelerate in tests/test_parallel.py and tests/test_nightly.py."""
    existing_store(tmp_path)  # the run's default store, ./mlflow.db
    lm_eval = shutil.which("lm_eval", path=str(Path(os.sys.executable).parent))
    args = f"pretrained={checkpoint},methods=oracle+random,budgets=4,gen_length=32,temperature=1.0"
    run = subprocess.run(
        [lm_eval, "--model", "spot", "--model_args", args, "--tasks", "spot_all", "--include_path", str(REPO / "tasks"),
         "--limit", "2", "--confirm_run_unsafe_code", "--output_path", str(tmp_path / "out"), "--log_samples"],
        capture_output=True, text=True, env={**OFFLINE, "HF_EVALUATE_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")},
        cwd=tmp_path, timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    table = run.stdout.replace(" ", "")
    assert all(f"{name}|1|" in table for name in SPOT_TASKS), run.stdout  # lm-eval's table: every task scored
    assert "|Tasks|Version|Filter|n-shot|Metric|" in table, run.stdout  # with its own headers (pyproject.toml)
    assert "draft_free" in run.stdout  # the spot model's own summary
    if not torch.cuda.is_available():
        [fallback] = [line for line in run.stderr.splitlines() if "device" in line and "usable" in line]
        assert fallback.startswith("warning: lm-eval's device 'cuda:0' is not usable here") and "decoding on cpu" in fallback
    # The last lines: the summary (after lm-eval's table), the run directory and the MLflow command.
    lines = run.stdout.rstrip("\n").splitlines()
    assert lines[-2].startswith("spot-eval: samples and summary in spot-eval-runs/"), lines[-12:]
    assert lines[-1].startswith("spot-eval: MLflow run ") and "mlflow ui --backend-store-uri sqlite:///" in lines[-1]
    assert run.stdout.index("), gen_kwargs: (") < run.stdout.index("forward_ratio  throughput_ratio")  # lm-eval's first
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())
    assert "exact_match,strict-match" in results["results"]["spot_gsm8k"]
    assert results["config"]["spot"]["methods"] == ["oracle@4", "random@4"]
    samples = [json.loads(line) for line in next(tmp_path.glob("spot-eval-runs/*/samples.jsonl")).open()]
    assert {(s["task"], s["label"]) for s in samples} == {(t, m) for t in SPOT_TASKS for m in ("draft_free", "oracle@4", "random@4")}
    assert all(s["lossless"] for s in samples) and len(samples) == 4 * 2 * 3  # tasks x documents x labels
    run_dir = next(tmp_path.glob("spot-eval-runs/*"))
    run_json = json.loads((run_dir / "run.json").read_text())
    assert run_json["decoder"]["gen_length"] == 32
    assert run_json["sandbox"] == {"seccomp": True, "landlock_abi": run_json["sandbox"]["landlock_abi"], "namespaces": True,
                                   "disk_bytes": 64 << 20, "own_uid": True, "gaps": []}
    outcomes = [json.loads(line) for line in (run_dir / "outcomes.jsonl").open()]
    assert {(o["doc_id"], o["filter"], o["metric"]) for o in outcomes if o["task"] == "spot_gsm8k"} == {
        (d, f, "exact_match") for d in (0, 1) for f in ("strict-match", "flexible-extract")}
    assert {o["task"] for o in outcomes} == set(SPOT_TASKS)
    bundle = read_run(run_dir)
    assert len(bundle.samples) == 24 and bundle.settings["block_length"] == 16 and bundle.settings["target"].startswith("ckpt@")
    # Everything landed in one MLflow run of the local store, accuracy included.
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    [parent] = client.search_runs(
        [client.get_experiment_by_name("spot-eval").experiment_id], "tags.mlflow.runName = 'spot-eval'"
    )
    assert "spot_gsm8k/exact_match_strict-match" in parent.data.metrics
    assert parent.data.params["model_args/methods"] == "oracle+random"
    assert parent.data.params["sandbox/seccomp"] == "True" and int(parent.data.params["sandbox/landlock_abi"]) >= 1
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    by_name = {c.info.run_name: c.data.metrics for c in children}
    assert set(by_name) == {"draft_free", "oracle@4", "random@4"}
    assert by_name["oracle@4"]["spot_gsm8k/lossless"] == 1.0 and by_name["oracle@4"]["spot_gsm8k/forward_ratio"] > 1.0
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "spot-eval")}
    assert {"spot-eval/samples.jsonl", "spot-eval/throughput_ratio.png", "spot-eval/forward_ratio.png",
            "spot-eval/lm_eval_results.json"} <= artifacts  # the run's plots beside its files


def run_lm_eval(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    lm_eval = shutil.which("lm_eval", path=str(Path(os.sys.executable).parent))
    return subprocess.run([lm_eval, *args], capture_output=True, text=True, env=OFFLINE, cwd=cwd, timeout=600)


def lm_eval_runs_losslessly(capsys, pretrained: Path, tmp_path: Path) -> None:
    """`lm_eval --model spot` on spot_gsm8k --limit 2 with two drafters: every sample lossless."""
    args = f"pretrained={pretrained},methods=oracle+random,budgets=4,gen_length=32,device=cpu,threads=1"
    existing_store(tmp_path)  # the run's default store, ./mlflow.db
    run = run_lm_eval_here(capsys, "--model", "spot", "--model_args", args, "--tasks", "spot_gsm8k", "--include_path",
                           str(REPO / "tasks"), "--limit", "2", "--output_path", str(tmp_path / "out"), cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())
    assert "exact_match,strict-match" in results["results"]["spot_gsm8k"]
    samples = [json.loads(line) for line in next(tmp_path.glob("spot-eval-runs/*/samples.jsonl")).open()]
    assert len(samples) == 6 and all(s["lossless"] for s in samples)


@pytest.mark.slow
def test_samples_are_recorded_by_their_index_in_the_split_and_decode_the_same_in_any_selection(checkpoint, tmp_path, capsys):
    """lm-eval numbers --samples' documents 0, 1, ... (results/comparison/*-more.toml selects items 40 on): the records
    keep the split's index, and so does the noise key, so document 5 decodes the same at T = 1 alone or beside 3."""
    args = f"pretrained={checkpoint},methods=,budgets=,gen_length=16,temperature=1.0,device=cpu,threads=1"
    got = {}
    for chosen in ([3, 5], [5]):
        cwd = tmp_path / "-".join(map(str, chosen))
        existing_store(cwd)
        run = run_lm_eval_here(capsys, "--model", "spot", "--model_args", args, "--tasks", "spot_gsm8k", "--include_path",
                               str(REPO / "tasks"), "--samples", json.dumps({"spot_gsm8k": chosen}), cwd=cwd)
        assert run.returncode == 0, run.stderr[-3000:]
        records = [json.loads(line) for line in next(cwd.glob("spot-eval-runs/*/samples.jsonl")).open()]
        assert sorted(r["doc_id"] for r in records) == chosen
        got[tuple(chosen)] = {r["doc_id"]: (r["request"], r["token_ids"]) for r in records}
    assert got[(3, 5)][5] == got[(5,)][5]


@pytest.mark.slow
def test_use_cache_resumes_and_refuses_another_decoder_config(checkpoint, tmp_path, capsys):
    common = ["--model", "spot", "--tasks", "spot_gsm8k", "--include_path", str(REPO / "tasks"), "--limit", "2",
              "--use_cache", str(tmp_path / "cache")]
    args = f"pretrained={checkpoint},methods=,budgets=,gen_length=32,device=cpu"
    existing_store(tmp_path)  # the run's default store, ./mlflow.db
    first = run_lm_eval_here(capsys, *common, "--model_args", args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    again = run_lm_eval_here(capsys, *common, "--model_args", args, cwd=tmp_path)
    assert again.returncode == 0 and "Cached requests: 2" in again.stderr
    other = run_lm_eval_here(capsys, *common, "--model_args", args + ",block_length=32", cwd=tmp_path)
    assert other.returncode == 2 and "written under other settings (block_length: 16 there, 32 here); use a separate --use_cache path" in other.stderr


@pytest.mark.slow
def test_code_tasks_need_the_unsafe_code_flag_before_the_model_loads(tmp_path):
    """The consents are checked first, ours and lm-eval's code tasks alike: a pretrained= that does not exist is
    never reached."""
    run = run_lm_eval("--model", "spot", "--model_args", f"pretrained={tmp_path / 'no-such-model'},device=cpu",
                      "--tasks", "spot_all,humaneval", "--include_path", str(REPO / "tasks"), "--limit", "1", cwd=tmp_path)
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert run.returncode == 2 and len(errors) == 1 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert "spot_humaneval, spot_mbpp, humaneval run model-written code" in errors[0] and "add --confirm_run_unsafe_code" in errors[0]
    assert "humaneval need HF_ALLOW_CODE_EVAL=1" in errors[0]
    assert "pretrained" not in run.stderr.split("error:")[-1]


@pytest.mark.slow
def test_bad_model_args_are_one_clear_line(checkpoint, tmp_path, capsys):
    run = run_lm_eval_here(capsys, "--model", "spot", "--model_args", f"pretrained={checkpoint},methods=nope,device=cpu",
                           "--tasks", "spot_gsm8k", "--include_path", str(REPO / "tasks"), "--limit", "1", cwd=tmp_path)
    assert run.returncode == 2
    assert "error: unknown method 'nope'" in run.stderr and "Traceback" not in run.stderr


def make_lm(checkpoint: str, **overrides) -> SpotLM:
    args = {"pretrained": checkpoint, "methods": "oracle+random", "budgets": "3", "gen_length": 32, "device": "cpu"}
    return SpotLM(**{**args, **overrides})


def request(context: str, doc_id: int, until=("t5",)) -> Instance:
    return Instance("generate_until", {}, (context, {"until": list(until), "max_gen_toks": 32}), 0, ("task", doc_id, 2))


def test_generate_until_returns_the_draft_free_text_cut_at_until(checkpoint, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lm = make_lm(checkpoint, temperature=0.0)
    context = "t1 t2 t3 t4 t7 t9"
    ids = lm.target.tokenizer(context, add_special_tokens=False)["input_ids"]
    full = generate(lm.target, ids, DecodeConfig(block_length=16, gen_length=32), decode=lm.target.tokenizer.decode)
    stop = full.text.split()[3]
    [text] = lm.generate_until([request(context, 0, until=(stop,))])
    assert text == full.text[: full.text.find(stop)]
    rows = lm.session.frame()
    assert set(rows["label"]) == {"draft_free", "oracle@3", "random@3"} and rows["lossless"].all()


def test_repeats_differ_but_reproduce_from_the_seed(checkpoint, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    req = request("t1 t2 t3", 7, until=())
    first = make_lm(checkpoint, temperature=1.0, seed=3, methods="", budgets="").generate_until([req, req, req])
    again = make_lm(checkpoint, temperature=1.0, seed=3, methods="", budgets="").generate_until([req, req, req])
    assert first == again
    assert len(set(first)) > 1  # the same Instance three times gets three different draws


def test_the_cache_hook_sees_every_request_and_model_info_names_the_config(checkpoint, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lm = make_lm(checkpoint)
    seen = []
    lm.cache_hook.add_partial = lambda attr, args, res: seen.append((attr, args[0], res))
    out = lm.generate_until([request("t1 t2", 0), request("t3 t4", 1)])
    assert [s[2] for s in seen] == out and seen[0][0] == "generate_until"
    info = lm.get_model_info()["spot"]
    assert info["decoder"]["block_length"] == 16 and info["methods"] == ["oracle@3", "random@3"]


class DictCache:
    """lm-eval's CacheHook over a plain dict (its `dbdict` is a SqliteDict with the same interface)."""

    def __init__(self, dbdict: dict) -> None:
        self.dbdict = dbdict

    def add_partial(self, attr, req, res) -> None:
        pass


@pytest.mark.parametrize(("overrides", "named"), [
    ({"methods": "random", "budgets": "4"}, 'methods: ["oracle@3", "random@3"] there, ["random@4"] here'),
    ({"temperature": 1.0}, "temperature: 0.0 there, 1.0 here"), ({"seed": 7}, "seed: 0 there, 7 here"),
    ({"dtype": "bfloat16"}, 'dtype: "float32" there, "bfloat16" here'), ({"exact": True}, "exact: false there, true here"),
    ({"unmasking": "threshold"}, 'policy: "single" there, "threshold" here'), ({"gen_length": 64}, "gen_length: 32 there, 64 here"),
])
def test_a_cache_written_under_other_settings_is_refused_naming_them(checkpoint, overrides, named):
    store: dict = {}
    make_lm(checkpoint).set_cache_hook(DictCache(store))
    make_lm(checkpoint).set_cache_hook(DictCache(store))  # the same settings: reused
    with pytest.raises(ValueError, match="written under other settings") as err:
        make_lm(checkpoint, **overrides).set_cache_hook(DictCache(store))
    assert named in str(err.value)


def test_records_kept_in_the_cache_come_back_as_they_were(checkpoint):
    lm, store = make_lm(checkpoint), {}
    lm.set_cache_hook(DictCache(store))
    lm.generate_until([request("t1 t2", 0)])
    [kept] = [v for k, v in store.items() if k.startswith("spot-eval/record/")]
    [decoded] = lm.session.records
    assert RequestRecord.from_json(kept) == replace(decoded, resumed=True)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"methods": "spott"}, "unknown method 'spott'"),
        ({"methods": "", "budgets": "8"}, "budgets=8 given without a drafter-based method"),
        ({"gen_length": 8}, "gen_length 8 is below one block"),
        ({"methods": "spot", "spot_gamma": ""}, r"list items are joined with '\+'"),
        ({"methods": "oracle@0"}, "budget must be >= 1"),
        ({"methods": "spot:/nowhere.pt"}, "does not exist"),
        ({"dtype": "int4"}, "unknown dtype"),
        ({"exact": "ture"}, "exact='ture' is not a boolean; write exact=true or exact=false"),
        ({"fail_on_divergence": "ture"}, "fail_on_divergence='ture' is not a boolean"),
        ({"cache": "duel"}, "unknown cache 'duel'; choose one of dual, prefix, none, nosuffix"),
        ({"cache": "none"}, "cache='none' applies to bidirectional targets"),
        ({"parallelize": "true"}, "parallelize=true spreads the target over GPUs, and this run decodes on the CPU"),
        ({"device_map": "sequential", "max_cpu_memory": "100"}, r"keeps 1 module\(s\) on disk \(the whole model\)"),
    ],
)
def test_bad_model_args(checkpoint, overrides, message):
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        make_lm(checkpoint, **overrides)


def test_the_default_device_is_one_this_machine_has(checkpoint, recwarn):
    lm = make_lm(checkpoint, methods="", budgets="", device="auto")
    assert lm.target.device.type == ("cuda" if torch.cuda.is_available() else "cpu") and not recwarn.list
    assert lm.args.device == "auto" and SpotArgs().device == "auto"


def test_method_items_expand_over_budgets():
    specs = parse_methods("oracle+random@2", "8+20")
    assert [s.label for s in specs] == ["oracle@8", "oracle@20", "random@2"]
    assert SpotArgs.parse({"reference": "False"}).reference is False
    assert SpotArgs.parse({"exact": True}).exact is True and SpotArgs.parse({"exact": "no"}).exact is False


def test_first_difference_and_the_decision_that_flipped_at_a_divergence(checkpoint):
    assert first_difference((1, 2, 3), (1, 2, 3)) is None
    assert first_difference((1, 9, 3), (1, 2, 3)) == 1
    assert first_difference((1, 2), (1, 2, 3)) == 2
    lm = make_lm(checkpoint, methods="", budgets="")
    ids, config = [1, 2, 3], DecodeConfig(block_length=16, gen_length=20)
    reference = generate(lm.target, ids, config, record=True, record_margins=True)
    mask = lm.target.mask_id
    assert diverge(reference, reference, config, mask) is None
    trace = reference.trajectory[0]
    before, after, proposal = trace.states[2], trace.states[3], trace.proposals[2]
    written = int((after != before).nonzero()[0])
    elsewhere = int(((before == mask) & (torch.arange(16) != written)).nonzero()[-1])

    def run_that_took(state: torch.Tensor):
        """A run equal to draft-free up to step 2, which moved to `state` instead."""
        states = torch.cat([trace.states[:3], state[None]])
        tokens = tuple(t for t in state.tolist() if t != mask)[len(ids):]
        return replace(reference, token_ids=tokens, trajectory=(replace(trace, states=states),))

    # Another position committed, with the token the draft-free step proposed there: the position decision.
    moved = before.clone()
    moved[elsewhere] = proposal.tokens[elsewhere]
    d = diverge(run_that_took(moved), reference, config, mask)
    assert (d.block, d.step, d.flipped) == (trace.block, 2, "position")
    log_c = proposal.confidence.log()
    assert d.margin == pytest.approx(float(log_c[written] - log_c[elsewhere])) and d.margin >= d.margins.position >= 0
    # The draft-free position with another token: the token decision, at that position's lead.
    retoken = after.clone()
    retoken[written] = (int(after[written]) + 1) % mask
    d = diverge(run_that_took(retoken), reference, config, mask)
    assert d.flipped == "token" and d.margin == float(proposal.token_margin[written])
    assert "the token decision flipped" in describe(asdict(d))


def test_a_divergence_is_logged_then_ends_the_run_naming_the_request(tmp_path):
    from spot_eval.harness.lossless import Divergence, MethodRecord
    from spot_eval.harness.session import RequestRecord, Session
    from spot_eval.tracking.writer import NullTracker

    def record(label: str, tokens: tuple[int, ...], divergence=None) -> MethodRecord:
        return MethodRecord(label, 0 if label == "draft_free" else 4, tokens, 5, 5, 1.0, 0.9, 0.0, (1,) * 5, divergence)

    margins = Margins(position=0.002, threshold=None, token=1.5)
    methods = [record("draft_free", (1, 2, 3)), record("spot", (1, 9, 3), Divergence(1, 0, 4, "position", 0.002, margins))]
    session = Session(SpotArgs(fail_on_divergence=True), {}, NullTracker(), out_dir=tmp_path / "run")
    session.add(RequestRecord("spot_gsm8k", 7, 0, 123, "abc", "t1", methods))
    with pytest.raises(SystemExit, match=r"spot_gsm8k doc 7 \(repeat 0\) spot@4: first divergent token 1; block 0 step 4: "
                       r"the position decision flipped \(margin 0.002; the step's margins: position 0.002, token 1.5\)"):
        session.finish({"results": {}})
    rows = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").open()]
    assert [r["lossless"] for r in rows] == [True, False]  # written before the run ended
    Session(SpotArgs(fail_on_divergence=False), {}, NullTracker(), out_dir=tmp_path / "quiet").finish(None)


def test_a_run_directory_that_cannot_be_written_mid_run_loses_nothing(tmp_path, monkeypatch):
    from spot_eval.harness.lossless import MethodRecord
    from spot_eval.harness.session import RequestRecord, Session
    from spot_eval.tracking.writer import NullTracker

    monkeypatch.chdir(tmp_path)
    methods = [MethodRecord(label, budget, (1, 2, 3), 5, 5, 1.0, 0.9, 0.0, (1,) * 5, None)
               for label, budget in (("draft_free", 0), ("spot", 8))]
    session = Session(SpotArgs(), {}, NullTracker(), out_dir=tmp_path / "run")
    session.add(RequestRecord("spot_gsm8k", 0, 0, 1, "abc", "t1", methods))
    session.flush()  # after a generate_until batch
    shutil.rmtree(tmp_path / "run")
    (tmp_path / "run").write_text("someone else's file")  # the run directory is gone mid-run (root ignores chmod)
    with pytest.warns(RuntimeWarning, match="cannot be written; writing the run to"), pytest.raises(
        SystemExit, match=r"the run directory .*/run \(.*\) could not be written; every file of the run is in .*spot-eval-unsaved"
    ):
        session.finish({"results": {"spot_gsm8k": {"exact_match,strict-match": 0.0}}})
    [saved] = (tmp_path / "spot-eval-unsaved").iterdir()
    assert {"run.json", "samples.jsonl", "summary.csv", "lm_eval_results.json"} <= {p.name for p in saved.iterdir()}
    assert len((saved / "samples.jsonl").read_text().splitlines()) == 2
    assert not (saved / "outcomes.jsonl").exists()  # no per-sample scores without --log_samples: no empty file
    assert (tmp_path / "run").read_text() == "someone else's file"
