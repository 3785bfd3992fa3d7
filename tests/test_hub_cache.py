"""`spot-eval cache-datasets`: the vendored benchmarks, loaded by `datasets` under lm-eval's hub ids with the
hub offline, row for row; a copy spot-eval did not write is never overwritten."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import existing_store, run_cli

from spot_eval.data.hub_cache import (
    HUB_DATASETS,
    VENDORED,
    DifferentCopy,
    cache_datasets,
    prepared_dir,
    read_rows,
)

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setattr("datasets.config.HF_HUB_OFFLINE", True)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)


def test_every_dataset_loads_offline_row_for_row_under_its_hub_id(tmp_path):
    written = cache_datasets(tmp_path)
    assert [(w.repo_id, w.config) for w in written] == [
        ("openai/gsm8k", "main"), ("HuggingFaceH4/MATH-500", "default"), ("google-research-datasets/mbpp", "full"),
        ("openai/openai_humaneval", "openai_humaneval")]
    assert all(w.wrote and w.path.name == VENDORED for w in written)
    assert {w.repo_id: w.rows for w in written} == {
        "openai/gsm8k": {"train": 7473, "test": 1319}, "HuggingFaceH4/MATH-500": {"test": 500},
        "google-research-datasets/mbpp": {"train": 374, "test": 500, "validation": 90, "prompt": 10},
        "openai/openai_humaneval": {"test": 164}}
    for dataset in HUB_DATASETS:
        loaded = read_rows(tmp_path, dataset)
        assert sorted(loaded) == sorted(dataset.splits)
        for split, rows in loaded.items():
            assert rows == dataset.rows(split), (dataset.repo_id, split)  # every row, every column, in order
            assert list(rows[0]) == list(dataset.columns)  # the hub's columns and nothing else (gsm8k's idx dropped)
    again = cache_datasets(tmp_path)
    assert not any(w.wrote for w in again) and [w.path for w in again] == [w.path for w in written]


def test_a_copy_it_did_not_write_is_refused_and_left_alone(tmp_path, capsys):
    foreign = prepared_dir(tmp_path, HUB_DATASETS[0]) / "0.0.0" / "0123abcd"
    foreign.mkdir(parents=True)
    (foreign / "dataset_info.json").write_text("{}")
    with pytest.raises(DifferentCopy, match="that spot-eval did not write; datasets would load the newest"):
        cache_datasets(tmp_path)
    assert sorted(p.name for p in foreign.parent.iterdir()) == ["0123abcd"] and (foreign / "dataset_info.json").read_text() == "{}"
    run = run_cli(capsys, "cache-datasets", "--cache-dir", str(tmp_path))
    assert run.returncode == 2 and "error: openai/gsm8k (main) already has a copy in" in run.stderr
    assert "Remove that directory" in run.stderr


def test_the_command_says_what_it_wrote(tmp_path, capsys):
    first = run_cli(capsys, "cache-datasets", "--cache-dir", str(tmp_path))
    assert first.returncode == 0, first.stderr
    assert "wrote openai/gsm8k (main; train 7473, test 1319) in " in first.stdout
    assert "wrote openai/openai_humaneval (openai_humaneval; test 164)" in first.stdout
    second = run_cli(capsys, "cache-datasets", "--cache-dir", str(tmp_path))
    assert second.stdout.count("already there, the same rows:") == 4


@pytest.mark.slow  # a fresh interpreter in a fresh HF_HOME
def test_evaluates_code_eval_is_the_sandboxed_one_with_code_evals_interface_and_consent(tmp_path):
    """In a fresh HF_HOME with the hub offline, `evaluate.load("code_eval")` loads spot-eval's: code_eval's
    inputs, return value and HF_ALLOW_CODE_EVAL consent; an always-equal answer fails (the sandbox's asserts)."""
    script = (
        "import json, sys\n"
        "from spot_eval.execution.metric_cache import install_code_eval\n"
        "install_code_eval()\n"
        "import evaluate\n"
        "metric = evaluate.load('code_eval')\n"
        "eq = 'def add(a, b):\\n    class Eq(int):\\n        __eq__ = lambda s, o: True\\n    return Eq(0)\\n'\n"
        "try:\n"
        "    scores, results = metric.compute(references=['assert add(2, 3) == 5'],\n"
        "        predictions=[['def add(a, b): return a * b', 'def add(a, b): return a + b', eq]], k=[1, 2])\n"
        "except ValueError as err:\n"
        "    print(json.dumps({'refused': str(err)})); sys.exit()\n"
        "print(json.dumps({'module': type(metric).__module__, 'scores': scores,\n"
        "                  'passed': [r['passed'] for _, r in results[0]]}))\n"
    )
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_EVALUATE_OFFLINE": "1"}
    for variable in ("HF_MODULES_CACHE", "HF_ALLOW_CODE_EVAL"):
        env.pop(variable, None)
    refused = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert "set HF_ALLOW_CODE_EVAL=1" in json.loads(refused.stdout.splitlines()[-1])["refused"], refused.stderr[-2000:]
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**env, "HF_ALLOW_CODE_EVAL": "1"})
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["module"].startswith("evaluate_modules.metrics.evaluate-metric--code_eval.")
    assert out["passed"] == [False, True, False]
    assert out["scores"] == {"pass@1": pytest.approx(1 / 3), "pass@2": pytest.approx(2 / 3)}


