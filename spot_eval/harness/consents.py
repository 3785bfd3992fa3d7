"""Which of the tasks named on lm-eval's command line run model-written code, and which consents they need, read
from their YAML.

lm-eval 0.4.13 checks a task's `unsafe_code` inside `evaluate()`, after the model has loaded (seconds for the
embedded target, minutes for an 8B checkpoint), and upstream's code tasks ask for HF_ALLOW_CODE_EVAL=1 when their
`utils` module is imported, which is later still. Reading the task configs first lets a missing consent be one
line before anything loads (spot_eval.harness.registration)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# evaluate's `code_eval` (the hub's, or the sandboxed one `spot-eval cache-datasets` installs under its name)
# refuses to run without HF_ALLOW_CODE_EVAL=1. lm-eval's code tasks load it in their utils module.
_LOADS_CODE_EVAL = re.compile(r"""\bload\(\s*["']code_eval["']""")


@dataclass(frozen=True)
class CodeTask:
    name: str
    code_eval: bool  # scored through evaluate's `code_eval`, which also needs HF_ALLOW_CODE_EVAL=1


def code_tasks(index: Mapping[str, Any], names: Iterable[str | dict]) -> list[CodeTask]:
    """The tasks among `names` (tasks, groups and tags of lm-eval's task index, or inline task configs) whose
    config sets `unsafe_code`, groups and tags expanded, in the order first met. Names the index lacks are
    left to lm-eval, which reports them."""
    from lm_eval.tasks._index import Kind
    from lm_eval.tasks._yaml_loader import load_yaml

    found: dict[str, CodeTask] = {}
    seen: set[tuple[str, bool]] = set()

    def config(entry) -> dict:
        if entry.yaml_path is None:
            return entry.cfg or {}
        try:
            return load_yaml(entry.yaml_path, resolve_func=False)  # functions stay unimported: "dir/module.name"
        except (OSError, ValueError, yaml.YAMLError):
            return {}  # lm-eval reports a broken config itself, and still checks unsafe_code after loading

    def add(name: str, cfg: dict) -> None:
        found.setdefault(name, CodeTask(name, _scored_by_code_eval(cfg)))

    def visit(item: str | dict, inherited: bool) -> None:
        if isinstance(item, dict):
            if isinstance(item.get("task"), str) and item["task"] in index:
                visit(item["task"], inherited or bool(item.get("unsafe_code")))
            elif inherited or item.get("unsafe_code"):
                add(str(item.get("task")), item)
            return
        if (item, inherited) in seen or item not in index:
            return
        seen.add((item, inherited))
        entry = index[item]
        if entry.kind is Kind.TAG:
            for name in sorted(entry.tags):
                visit(name, inherited)
            return
        cfg = config(entry)
        unsafe = inherited or bool(cfg.get("unsafe_code"))
        if entry.kind is Kind.GROUP:
            for member in cfg.get("task") or []:
                visit(member, unsafe)
        elif unsafe:
            add(item, cfg)

    for name in names:
        visit(name, False)
    return list(found.values())


def _scored_by_code_eval(cfg: dict) -> bool:
    """Whether a task config names evaluate's `code_eval` as a metric, or calls a function of a module that
    loads it (lm-eval's humaneval and mbpp: `metric: !function utils.pass_at_k`)."""
    for value in _strings(cfg):
        if value == "code_eval":
            return True
        module = Path(value.rpartition(".")[0] + ".py")
        if module.is_absolute() and module.is_file() and _LOADS_CODE_EVAL.search(module.read_text(errors="replace")):
            return True
    return False


def _strings(value) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
