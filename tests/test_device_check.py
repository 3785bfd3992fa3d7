"""bench/device_check.sh, the prepared GPU check, in its CPU dry run: every stdout line is one JSON figure,
and each part (verify cost of both models and layouts, exactness of both layouts, the four-task benchmark)
reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import own_cache_home

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_dry_run_reports_every_figure_as_one_json_line(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "LM_EVAL": str(Path(sys.executable).parent / "lm_eval"),
           "XDG_CACHE_HOME": str(own_cache_home(tmp_path))}
    run = subprocess.run(["bash", str(REPO / "bench" / "device_check.sh"), "--dry-run"], capture_output=True, text=True,
                         env=env, cwd=REPO, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    figures = [json.loads(line) for line in run.stdout.splitlines()]
    cost = {(f["model"], f["layout"], f["pieces"]) for f in figures if f["bench"] == "verify_cost"}
    assert cost == {(m, layout, p) for m in ("embedded", "sdar-8b", "llada2-mini") for layout in ("default", "exact") for p in (1, 2, 3)}
    exact = [f for f in figures if f["bench"] == "verify_exactness" and f["layout"] == "exact" and "policy" in f]
    assert exact and all(f["max_abs_logit_diff"] == 0 and f["flips"] == 0 for f in exact)
    bench = [f for f in figures if f["bench"] == "benchmark"]
    assert {f["task"] for f in bench} == {"spot_gsm8k", "spot_math500", "spot_humaneval", "spot_mbpp"}
    assert all(f["lossless"] == 1.0 for f in bench) and {f["label"] for f in bench} == {"draft_free", "spot@8", "spot@auto", "spiffy@3"}
    [batching] = [f for f in figures if f["bench"] == "batching"]
    assert {(r["label"], r["batch"]) for r in batching["rows"]} == {(m, b) for m in ("draft_free", "spot@8", "spiffy@3") for b in (1, 2)}
    assert batching["exact"] and all(r["differ_from_batch1"] == 0 and r["lossless"] == 1.0 for r in batching["rows"])
    [auto] = [f for f in figures if f["bench"] == "auto_cost"]
    assert auto["exact"] and auto["profile"]["key"]["dtype"] == "bfloat16" and auto["order_model_ms"] > 0
