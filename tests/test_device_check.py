"""bench/device_check.sh, the prepared GPU check, in its CPU dry run: every stdout line is one JSON figure,
and each part (verify cost of both models and layouts, exactness of both layouts, the benchmark)
reports; and bench/steps.py, which runs the bench steps, keeps going past a failing one."""

from __future__ import annotations

import importlib.util
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
    failed = [line for line in run.stdout.splitlines() if '"failed"' in line]  # which step and its error, kept short
    assert run.returncode == 0, "\n".join(failed) + "\n" + run.stderr[-3000:]
    figures = [json.loads(line) for line in run.stdout.splitlines()]
    cost = {(f["model"], f["layout"], f["pieces"]) for f in figures if f["bench"] == "verify_cost"}
    assert cost == {(m, layout, p) for m in ("embedded", "sdar-8b", "llada2-mini") for layout in ("default", "exact") for p in (1, 2, 3)}
    exact = [f for f in figures if f["bench"] == "verify_exactness" and f["layout"] == "exact" and "policy" in f]
    assert exact and all(f["max_abs_logit_diff"] == 0 and f["flips"] == 0 for f in exact)
    bench = [f for f in figures if f["bench"] == "benchmark"]
    assert {f["task"] for f in bench} == {"spot_gsm8k"}  # the dry run's one task (the GPU run's four: spot_all)
    assert all(f["lossless"] == 1.0 for f in bench) and {f["label"] for f in bench} == {"draft_free", "spot@8", "spot@auto", "spiffy@3"}
    [batching] = [f for f in figures if f["bench"] == "batching"]
    assert {(r["label"], r["batch"]) for r in batching["rows"]} == {(m, b) for m in ("draft_free", "spot@8", "spiffy@3") for b in (1, 2)}
    assert batching["exact"] and all(r["differ_from_batch1"] == 0 and r["lossless"] == 1.0 for r in batching["rows"])
    [placed] = [f for f in figures if f["bench"] == "placement_overhead"]
    assert set(placed["layouts"]) == {"whole", "hooks", "half_disk", "disk"}
    assert all(m["same_tokens_and_forwards"] for layout in placed["layouts"].values() for m in layout.values())
    [auto] = [f for f in figures if f["bench"] == "auto_cost"]
    # the dry run's dtype; the GPU run's is bfloat16
    assert auto["exact"] and auto["profile"]["key"]["dtype"] == "float32" and auto["order_model_ms"] > 0


def test_a_failing_step_is_reported_on_stdout_and_the_next_steps_still_run(tmp_path, capsys, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_steps", REPO / "bench" / "steps.py")
    steps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(steps)
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # run() sets them for each step, as a started script sees them
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "broken.py").write_text("raise RuntimeError('no kernel image is available for this GPU')\n")
    (tmp_path / "usage.py").write_text("import argparse\nargparse.ArgumentParser().parse_args()\n")  # exits 2
    (tmp_path / "done.py").write_text("import sys\nsys.exit(0)\n")
    (tmp_path / "figure.py").write_text("import json, sys\nprint(json.dumps({'bench': 'figure', 'argv': sys.argv[1:]}))\n")
    failed = steps.run([("broken", "broken.py"), ("usage", "usage.py --layers 12"), ("done", "done.py"),
                        ("figure", "figure.py --pieces 1+2")], tmp_path)
    out = capsys.readouterr()
    assert failed == ["broken", "usage"]
    assert [json.loads(line) for line in out.out.splitlines()] == [
        {"bench": "steps", "failed": "broken", "error": "RuntimeError('no kernel image is available for this GPU')"},
        {"bench": "steps", "failed": "usage", "error": "SystemExit(2)"},
        {"bench": "figure", "argv": ["--pieces", "1+2"]},
    ]
    assert "Traceback" in out.err and "unrecognized arguments: --layers 12" in out.err
