"""Tracking against real MLflow stores, no mocks: the embedded sqlite store, a real `mlflow server` in a
subprocess, a server that is down from the start, and one killed mid-run; the last two go through the
spool and `spot-eval sync`, and every run is read back with `MlflowClient`."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import Server, free_port, lm_eval_spot, write_checkpoint
from mlflow import MlflowClient

from spot_eval.cli import main
from spot_eval.tracking import writer
from spot_eval.tracking.spool import Spool
from spot_eval.tracking.sync import sync
from spot_eval.tracking.writer import (
    LEADING_COLUMNS,
    MAX_EXPERIMENT_TAG,
    NOTE,
    VIEW_TAG,
    InputDataset,
    NullTracker,
    Tracker,
    TrackingConfig,
    header_width,
    open_tracker,
    resume,
    runs_view,
    safe_name,
)

ROOT = Path(__file__).resolve().parents[1]
ACCURACY = "gsm8k/exact_match_strict-match"  # safe_name("gsm8k/exact_match,strict-match")
GSM8K = InputDataset("gsm8k", "0123456789abcdef", "hugging_face", '{"path": "openai/gsm8k", "config_name": "main"}',
                     '{"documents": 2, "limit": 2}')
VIEW = ("toy: gsm8k | spot@8", ["gsm8k/throughput_ratio", "gsm8k/exact_match,strict-match"])


def _log_evaluation(tracker: Tracker, files: Path, midway: Callable[[], None] = lambda: None) -> str:
    """What an evaluation logs: params, a draft-free and a speculative nested run, and the accuracy
    that lm-eval computes after generation, logged by run id. `midway` runs between two steps."""
    (files / "plots").mkdir()
    (files / "plots" / "accepted_lengths.png").write_bytes(b"\x89PNG fake")
    (files / "samples.jsonl").write_text('{"doc_id": 0, "output": "42"}\n')
    (files / "results.json").write_text('{"results": {"gsm8k": {"exact_match,strict-match": 0.25}}}')
    tracker.log_params({"model_args": "target=toy,budget=8", "lm_eval_version": "0.4.13"})
    tracker.log_inputs([GSM8K])
    assert tracker.save_view(*VIEW) == runs_view(*VIEW)[0]
    with tracker.child("draft_free") as run:
        run.log_metrics({"gsm8k/target_forwards": 120.0})
        run.log_artifact(files / "samples.jsonl", "samples")
    spot = tracker.child("spot@8")
    spot.log_params({"budget": 8})
    spot.log_metrics({"gsm8k/accepted_length_mean": 2.0}, step=0)
    midway()
    spot.log_metrics({"gsm8k/accepted_length_mean": 3.0, "gsm8k/throughput_ratio": 1.5}, step=1)
    spot.log_artifact(files / "plots")
    spot.end()
    run_id = tracker.run_id
    assert run_id is not None
    resume(run_id).log_metrics({"gsm8k/exact_match,strict-match": 0.25})
    resume(run_id).log_artifact(files / "results.json")
    resume(run_id).end()
    return run_id


def _check_evaluation(client: MlflowClient, run_id: str, tmp_path: Path) -> None:
    """Everything `_log_evaluation` logged is in the run `run_id` and its nested runs."""
    parent = client.get_run(run_id)
    assert parent.info.status == "FINISHED" and parent.info.run_name == "spot-eval"
    assert parent.data.params["model_args"] == "target=toy,budget=8" and "git_commit" in parent.data.params
    assert parent.data.metrics == {ACCURACY: 0.25}
    view = json.loads(client.get_experiment(parent.info.experiment_id).tags[VIEW_TAG + runs_view(*VIEW)[0]])
    picked = ["metrics.`gsm8k/throughput_ratio`", f"metrics.`{ACCURACY}`"]
    assert view["name"] == VIEW[0] and json.loads(view["state"]) == {
        "selectedColumns": ["attributes.`Dataset`", *picked], "columnOrder": [*LEADING_COLUMNS, *picked],
        "columnWidths": {c: header_width(c) for c in picked}}
    [logged] = parent.inputs.dataset_inputs
    assert InputDataset(**{k: getattr(logged.dataset, k) for k in ("name", "digest", "source_type", "source", "profile", "schema")},
                        context=logged.tags[0].value) == GSM8K and [t.key for t in logged.tags] == ["mlflow.data.context"]
    results = client.download_artifacts(run_id, "results.json", str(tmp_path))
    assert "exact_match,strict-match" in Path(results).read_text()
    nested = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'")
    runs = {run.info.run_name: run for run in nested}
    assert set(runs) == {"draft_free", "spot@8"}
    assert all(run.info.status == "FINISHED" for run in nested)
    draft_free, spot = runs["draft_free"].info.run_id, runs["spot@8"].info.run_id
    assert runs["draft_free"].data.metrics == {"gsm8k/target_forwards": 120.0}
    assert [a.path for a in client.list_artifacts(draft_free, "samples")] == ["samples/samples.jsonl"]
    assert runs["spot@8"].data.params == {"budget": "8"}
    history = client.get_metric_history(spot, "gsm8k/accepted_length_mean")
    assert sorted((m.step, m.value) for m in history) == [(0, 2.0), (1, 3.0)]
    assert [a.path for a in client.list_artifacts(spot, "plots")] == ["plots/accepted_lengths.png"]


def _only_entry(spool: Path) -> Path:
    (entry,) = spool.iterdir()
    return entry


def _synced_run_id(output: str) -> str:
    match = re.search(r"^synced \S+: run ([0-9a-f]{32}) ", output, re.MULTILINE)
    assert match, output
    return match.group(1)


def test_names_are_made_mlflow_safe():
    assert safe_name("gsm8k/exact_match,strict-match") == ACCURACY
    assert safe_name("/a//b/../c.d e:f") == "a/b/c.d e_f"
    assert safe_name("..") == "_"


def test_tracking_off_is_a_null_tracker_at_every_call_site():
    tracker = open_tracker(None)
    assert isinstance(tracker, NullTracker) and tracker.run_id is None
    with tracker.child("spot@8") as run:
        run.log_metrics({"x": 1.0})
    assert isinstance(resume(tracker.run_id), NullTracker)


def test_a_saved_view_of_the_runs_table_fits_in_an_experiment_tag_and_has_a_link(tmp_path):
    many = [f"method_{i}/task_with_a_long_name_{i}/throughput_ratio" for i in range(1000)]
    view, value = runs_view("many", many)
    columns = json.loads(json.loads(value)["state"])["selectedColumns"]
    assert len(value) <= MAX_EXPERIMENT_TAG and 50 < len(columns) < 1000 and columns[1] == f"metrics.`{many[0]}`"
    assert runs_view("many", many)[0] == view != runs_view("other", many)[0]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = open_tracker(TrackingConfig(tracking_uri=uri, experiment="views", spool_dir=str(tmp_path / "spool")))
    view = tracker.save_view(*VIEW)
    experiment = MlflowClient(uri).get_experiment_by_name("views")
    assert VIEW_TAG + view in experiment.tags
    # `mlflow ui` serves a local store at 127.0.0.1:5000; the link opens the runs table, not the GenAI overview.
    assert tracker.ui_link(view) == (f"http://127.0.0.1:5000/#/experiments/{experiment.experiment_id}/runs"
                                     f"?workflowType=machine_learning&viewStateShareKey={view}")
    # The experiment's description is spot-eval's to write until someone writes their own, which stays.
    client = MlflowClient(uri)
    tracker.describe_experiment("**spot-eval**: ours", "**spot-eval**")
    assert client.get_experiment(experiment.experiment_id).tags[NOTE] == "**spot-eval**: ours"
    client.set_experiment_tag(experiment.experiment_id, NOTE, "my own notes")
    tracker.describe_experiment("**spot-eval**: again", "**spot-eval**")
    assert client.get_experiment(experiment.experiment_id).tags[NOTE] == "my own notes"
    tracker.end()
    assert NullTracker().save_view(*VIEW) is None and NullTracker().ui_link() is None


def test_default_store_is_sqlite_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "files").mkdir()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_id = _log_evaluation(open_tracker(TrackingConfig()), tmp_path / "files")
    assert not [w for w in caught if "spool" in str(w.message)]
    _check_evaluation(MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}"), run_id, tmp_path)
    assert not (tmp_path / "spot-eval-spool").exists()  # no outage: the spool entry is gone, and the empty spool with it
    with pytest.raises(KeyError, match="no open run"):
        resume(run_id)


def _die(tracker) -> None:
    """What a SIGKILL leaves of an evaluation: its run RUNNING in the store, its journal and an unheld lock."""
    writer._OPEN.pop(tracker.run_id)
    spool = tracker._session.spool
    spool._journal.close()
    spool._lock.close()


def test_a_run_whose_process_died_is_ended_by_the_next_run_or_by_sync(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = TrackingConfig(tracking_uri=uri, experiment="deaths", spool_dir=str(tmp_path / "spool"))
    first = open_tracker(config)
    _die(first)
    client = MlflowClient(uri)
    assert client.get_run(first.run_id).info.status == "RUNNING"
    assert client.get_run(first.run_id).data.tags["spot_eval.pid"] == str(os.getpid())
    # The same process cannot be dead: pretend the run was opened by a pid that is gone.
    client.set_tag(first.run_id, "spot_eval.pid_started", "0")
    with pytest.warns(RuntimeWarning) as caught:
        second = open_tracker(config)
    said = " ".join(str(w.message) for w in caught)
    assert f"MLflow run {first.run_id} was still RUNNING" in said and "removed the spool entry" in said
    run = client.get_run(first.run_id)
    assert run.info.status == "FAILED" and "ended by a later run" in run.data.tags["spot_eval.ended_by"]
    assert [p for p in (tmp_path / "spool").iterdir()] == [second._session.spool.path]  # only the live one's
    second.end()

    third = open_tracker(config)  # dies too; this time `spot-eval sync` finds its journal
    _die(third)
    client.set_tag(third.run_id, "spot_eval.pid_started", "0")
    lines = list(sync(tmp_path / "spool"))
    assert len(lines) == 1 and "logged to the tracking store live" in lines[0]
    assert f"its run {third.run_id} was still RUNNING and is now FAILED" in lines[0]
    assert client.get_run(third.run_id).info.status == "FAILED" and not (tmp_path / "spool").exists()


ENDS = """
import sys, time
from spot_eval.tracking.writer import TrackingConfig, open_tracker
tracker = open_tracker(TrackingConfig(tracking_uri=sys.argv[1], experiment="ends"))
print(tracker.run_id, flush=True)
if sys.argv[2] == "raise":
    raise RuntimeError("the evaluation broke")
