"""An interrupted `lm_eval --model spot --use_cache` run loses nothing: killed midway (SIGKILL, or SIGINT), then
run again with the same command, it reports every request (the ones lm-eval answers from its cache with the
records an earlier process kept beside them), as an uninterrupted run does; its MLflow runs end with the truth."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import LM_EVAL, existing_store, run_lm_eval_here, write_checkpoint
from mlflow import MlflowClient

REPO = Path(__file__).resolve().parent.parent
LIMIT = 6


def command(checkpoint: Path, where: Path, cache: Path, uri: str, **overrides: str) -> list[str]:
    args = {"pretrained": str(checkpoint), "methods": "random", "budgets": "4", "device": "cpu",
            "output_dir": str(where / "run"), "mlflow_tracking_uri": uri, **overrides}
    return [LM_EVAL, "--model", "spot", "--model_args", ",".join(f"{k}={v}" for k, v in args.items()),
            "--tasks", "spot_gsm8k", "--include_path", str(REPO / "tasks"), "--limit", str(LIMIT), "--use_cache", str(cache),
            "--log_samples", "--output_path", str(where / "lm_eval"), "--gen_kwargs", "max_gen_toks=48"]


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, cwd=cwd, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def kept(cache: Path) -> tuple[int, int]:
    """(request records, lm-eval responses) that lm-eval's cache file holds once the interrupted run has ended.
    A record is kept before its response, so a kill can fall between the two: records >= responses."""
    try:
        with sqlite3.connect(f"file:{cache}_rank0.db?mode=ro", uri=True, timeout=0.1) as db:
            records = db.execute("select count(*) from unnamed where key like 'spot-eval/record/%'").fetchone()[0]
            responses = db.execute("select count(*) from unnamed where key not like 'spot-eval/%'").fetchone()[0]
            return records, responses
    except sqlite3.Error:
        return 0, 0


# Imported at the first run's start-up (its PYTHONPATH): lm-eval's cache hook, about to write the fourth response,
# flushes the three before it to disk and stops the process until the test signals it. SIGINT gets the handler a
# terminal's Ctrl-C meets: a suite started in the background (`pytest &` from a script) ignores SIGINT, and its
# children inherit that, so the run would finish as if never interrupted.
PAUSE = """
import os, signal
from lm_eval.api.model import CacheHook

signal.signal(signal.SIGINT, signal.default_int_handler)

add_partial, calls = CacheHook.add_partial, []


def pausing(self, attr, req, res):
    calls.append(attr)
    if len(calls) == 4 and self.dbdict is not None:
        self.dbdict.commit(blocking=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    return add_partial(self, attr, req, res)


CacheHook.add_partial = pausing
"""


def stopped(pid: int) -> bool:
    """Whether the process is stopped (state T in /proc/PID/stat, after the parenthesised command name)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except (FileNotFoundError, IndexError):
        return False


def samples(where: Path) -> pd.DataFrame:
    frame = pd.read_json(where / "run" / "samples.jsonl", lines=True)
    return frame.set_index(["task", "doc_id", "repeat", "label"]).sort_index()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[Path, Path]:
    """(the checkpoint, an uninterrupted run's folder) that the interrupted runs are checked against."""
    root = tmp_path_factory.mktemp("resume")
    checkpoint = write_checkpoint(root / "ckpt")
    run(command(checkpoint, root / "whole", root / "whole-cache", existing_store(root / "whole")), root)
    return checkpoint, root / "whole"


@pytest.mark.xdist_group("resume")  # one worker runs the uninterrupted reference once
@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
def test_a_run_interrupted_midway_reruns_into_the_whole_run(uninterrupted, stop, tmp_path, capsys):
    checkpoint, whole = uninterrupted
    uri, cache = existing_store(tmp_path), tmp_path / "cache"
    args = command(checkpoint, tmp_path, cache, uri)
    # The first run stops itself (SIGSTOP) as it is about to cache its fourth response, with the first three on
    # disk; the signal then reaches it there, whatever the machine's load.
    pause = tmp_path / "pause"
    pause.mkdir()
    (pause / "sitecustomize.py").write_text(PAUSE)
    first = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                                  "PYTHONPATH": os.pathsep.join(filter(None, [str(pause), os.environ.get("PYTHONPATH")]))})
    deadline = time.monotonic() + 300
    while not stopped(first.pid) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    first.send_signal(stop)
    first.send_signal(signal.SIGCONT)  # a stopped process takes SIGINT once it runs again (SIGKILL at once)
    stderr = first.communicate(timeout=120)[1]
    records, done_before = kept(cache)  # lm-eval answers the requests whose responses it kept
    assert first.returncode != 0 and 3 <= done_before < LIMIT and records in (done_before, done_before + 1), (
        records, done_before, stderr[-2000:])

    again = run(args, tmp_path)  # the same command
    assert f"Cached requests: {done_before}" in again.stderr
    assert "fatal: not a git repository" not in again.stderr  # lm-eval's git lookup, outside a checkout
    got, expected = samples(tmp_path), samples(whole)
    assert got.index.equals(expected.index) and len(got) == 2 * LIMIT  # every request, draft-free and random@4
    for column in ("token_ids", "forwards", "lossless"):
        assert got[column].equals(expected[column]), column
    assert got.resumed.sum() == 2 * done_before
    run_json = json.loads((tmp_path / "run" / "run.json").read_text())
    assert (run_json["requests"], run_json["resumed_requests"]) == (LIMIT, done_before)
    summary = pd.read_csv(tmp_path / "run" / "summary.csv").set_index("label")
    assert summary.loc["random@4", "requests"] == LIMIT and summary.loc["random@4", "resumed"] == done_before

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("spot-eval").experiment_id
    parents = client.search_runs([experiment], "tags.mlflow.runName = 'spot-eval'", order_by=["attributes.start_time ASC"])
    killed, rerun = parents
    assert killed.info.status == {signal.SIGKILL: "FAILED", signal.SIGINT: "KILLED"}[stop]
    if stop == signal.SIGKILL:  # found by the rerun: its process was gone
        assert "ended by a later run" in killed.data.tags["spot_eval.ended_by"]
        assert "was still RUNNING" in again.stderr
    assert rerun.info.status == "FINISHED" and not list((tmp_path / "spot-eval-spool").glob("*"))
    children = client.search_runs([experiment], f"tags.mlflow.parentRunId = '{rerun.info.run_id}'")
    assert {c.info.run_name: c.data.metrics["spot_gsm8k/requests"] for c in children} == {"draft_free": LIMIT, "random@4": LIMIT}
    assert not client.search_runs([experiment], "attributes.status = 'RUNNING'")

    # Once more, in this process: every request cached, nothing decoded, the whole run written again.
    if stop == signal.SIGKILL:
        third = run_lm_eval_here(capsys, *args[1:], cwd=tmp_path)
        assert third.returncode == 0, third.stderr[-3000:]
        assert f"Cached requests: {LIMIT}" in third.stderr
        assert samples(tmp_path)["token_ids"].equals(expected["token_ids"]) and samples(tmp_path).resumed.all()
        assert json.loads((tmp_path / "run" / "run.json").read_text())["resumed_requests"] == LIMIT