@pytest.mark.slow
def test_lm_eval_runs_its_own_task_names_offline_in_a_fresh_hf_home_and_humaneval_scores_in_the_sandbox(tmp_path):
    """lm-eval's own `gsm8k`, `minerva_math500` and `humaneval` through `lm_eval --model spot`, offline, in a fresh
    HF_HOME that `spot-eval cache-datasets` filled. That first run also fills lm-eval's cache; then the humaneval
    answers in it are replaced by the canonical solution and an always-equal object (which fools the hub's
    code_eval), and the same command again is scored from the cache: the sandbox decides both, pass@1 = 1/2."""
    from lm_eval.api.model import hash_args
    from sqlitedict import SqliteDict

    from spot_eval.data.datasets import load

    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_EVALUATE_OFFLINE": "1", "HF_ALLOW_CODE_EVAL": "1"}
    for variable in ("HF_MODULES_CACHE", "HF_DATASETS_CACHE"):
        env.pop(variable, None)
    existing_store(tmp_path)  # the run's default store, ./mlflow.db
    cached = subprocess.run([str(BIN / "spot-eval"), "cache-datasets"], capture_output=True, text=True, env=env, cwd=tmp_path,
                            timeout=300)
    assert cached.returncode == 0 and "SANDBOXED code_eval" in cached.stdout, cached.stderr[-2000:]
    assert str(tmp_path / "hf" / "datasets") in cached.stdout

    def lm_eval(run: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(BIN / "lm_eval"), "--model", "spot", "--model_args", f"methods=spot@8,device=cpu,gen_length=32,output_dir={tmp_path / run}",
             "--tasks", "gsm8k,minerva_math500,humaneval", "--limit", "2", "--use_cache", str(tmp_path / "cache"),
             "--confirm_run_unsafe_code", "--log_samples", "--output_path", str(tmp_path / run / "lm_eval"),
             "--gen_kwargs", "max_gen_toks=32"],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)

    first = lm_eval("first")
    assert first.returncode == 0, first.stderr[-3000:]
    table = first.stdout
    assert "|gsm8k" in table.replace(" ", "") and "minerva_math500" in table and "exact_match" in table
    [log] = (tmp_path / "first" / "lm_eval").rglob("samples_humaneval_*.jsonl")
    samples = sorted((json.loads(line) for line in log.open()), key=lambda s: s["doc_id"])
    humaneval = {d["task_id"]: d for d in load("humaneval_test")}
    bodies = [humaneval[samples[0]["doc"]["task_id"]]["canonical_solution"],
              "    class Eq(list):\n        __eq__ = lambda s, o: True\n    return Eq()\n"]
    with SqliteDict(str(tmp_path / "cache_rank0.db"), autocommit=True) as cache:
        for sample, body in zip(samples, bodies, strict=True):
            arguments = sample["arguments"]["gen_args_0"]
            key = hash_args("generate_until", [arguments["arg_0"], arguments["arg_1"]])
            assert key in cache
            cache[key] = body
    again = lm_eval("again")
    assert again.returncode == 0, again.stderr[-3000:]
    [results] = (tmp_path / "again" / "lm_eval").rglob("results_*.json")
    assert json.loads(results.read_text())["results"]["humaneval"]["pass@1,create_test"] == pytest.approx(1 / 2)