time.sleep(60)
"""


@pytest.mark.slow
@pytest.mark.parametrize(("how", "status"), [("raise", "FAILED"), ("SIGTERM", "KILLED")])
def test_a_run_ends_failed_on_an_exception_and_killed_on_sigterm(how, status, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    process = subprocess.Popen([sys.executable, "-c", ENDS, uri, how], cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    run_id = process.stdout.readline().strip()
    if how == "SIGTERM":
        process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    assert process.returncode == (1 if how == "raise" else 128 + signal.SIGTERM)
    assert MlflowClient(uri).get_run(run_id).info.status == status


@pytest.mark.xdist_group("mlflow_server")
@pytest.mark.slow
def test_server_round_trip(server, tmp_path):
    (tmp_path / "files").mkdir()
    spool = tmp_path / "spool"
    config = TrackingConfig(tracking_uri=server.uri, experiment="round-trip", spool_dir=str(spool))
    run_id = _log_evaluation(open_tracker(config), tmp_path / "files")
    _check_evaluation(MlflowClient(server.uri), run_id, tmp_path)
    assert not spool.exists()  # the entry went at the end of the evaluation, and the emptied spool with it


@pytest.mark.xdist_group("mlflow_server")
@pytest.mark.slow
def test_outage_from_the_start_spools_then_sync_replays_it(server, tmp_path, capsys):
    (tmp_path / "files").mkdir()
    spool, dead = tmp_path / "spool", f"http://127.0.0.1:{free_port()}"
    config = TrackingConfig(tracking_uri=dead, experiment="outage", spool_dir=str(spool))
    started = time.monotonic()
    with pytest.warns(RuntimeWarning, match=r"unreachable.*spool.*spot-eval sync"):
        spooled_id = _log_evaluation(open_tracker(config), tmp_path / "files")
    assert time.monotonic() - started < 10
    assert spooled_id.startswith("spool:")
    records = Spool.read(_only_entry(spool))
    assert [r["op"] for r in records].count("start") == 3 and records[1]["op"] == "outage"

    # The server is still unreachable: a clear error, exit status 2, and the spool is kept.
    with pytest.raises(SystemExit) as exit_info:
        main(["sync", "--spool", str(spool)])
    assert exit_info.value.code == 2 and "unreachable" in capsys.readouterr().err
    assert (_only_entry(spool) / Spool.JOURNAL).exists()

    command = [sys.executable, "-m", "spot_eval.cli", "sync", "--spool", str(spool), "--tracking-uri"]
    done = subprocess.run([*command, server.uri], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1
    client = MlflowClient(server.uri)
    run_id = _synced_run_id(done.stdout)
    _check_evaluation(client, run_id, tmp_path)
    # Metrics keep the timestamps they were logged with, not the time of the sync.
    logged = next(r for r in records if r["op"] == "metrics" and ACCURACY in r["metrics"])
    assert client.get_metric_history(run_id, ACCURACY)[0].timestamp == logged["time"]

    main(["sync", "--spool", str(spool), "--tracking-uri", server.uri])
    assert capsys.readouterr().out.startswith("nothing to sync")


def test_sync_skips_an_entry_an_evaluation_is_still_writing(tmp_path, capsys):
    config = TrackingConfig(tracking_uri=f"http://127.0.0.1:{free_port()}", spool_dir=str(tmp_path))
    with pytest.warns(RuntimeWarning, match="unreachable"):
        tracker = open_tracker(config)
    main(["sync", "--spool", str(tmp_path)])
    assert "still writing" in capsys.readouterr().out
    tracker.end()



def test_a_server_said_down_at_the_start_is_probed_once(tmp_path, monkeypatch):
    """lm_eval's model says the outage before the weights load (announce_unreachable); the run it then opens spools
    without waiting on a second probe (each up to store.HEALTH_TIMEOUT_S on a silent host), and one that opens
    after the server is back probes again."""
    config = TrackingConfig(tracking_uri=f"http://127.0.0.1:{free_port()}", spool_dir=str(tmp_path))
    probes = []
    monkeypatch.setattr(writer, "unreachable", lambda uri: probes.append(uri) or "connection refused")
    with pytest.warns(RuntimeWarning, match="no MLflow server answers") as said:
        writer.announce_unreachable(config)
        open_tracker(config).end()
    assert len(probes) == 1 and len(said) == 1  # one probe, one line
    monkeypatch.setattr(writer, "unreachable", lambda uri: probes.append(uri) and None)
    writer.announce_unreachable(config)  # back: the next run connects instead of spooling
    assert config.tracking_uri not in writer._ANNOUNCED and len(probes) == 2

@pytest.mark.xdist_group("mlflow_server")
@pytest.mark.slow
def test_server_killed_mid_run_loses_nothing(server, tmp_path, capsys):
    (tmp_path / "files").mkdir()
    spool = tmp_path / "spool"
    config = TrackingConfig(tracking_uri=server.uri, experiment="killed", spool_dir=str(spool))
    with pytest.warns(RuntimeWarning, match="unreachable"):
        live_id = _log_evaluation(open_tracker(config), tmp_path / "files", midway=server.kill)

    # The spool holds the whole run, the part logged before the kill included.
    records = Spool.read(_only_entry(spool))
    ops = [r["op"] for r in records]
    assert ops.index("outage") > ops.index("params") and ops.count("artifact") == 3 and ops.count("end") == 3
    assert records[ops.index("start")]["server_id"] == live_id

    server.start()  # the same backend and port, so sync finds the URI recorded in the spool
    main(["sync", "--spool", str(spool)])
    run_id = _synced_run_id(capsys.readouterr().out)
    client = MlflowClient(server.uri)
    _check_evaluation(client, run_id, tmp_path)
    partial = client.get_run(live_id)
    assert partial.info.status == "FAILED" and partial.data.tags["spot_eval.superseded_by"] == run_id
    assert not spool.exists()  # replayed entries are removed, and the emptied spool with them


# -- the same through `lm_eval --model spot` ------------------------------------------------------


def _check_spot_run(client: MlflowClient, cwd: Path, live: bool = True) -> None:
    """What `lm_eval --model spot` logged (`live`: to a store that answered; else spooled, then synced, when the
    experiment's id, which the links to MLflow's UI name, was not known while the run wrote)."""
    found = client.get_experiment_by_name("spot-eval")
    assert found.tags["mlflow.experimentKind"] == "custom_model_development"  # MLflow's UI opens on the runs table
    experiment = found.experiment_id
    [parent] = client.search_runs([experiment], "tags.mlflow.runName = 'spot-eval'")
    assert "spot_gsm8k/exact_match_strict-match" in parent.data.metrics
    # Each method's headline figures on the parent, as the runs table's columns, named short enough for a header to
    # show whole and rounded as the reports print them; the summary as its description, with the link to the table.
    metrics = parent.data.metrics
    for label in ("draft_free", "oracle_4"):
        for figure in ("fwd_x", "tput_x", "lossless"):
            assert f"{label}/spot_gsm8k/{figure}" in metrics, (label, figure)
    assert metrics["oracle_4/spot_gsm8k/lossless"] == 1.0 and metrics["oracle_4/spot_gsm8k/fwd_x"] > 1
    assert all(round(metrics[f"oracle_4/spot_gsm8k/{k}"], 2) == metrics[f"oracle_4/spot_gsm8k/{k}"] for k in ("fwd_x", "tput_x"))
    [oracle] = [c for c in client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
                if c.info.run_name == "oracle@4"]
    assert oracle.data.metrics["spot_gsm8k/forward_ratio"] == pytest.approx(metrics["oracle_4/spot_gsm8k/fwd_x"], abs=0.005)
    note = parent.data.tags[NOTE]
    path = f"#/experiments/{experiment}/runs?workflowType=machine_learning&viewStateShareKey="
    assert "\n```text\n" in note and re.search(r"spot_gsm8k\s+oracle@4\s+2\s", note)
    if live:  # the link to the runs table with the headline columns, in the run's and the experiment's descriptions
        # (atop each of the experiment's pages, the GenAI overview's too): the one click to that table
        assert f"]({path}" in note
        assert found.tags[NOTE].startswith("**spot-eval**: **[Open the runs table with the headline columns](" + path)
    tags = parent.data.tags
    assert tags["spot_eval.dtype"] == "float32" and tags["spot_eval.device"] == "cpu" and tags["spot_eval.torch"] == torch.__version__
    assert tags["spot_eval.target"] and tags["spot_eval.lm_eval"] == "0.4.13" and float(tags["spot_eval.peak_memory_mb"]) > 0
    assert tags["spot_eval.commit"] == parent.data.params["git_commit"]
    children = client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert {c.info.run_name for c in children} == {"draft_free", "oracle@4"}
    assert any(a.path == "spot-eval/samples.jsonl" for a in client.list_artifacts(parent.info.run_id, "spot-eval"))
    # The task's documents as a dataset input: its name, a digest of the requests decoded, its source and its size.
    [logged] = parent.inputs.dataset_inputs
    dataset = logged.dataset
    [samples] = (cwd / "spot-eval-runs").glob("*/samples.jsonl")
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    docs = sorted({(r["doc_id"], r["prompt_sha256"]) for r in rows})
    assert dataset.name == "spot_gsm8k" and dataset.digest == hashlib.sha256(json.dumps(docs).encode()).hexdigest()[:16]
    assert json.loads(dataset.profile) == {"documents": 2, "requests": 2, "of": 1319, "limit": 2}
    assert dataset.source_type == "code" and json.loads(dataset.source) == {
        "tags": {"task": "spot_gsm8k", "split": "test", "custom_dataset": "load_gsm8k", "upstream_task": "gsm8k"}}
    assert {(t.key, t.value) for t in logged.tags} == {("mlflow.data.context", "eval")}
    # A saved view of the runs table shows the methods' headline figures (not draft-free's: all 1) and the accuracy.
    [view] = [json.loads(v) for k, v in found.tags.items() if k.startswith(VIEW_TAG)]
    columns = json.loads(view["state"])["selectedColumns"]
    assert view["name"] == "spot-eval: spot_gsm8k | oracle@4" and columns == [
        "attributes.`Dataset`", *(f"metrics.`oracle_4/spot_gsm8k/{k}`" for k in ("fwd_x", "tput_x", "lossless")),
        "metrics.`spot_gsm8k/exact_match_strict-match`", "metrics.`spot_gsm8k/exact_match_flexible-extract`"]


@pytest.mark.xdist_group("mlflow_server")
@pytest.mark.slow
def test_lm_eval_logs_a_whole_evaluation_to_a_real_server(server, tmp_path, capsys):
    checkpoint = write_checkpoint(tmp_path / "ckpt")
    run = lm_eval_spot(capsys, checkpoint, server.uri, tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    _check_spot_run(MlflowClient(tracking_uri=server.uri), tmp_path)
    # The link it prints opens the runs table with the saved view (tests/test_mlflow_ui.py opens it in a browser).
    experiment = MlflowClient(tracking_uri=server.uri).get_experiment_by_name("spot-eval")
    [view] = [k.removeprefix(VIEW_TAG) for k in experiment.tags if k.startswith(VIEW_TAG)]
    link = f"{server.uri}/#/experiments/{experiment.experiment_id}/runs?workflowType=machine_learning&viewStateShareKey={view}"
    assert f"; its runs table: {link}\n" in run.stdout


@pytest.mark.slow
def test_lm_eval_with_the_server_down_spools_and_sync_uploads(tmp_path, capsys):
    checkpoint = write_checkpoint(tmp_path / "ckpt")
    down = Server(tmp_path / "late")
    (tmp_path / "late").mkdir()
    run = lm_eval_spot(capsys, checkpoint, down.uri, tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "spot-eval sync" in run.stderr  # the one-line warning says how to recover
    spool = tmp_path / "spot-eval-spool"
    assert len(list(spool.iterdir())) == 1
    down.start()
    try:
        sync = subprocess.run([sys.executable, "-m", "spot_eval.cli", "sync", "--spool", str(spool), "--tracking-uri", down.uri],
                              capture_output=True, text=True, cwd=tmp_path, timeout=300)
        assert sync.returncode == 0, sync.stderr
        _check_spot_run(MlflowClient(tracking_uri=down.uri), tmp_path, live=False)
    finally:
        down.stop()


OPEN_AT_ONCE = """
import sys, time
from spot_eval.reports.history import nightly_runs
from spot_eval.tracking.writer import TrackingConfig, open_tracker
start = float(sys.argv[1])
time.sleep(max(start - time.time(), 0))  # both processes reach MLflow's first connect together
if sys.argv[2] == "rank1":  # as a nightly starts: its first call reads the nightly series (reports.history)
    assert nightly_runs(None, "race") == []  # none yet, whether or not rank0 has made the experiment
