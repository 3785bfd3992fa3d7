"""lm-eval's index of its task library, kept between `lm_eval --model spot` runs (spot_eval.harness.task_index):
the same index as lm-eval builds, rebuilt when a task file changes, the user's own folders indexed every run."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
from lm_eval.tasks._index import TaskIndex

from spot_eval.harness import task_index
from spot_eval.harness.registration import runs_spot

BUILD = TaskIndex.__dict__["build"].__func__  # lm-eval's own, whether or not the cache is installed in this process


@pytest.fixture
def library(tmp_path, monkeypatch) -> Path:
    """A small task library standing in for lm-eval's own, and an empty cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "library"
    (root / "arith").mkdir(parents=True)
    (root / "arith" / "add.yaml").write_text("task: add\ntag: [math]\ndataset_path: x\ndoc_to_text: '{{q}}'\n")
    (root / "arith" / "sub.yaml").write_text("task: sub\ntag: math\ndataset_path: x\nprocess_docs: !function utils.f\n")
    (root / "group.yaml").write_text("group: arith\ntask: [add, sub]\n")
    monkeypatch.setattr(task_index, "is_library", lambda path: path.resolve() == root.resolve())
    return root


def counting_build(calls: list):
    def build(paths, *, resolve_includes=True):
        calls.append([str(p) for p in paths])
        return BUILD(paths, resolve_includes=resolve_includes)

    return build


def test_the_kept_index_is_lm_evals_own_and_is_read_back_until_a_task_file_changes(library):
    calls: list = []
    build = task_index.cached(counting_build(calls))
    first = build([library])
    assert first == BUILD([library]) and set(first) == {"add", "sub", "arith", "math"}
    assert first["sub"].cfg["process_docs"].endswith("utils.f")  # functions stay unresolved, as lm-eval indexes them
    [kept] = (task_index.cache_dir()).iterdir()
    assert json.loads(kept.read_text())["format"] == task_index.FORMAT
    assert build([library]) == first and len(calls) == 1  # read back: no second parse

    time.sleep(0.01)
    (library / "arith" / "add.yaml").write_text("task: add2\ndataset_path: x\n")
    changed = build([library])
    assert len(calls) == 2 and "add2" in changed and "add" not in changed
    assert [p.name for p in task_index.cache_dir().iterdir()] != [kept.name] and len(list(task_index.cache_dir().iterdir())) == 1
    (library / "arith" / "mul.yaml").write_text("task: mul\ndataset_path: x\n")
    assert "mul" in build([library]) and len(calls) == 3


def test_the_users_folders_are_indexed_every_run_and_override_the_library(library, tmp_path, caplog):
    calls: list = []
    build = task_index.cached(counting_build(calls))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "add.yaml").write_text("task: add\ndataset_path: mine\n")
    with caplog.at_level(logging.WARNING, logger="lm_eval.tasks._index"):
        index = build([library, mine])
    assert index["add"].cfg["dataset_path"] == "mine" and "Task 'add' from" in caplog.text and "overrides" in caplog.text
    build([library, mine])
    assert calls == [[str(library)], [str(mine)], [str(mine)]]


def test_a_corrupt_cache_is_built_again(library):
    build = task_index.cached(BUILD)
    expected = build([library])
    [kept] = task_index.cache_dir().iterdir()
    kept.write_text('{"format": "spot-eval-lm-eval-index/1", "entries": [{"key"')
    assert build([library]) == expected and json.loads(kept.read_text())["format"] == task_index.FORMAT


def test_only_a_spot_run_installs_it():
    assert runs_spot(["lm_eval", "--model", "spot", "--tasks", "x"]) and runs_spot(["-m", "--model=spot"])
    assert not runs_spot(["lm_eval", "--model", "hf"]) and not runs_spot(["lm_eval", "--model"]) and not runs_spot([])
