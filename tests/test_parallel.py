"""Data parallel under `accelerate launch`: the same evaluation on two processes as on one (tokens, forward
counts, accuracy), one MLflow run, each request once although lm-eval pads the shorter rank; and the
start-up registration's rule for `python -m lm_eval` (tests/test_tasks.py runs it) and an editable install."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest
from conftest import existing_store, free_port, run_cli, run_lm_eval_here, write_checkpoint
from lm_eval.api.instance import Instance
from mlflow import MlflowClient

from spot_eval.harness.lm import SpotLM
from spot_eval.harness.parallel import ONE_PROCESS
from spot_eval.harness.registration import is_lm_eval_cli

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@pytest.mark.parametrize(
    ("argv", "orig_argv", "expected"),
    [
        (["/venv/bin/lm_eval", "--model", "spot"], ["/venv/bin/python", "/venv/bin/lm_eval", "--model", "spot"], True),
        (["/venv/bin/lm-eval"], ["python", "/venv/bin/lm-eval"], True),
        (["-m", "--model"], ["python", "-m", "lm_eval", "--model"], True),
        (["-m"], ["python", "-u", "-m", "lm_eval.__main__"], True),
        (["-m"], ["python", "-mlm_eval"], True),
        (["-m"], ["python", "-m", "pytest"], False),
        (["-c"], ["python", "-c", "import lm_eval"], False),
        (["x.py", "-m", "lm_eval"], ["python", "x.py", "-m", "lm_eval"], False),
        ([], [], False),
    ],
)
def test_registration_runs_for_lm_evals_command_line_only(argv, orig_argv, expected):
    assert is_lm_eval_cli(argv, orig_argv) is expected


def test_one_process_has_lm_evals_default_hooks():
    import torch

    assert ONE_PROCESS.all_gather(torch.tensor(3)).tolist() == [3]
    assert ONE_PROCESS.gather_object({"a": 1}) == [{"a": 1}]
    ONE_PROCESS.barrier()


def test_padding_copies_are_answered_but_never_decoded_or_recorded(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lm = SpotLM(pretrained=str(write_checkpoint(tmp_path / "ckpt")), methods="", budgets="", gen_length=20,
                device="cpu", mlflow_tracking_uri=None)
    first, last = (Instance("generate_until", {}, (f"t1 t{n}", {"until": [], "max_gen_toks": 20}), idx=n,
                            metadata=("spot_gsm8k", n, 1)) for n in (2, 3))
    outputs = lm.generate_until([first, last, last])  # lm-eval pads a shorter rank with copies of its last request
    assert outputs[2] == outputs[1] and len(lm.session.records) == 2
    assert [r.repeat for r in lm.session.records] == [0, 0]


def failure(stderr: str) -> str:
    """A rank's own error and the launcher's summary: a failed rank's traceback is not the last thing written."""
    lines = stderr.splitlines()
    errors = [n for n, line in enumerate(lines) if any(w in line for w in ("Traceback", "Error", "terminate called"))]
    return "\n".join(lines[errors[0]:errors[0] + 60] if errors else []) + "\n...\n" + stderr[-2000:]


def lm_eval_args(out: Path, run: str = "run", *extra: str, model_args: str = "") -> list[str]:
    args = f"device=cpu,gen_length=32,methods=spot+spiffy@3,output_dir={out / run}{model_args}"
    return ["--model", "spot", "--model_args", args, "--tasks", "spot_gsm8k,spot_mbpp", "--limit", "3",
            "--include_path", str(REPO / "tasks"), "--apply_chat_template", "--confirm_run_unsafe_code",
            "--log_samples", "--output_path", str(out / "lm_eval"), "--gen_kwargs", "max_gen_toks=32", *extra]


