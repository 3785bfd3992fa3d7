"""A hub id as `pretrained`, read offline from a Hugging Face cache, through the real `lm_eval` command and
`spot-eval decode`; an uncached one ends with the one line that names how to fetch it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import existing_store, write_checkpoint
from test_sdar_target import hub_cache

REPO = Path(__file__).resolve().parent.parent


def offline(home: Path) -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(home)}


@pytest.mark.slow
def test_lm_eval_runs_a_cached_hub_id_offline_and_names_the_fetch_for_an_uncached_one(tmp_path):
    existing_store(tmp_path)  # the run's default store, ./mlflow.db
    repo = hub_cache(tmp_path / "hf", "JetLM/SDAR-tiny-b16", write_checkpoint(tmp_path / "src"))
    lm_eval = shutil.which("lm_eval", path=str(Path(sys.executable).parent))
    common = ["--tasks", "spot_gsm8k", "--include_path", str(REPO / "tasks"), "--limit", "2"]
    run = subprocess.run([lm_eval, "--model", "spot", "--model_args",
                          f"pretrained={repo},device=cpu,methods=oracle,budgets=4,gen_length=32", *common],
                         capture_output=True, text=True, env=offline(tmp_path / "hf"), cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    run_json = json.loads(next(tmp_path.glob("spot-eval-runs/*/run.json")).read_text())
    assert run_json["target_id"].startswith("JetLM/SDAR-tiny-b16@")
    missing = subprocess.run([lm_eval, "--model", "spot", "--model_args", "pretrained=JetLM/SDAR-8B-Chat-b32,device=cpu", *common],
                             capture_output=True, text=True, env=offline(tmp_path / "hf"), cwd=tmp_path, timeout=300)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    [line] = [line for line in missing.stderr.splitlines() if line.startswith("error:")]
    assert "pretrained=JetLM/SDAR-8B-Chat-b32 is not in the Hugging Face cache" in line
    assert line.endswith("hf download JetLM/SDAR-8B-Chat-b32")


@pytest.mark.slow
def test_spot_eval_decode_takes_a_hub_id_as_pretrained_and_target(tmp_path):
    repo = hub_cache(tmp_path / "hf", "JetLM/SDAR-tiny-b16", write_checkpoint(tmp_path / "src"))
    outputs = []
    for flag in ("--pretrained", "--target"):
        run = subprocess.run([sys.executable, "-m", "spot_eval.cli", "decode", flag, repo, "--prompt", "t1 t2 t3",
                              "--gen-length", "20", "--dtype", "bfloat16", "--json"],
                             capture_output=True, text=True, env=offline(tmp_path / "hf"), timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        outputs.append(json.loads(run.stdout))
    assert outputs[0]["token_ids"] == outputs[1]["token_ids"] and outputs[0]["dtype"] == "bfloat16"
