"""bench/ci_time.py reads a .ci/run log as the run printed it, and refuses one that is not whole."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("ci_time", Path(__file__).parent.parent / "bench" / "ci_time.py")
CI_TIME = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(CI_TIME)

LOG = """ci: chromium and actionlint ready after 3 s
........................................................................ [100%]
============================= slowest 25 durations =============================
66.31s call     tests/test_parallel.py::test_two_processes
60.02s setup    tests/test_nightly.py::test_nightly
4.10s call     tests/test_lm.py::test_console_script
---------- coverage: platform linux, python 3.11.7-final-0 -----------
spot/engine.py                                    238      2    99%
spot_eval/execution/launcher.py                   214    140    35%
spot_eval/harness/parallel.py                      98     28    71%
TOTAL                                            8252    445  94.60%
Required test coverage of 93.6% reached. Total coverage: 94.60%
945 passed, 2 skipped, 3 warnings in 604.17s (0:10:04)
All checks passed!
ci: done in 670 s
"""


def test_a_ci_log_gives_the_run_s_figures():
    run = CI_TIME.figures(LOG, "963d84d0123")
    assert (run["tests"], run["skipped"], run["coverage_percent"]) == (945, 2, 94.6)
    assert (run["pytest_seconds"], run["other_seconds"], run["total_seconds"]) == (604, 66, 670)
    assert run["commit"] == "963d84d" and run["slowest"][0] == [66.31, "tests/test_parallel.py::test_two_processes"]
    assert len(run["slowest"]) == 3
    assert run["below_80_percent"] == [["spot_eval/execution/launcher.py", 35.0], ["spot_eval/harness/parallel.py", 71.0]]


def test_a_cut_log_is_refused_by_name():
    with pytest.raises(SystemExit, match="no 'ci: done' line"):
        CI_TIME.figures(LOG.replace("ci: done in 670 s", ""), "963d84d")


def test_the_ci_page_says_why_each_low_module_is_low_and_refuses_one_with_no_why(tmp_path):
    spec = importlib.util.spec_from_file_location("generate", Path(__file__).parent.parent / "docs" / "generate.py")
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    run = CI_TIME.figures(LOG, "963d84d0123")
    (tmp_path / "ci-latest.json").write_text(json.dumps(run))
    explained = {"spot_eval/execution/launcher.py": "runs in the child"}
    with pytest.raises(SystemExit, match="spot_eval/harness/parallel.py below 80% coverage .* say why under"):
        generate.latest_run(tmp_path / "ci-latest.json", explained)
    page = generate.latest_run(tmp_path / "ci-latest.json", {**explained, "spot_eval/harness/parallel.py": "runs under accelerate"})
    assert "| `spot_eval/harness/parallel.py` | 71% | runs under accelerate |" in page