def lm_eval_run(launcher: list[str], out: Path, run: str = "run", *extra: str, model_args: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([*launcher, *lm_eval_args(out, run, *extra, model_args=model_args)],
                          capture_output=True, text=True, env=OFFLINE, cwd=out, timeout=900)


@pytest.mark.slow
def test_two_processes_give_the_one_process_evaluation(tmp_path, capsys, monkeypatch):
    """Three documents a task on two ranks: lm-eval pads the second rank with a copy of its last request."""
    one, two = tmp_path / "one", tmp_path / "two"
    existing_store(one), existing_store(two)  # each run's default store, ./mlflow.db
    single = run_lm_eval_here(capsys, *lm_eval_args(one), cwd=one)  # the reference, in this process
    assert single.returncode == 0, single.stderr[-3000:]
    # On a machine without GPUs accelerate 1.x's --cpu starts one process; --multi_gpu starts two (gloo).
    launch = [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
              "--main_process_port", str(free_port()), "-m", "lm_eval"]
    double = lm_eval_run(launch, two, "run", "--use_cache", str(two / "cache"))
    assert double.returncode == 0, failure(double.stderr)
    rows = {}
    for name, where in (("one", one), ("two", two)):
        samples = pd.read_json(where / "run" / "samples.jsonl", lines=True)
        assert not samples.duplicated(["task", "doc_id", "repeat", "label"]).any()  # each request once
        assert len(samples) == 2 * 3 * 3  # two tasks, three documents, draft-free + two methods
        rows[name] = samples.set_index(["task", "doc_id", "label"]).sort_index()
    assert rows["one"]["token_ids"].equals(rows["two"]["token_ids"])
    assert rows["one"]["forwards"].equals(rows["two"]["forwards"]) and rows["two"]["lossless"].all()
    scores = {name: json.loads((where / "run" / "lm_eval_results.json").read_text())["results"] for name, where in
              (("one", one), ("two", two))}
    for task in ("spot_gsm8k", "spot_mbpp"):
        metrics = {k: v for k, v in scores["one"][task].items() if isinstance(v, float)}
        assert metrics == {k: scores["two"][task][k] for k in metrics}
    client = MlflowClient(f"sqlite:///{two / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("spot-eval").experiment_id
    parents = client.search_runs([experiment], "tags.mlflow.runName = 'spot-eval'")
    assert len(parents) == 1 and parents[0].data.params["world_size"] == "2"  # two ranks, one run
    children = client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parents[0].info.run_id}'")
    assert sorted(c.info.run_name for c in children) == ["draft_free", "spiffy@3", "spot@8"]
    assert children[0].data.metrics["spot_gsm8k/requests"] == 3.0  # padding never counts
    memory = json.loads((two / "run" / "run.json").read_text())["peak_memory_mb_by_device"]
    assert sorted(memory) == ["rank0/cpu", "rank1/cpu"] and min(memory.values()) > 0  # each rank's, gathered
    # --use_cache keeps one cache per rank; a rerun (after a crash, say) takes every finished request from it.
    # This time rank 0 cannot reach the MLflow server: it spools, and `spot-eval sync` replays the run.
    assert sorted(p.name for p in two.glob("cache*.db")) == ["cache_rank0.db", "cache_rank1.db"]
    dead = f",mlflow_tracking_uri=http://127.0.0.1:{free_port()}"
    again = lm_eval_run(launch, two, "rerun", "--use_cache", str(two / "cache"), model_args=dead)
    assert again.returncode == 0, failure(again.stderr)
    assert again.stderr.count("no MLflow server answers at") == 1  # rank 0 alone tracks, and says so once
    resumed = pd.read_json(two / "rerun" / "samples.jsonl", lines=True)
    assert resumed["resumed"].all()  # nothing decoded again, yet every request is reported
    assert pd.read_json(next((two / "rerun").glob("run.json")), typ="series")["resumed_requests"] == 2 * 3
    assert resumed.set_index(["task", "doc_id", "label"]).sort_index()["token_ids"].equals(rows["two"]["token_ids"])
    monkeypatch.chdir(two)
    sync = run_cli(capsys, "sync", "--spool", str(two / "spot-eval-spool"), "--tracking-uri", f"sqlite:///{two / 'mlflow.db'}")
    assert sync.returncode == 0, sync.stderr[-3000:]
    parents = client.search_runs([experiment], "tags.mlflow.runName = 'spot-eval'")
    assert len(parents) == 2 and {p.data.params["world_size"] for p in parents} == {"2"}
    rescored = json.loads((two / "rerun" / "lm_eval_results.json").read_text())["results"]
    assert {t: rescored[t]["exact_match,strict-match"] for t in ["spot_gsm8k"]} == {
        t: scores["two"][t]["exact_match,strict-match"] for t in ["spot_gsm8k"]}


@pytest.mark.slow
def test_an_editable_install_carries_the_start_up_line(tmp_path):
    """pip install -e . builds the editable wheel with setuptools' PEP 660 hook; ours adds the .pth."""
    build = subprocess.run([sys.executable, "-c", f"import setuptools.build_meta as b; print(b.build_editable({str(tmp_path)!r}))"],
                           capture_output=True, text=True, cwd=REPO, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    wheel = tmp_path / build.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as z:
        line = z.read("spot_eval_lm_eval.pth").decode()
    assert line == "import spot_eval.harness.registration; spot_eval.harness.registration.at_startup()\n"