tracker = open_tracker(TrackingConfig(experiment="race", run_name=sys.argv[2], spool_dir=sys.argv[3]))
tracker.end()
print(tracker.run_id)
"""


@pytest.mark.slow
def test_two_processes_opening_a_fresh_sqlite_store_at_once_both_succeed(tmp_path):
    """The ranks of a `torchrun` in a fresh directory all create ./mlflow.db on their first call; MLflow's
    table migrations collide on sqlite unless the first use is serialised (tracking.store.first_use), and so do two
    nightlies started at once, whose first call reads the nightly series (reports.history)."""
    start = time.time() + 8  # after both interpreters have imported mlflow
    procs = [
        subprocess.Popen([sys.executable, "-c", OPEN_AT_ONCE, str(start), f"rank{r}", str(tmp_path / f"spool{r}")],
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(2)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outputs]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("race").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["rank0", "rank1"]
    assert all(r.info.status == "FINISHED" for r in runs)
    assert not (tmp_path / "spool0").exists() and not (tmp_path / "spool1").exists()  # nothing was spooled


def test_the_headline_columns_round_as_the_reports_print_them_and_lossless_reads_1_only_when_all_matched():
    import pandas as pd

    from spot_eval.harness.session import description, parent_headline

    table = pd.DataFrame({"task": ["gsm8k"], "label": ["spot@8"], "requests": [2500], "forward_ratio": [2.3456],
                          "throughput_ratio": [0.5749], "tokens_per_forward": [1.5], "lossless": [2499 / 2500]})
    assert parent_headline(table) == {"spot_8/gsm8k/fwd_x": 2.35, "spot_8/gsm8k/tput_x": 0.57, "spot_8/gsm8k/lossless": 0.999}
    note = description(table, "#/experiments/1/runs?workflowType=machine_learning")
    assert "0.999" in note and "1.000" not in note and "](#/experiments/1/runs?workflowType=machine_learning)" in note
