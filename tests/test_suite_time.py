"""bench/suite_time.py's reading of a suite's runs, on literal samples."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("suite_time", Path(__file__).parent.parent / "bench" / "suite_time.py")
SUITE_TIME = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(SUITE_TIME)


def test_the_decoding_seconds_sum_every_method_of_every_request_of_every_run(tmp_path):
    for request, (run, seconds) in enumerate((("T0-seed0", (1.5, 2.0)), ("T1-seed0", (3.0, 0.25)))):
        folder = tmp_path / "suite" / "runs" / run
        folder.mkdir(parents=True)
        rows = [{"task": "t", "doc_id": 0, "repeat": 0, "request": request, "label": label, "seconds": s}
                for label, s in zip(("draft_free", "spot@8"), seconds, strict=True)]
        (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert SUITE_TIME.decode_seconds(tmp_path / "suite") == {"runs": 2, "requests": 2, "samples": 4, "decode_seconds": 6.8}


def test_a_folder_without_runs_names_the_fix(tmp_path):
    with pytest.raises(SystemExit, match="no runs under .*run the suite first"):
        SUITE_TIME.decode_seconds(tmp_path)
