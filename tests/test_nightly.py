"""`spot-eval nightly` end to end: the real console scripts, the embedded target, a real MLflow store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import existing_store, run_cli
from mlflow import MlflowClient

from spot_eval.checkpoints.drafter import load_checkpoint, save_checkpoint
from spot_eval.reports.nightly import NightlyError, find_baseline, lm_eval_command, load_suite

REPO = Path(__file__).resolve().parents[1]
SPOT_EVAL = str(Path(sys.executable).parent / "spot-eval")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def suite_file(path: Path, methods: str) -> Path:
    path.write_text(
        f'name = "test"\nexperiment = "nightly-test"\ntasks = ["spot_gsm8k"]\ninclude_path = "{REPO / "tasks"}"\n'
        f'limit = 2\nmethods = "{methods}"\ntemperatures = [0.0]\nseeds = [0]\ngen_length = 32\n'
        'model_args = "device=cpu"\n[tolerances]\nthroughput_drop = 0.9\nforward_rise = 0.0\n'
    )
    return path


def nightly(tmp_path: Path, suite: Path, date: str, *extra: str, capsys=None):
    """`spot-eval nightly`: the real console script, or (given capsys) in this process; its lm_eval runs are
    real commands either way."""
    args = ["nightly", "--suite", str(suite), "--out", str(tmp_path / "reports"), "--date", date,
            "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", *extra]
    if capsys is not None:
        return run_cli(capsys, *args)
    return subprocess.run([SPOT_EVAL, *args], capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=900)


@pytest.mark.slow
def test_nightly_passes_and_flags_a_degraded_drafter_against_the_last_pass(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    existing_store(tmp_path)  # the store every nightly below logs to
    good = suite_file(tmp_path / "good.toml", "spot@8")
    # The first night through the console script (several processes: test_a_suites_processes_run_lm_eval_under_accelerate_launch).
    first = nightly(tmp_path, good, "d1")
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.startswith("PASS") and "no earlier passing nightly" in first.stdout
    report = tmp_path / "reports" / "d1"
    assert {"report.md", "report.html", "nightly.json", "throughput_ratio.png", "accepted_lengths.png"} <= {
        p.name for p in report.iterdir()}
    page = (report / "report.html").read_text()
    assert "data:image/png;base64," in page and 'class="dataframe table2"' in page and "<h2>Verdict</h2>" in page
    samples = [json.loads(line) for line in (report / "runs" / "T0-seed0" / "samples.jsonl").open()]
    assert sorted((s["doc_id"], s["label"]) for s in samples) == [(d, m) for d in (0, 1) for m in ("draft_free", "spot@8")]
    assert max(s["tokens"] for s in samples) <= 32  # the suite's gen_length caps the task's own max_gen_toks (256)

    # The same method and label with a drafter whose order model is negated: it drafts the least likely orders.
    shipped = load_checkpoint(REPO / "spot_eval" / "assets" / "drafters" / "spot_b32.pt")
    with __import__("torch").no_grad():
        shipped.model.head.weight.neg_()
    save_checkpoint(tmp_path / "degraded.pt", shipped.model, shipped.fingerprint, {})
    bad = suite_file(tmp_path / "bad.toml", f"spot@8:{tmp_path / 'degraded.pt'}")
    flagged = nightly(tmp_path, bad, "d3", capsys=capsys)
    assert flagged.returncode == 1, flagged.stderr[-3000:]
    assert flagged.stdout.startswith("REGRESSION") and "forwards at T=0 spot_gsm8k spot@8" in flagged.stdout
    assert "against the baseline (nightly run" in flagged.stdout  # d1's, found in MLflow
    assert "trend.png" in {p.name for p in (tmp_path / "reports" / "d3").iterdir()}
    assert "forwards" in (tmp_path / "reports" / "d3" / "report.md").read_text()
    dry = nightly(tmp_path, bad, "d3", "--dry-run", capsys=capsys)  # the same night again: its runs are kept, not decoded again
    assert dry.returncode == 0 and dry.stdout.startswith("REGRESSION") and "already finished, kept" in dry.stderr

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name("nightly-test").experiment_id
    nightlies = client.search_runs([experiment], "tags.`spot_eval.kind` = 'nightly'", order_by=["attributes.start_time ASC"])
    assert [r.info.status for r in nightlies] == ["FINISHED", "FAILED", "FAILED"]
    assert {a.path for a in client.list_artifacts(nightlies[0].info.run_id, "nightly")} >= {
        "nightly/nightly.json", "nightly/report.html", "nightly/report.md"}

    # `compare` reads the same evaluations back from MLflow, or from the results files when MLflow is down.
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    table = run_cli(capsys, "compare", "--experiment", "nightly-test", "--tracking-uri", uri, "--out", str(tmp_path / "cmp"))
    assert table.returncode == 0, table.stderr[-2000:]
    text = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| method | gsm8k: tput × |" in text and "\n| SPOT @8 | " in text and "seeds 0" in text
    empty = run_cli(capsys, "compare", "--experiment", "no-such", "--tracking-uri", uri)
    assert empty.returncode == 2 and "does not exist" in empty.stderr and "Traceback" not in empty.stderr
    down = run_cli(capsys, "compare", "--experiment", "nightly-test", "--tracking-uri", "http://127.0.0.1:9",
                   "--results", str(tmp_path / "reports" / "d1" / "nightly.json"), "--out", str(tmp_path / "cmp2"))
    assert down.returncode == 0 and "unreachable" in down.stderr and (tmp_path / "cmp2" / "compare.csv").exists() is False
    assert (tmp_path / "cmp2" / "compare_T0.csv").exists()


def test_a_corrupt_pinned_baseline_fails_before_any_decoding(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "baseline.json").write_text('{"format": "spot-eval-results/1", "samples": [')
    run = nightly(tmp_path, suite_file(tmp_path / "s.toml", "spot@8"), "d1", "--baseline", str(tmp_path / "baseline.json"),
                  capsys=capsys)
    assert run.returncode == 2 and "baseline.json is corrupt" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "reports" / "d1" / "runs").exists()


def test_suite_files_are_validated(tmp_path):
    assert load_suite(None).experiment == "spot-nightly"
    for text, message in [("name = ", "not valid TOML"), ('colour = "red"', "unknown keys colour"),
                          ('name="x"\nexperiment="e"\ntasks=[]\ninclude_path="t"\nlimit=1\nmethods="spot"\n'
                           "temperatures=[0]\nseeds=[0]\ngen_length=8", "at least one task"),
                          ('name="my suite"\nexperiment="e"\ntasks=["t"]\ninclude_path="t"\nlimit=1\nmethods="spot"\n'
                           "temperatures=[0]\nseeds=[0]\ngen_length=8", "suite name 'my suite'")]:
        (tmp_path / "s.toml").write_text(text)
        with pytest.raises(NightlyError, match=message):
            load_suite(tmp_path / "s.toml")
    with pytest.raises(NightlyError, match="does not exist"):
        load_suite(tmp_path / "missing.toml")


def test_the_baseline_is_the_last_passing_nightly_of_the_same_suite(tmp_path):
    """Two suites sharing an experiment (the committed comparison's single-t0 and single-t1) never baseline each other."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("shared", artifact_location=str(tmp_path / "artifacts"))
    ids = {}
    for suite, regressed in (("single-t0", "false"), ("single-t1", "false"), ("single-t0", "true")):  # the newest t0 nightly regressed
        run = client.create_run(experiment, tags={"spot_eval.kind": "nightly", "spot_eval.suite": suite, "spot_eval.reports.regression": regressed})
        client.log_artifact(run.info.run_id, str(REPO / "results" / "comparison" / suite / "nightly.json"), "nightly")
        client.set_terminated(run.info.run_id, "FINISHED")
        ids.setdefault(suite, run.info.run_id)
    for suite, temperature in (("single-t0", 0.0), ("single-t1", 1.0)):
        bundle, described = find_baseline(None, uri, "shared", suite)
        assert set(bundle.samples.temperature) == {temperature} and ids[suite] in described
    bundle, described = find_baseline(None, uri, "shared", "nightly")
    assert bundle is None and "no earlier passing nightly of suite 'nightly'" in described


def test_a_suites_processes_run_lm_eval_under_accelerate_launch(tmp_path):
    """Several processes: `accelerate launch --multi_gpu` (gloo without GPUs), the launch tests/test_parallel.py
    runs for real and checks against one process."""
    suite = replace(load_suite(None), num_processes=2)
    command = lm_eval_command(suite, 0.0, 0, tmp_path, None)
    assert Path(command[0]).name == "accelerate"
    assert command[1:7] == ["launch", "--multi_gpu", "--num_processes", "2", "-m", "lm_eval"]
    assert Path(lm_eval_command(load_suite(None), 0.0, 0, tmp_path, None)[0]).name == "lm_eval"


def test_a_suite_picks_each_tasks_items(tmp_path):
    """One count for every task from the first item is lm_eval's --limit; counts per task, or a later first item (a
    suite that extends an earlier one, results/comparison/*-more.toml), are --samples with each task's indices."""
    suite = replace(load_suite(None), tasks=("a", "b"), limit=3)
    command = lm_eval_command(suite, 0.0, 0, tmp_path, None)
    assert command[command.index("--limit") + 1] == "3" and "--samples" not in command
    for limit, start, picked in [({"a": 2, "b": 1}, 0, {"a": [0, 1], "b": [0]}),
                                 ({"a": 2, "b": 1}, 40, {"a": [40, 41], "b": [40]}),
                                 (2, {"a": 5, "b": 0}, {"a": [5, 6], "b": [0, 1]})]:
        command = lm_eval_command(replace(suite, limit=limit, start=start), 0.0, 0, tmp_path, None)
        assert json.loads(command[command.index("--samples") + 1]) == picked and "--limit" not in command
    with pytest.raises(NightlyError, match=r"limit names tasks \['a'\] but the suite runs \['a', 'b'\]"):
        replace(suite, limit={"a": 2})
    with pytest.raises(NightlyError, match="start must be >= 0"):
        replace(suite, start=-1)
    with pytest.raises(NightlyError, match="limit, gen_length.* must be >= 1"):
        replace(suite, limit={"a": 0, "b": 1})
    # the committed extensions load, and with their suite take each task's items without a gap or an overlap
    ranges: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for path in sorted((REPO / "results/comparison").glob("*.toml")):
        suite = load_suite(path)
        for task in suite.tasks:
            ranges.setdefault((path.stem.split("-more")[0], task), []).append((suite.first(task), suite.first(task) + suite.count(task)))
    assert sum(len(r) for r in ranges.values()) > len(ranges)  # some suite is extended
    for (base, task), spans in ranges.items():
        spans.sort()
        assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False)), (base, task, spans)


def test_a_suites_batch_size_reaches_lm_eval(tmp_path):
    suite = replace(load_suite(None), batch_size=4)
    command = lm_eval_command(suite, 0.0, 0, tmp_path, None)
    assert command[command.index("--batch_size") + 1] == "4"
    assert load_suite(None).batch_size == 1
    with pytest.raises(NightlyError, match="batch_size must be >= 1"):
        replace(suite, batch_size=0)
