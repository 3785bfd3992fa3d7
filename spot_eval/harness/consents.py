"""Which of the tasks named on lm-eval's command line run model-written code, read from their YAML.

lm-eval 0.4.13 checks a task's `unsafe_code` inside `evaluate()`, after the model has loaded (seconds for the
embedded target, minutes for an 8B checkpoint). Reading the task configs first lets a missing
`--confirm_run_unsafe_code` be one line before anything loads (spot_eval.harness.registration)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import yaml


def unsafe_tasks(index: Mapping[str, Any], names: Iterable[str | dict]) -> list[str]:
    """The tasks among `names` (tasks, groups and tags of lm-eval's task index, or inline task configs) whose
    config sets `unsafe_code`, groups and tags expanded, in the order first met. Names the index lacks are
    left to lm-eval, which reports them."""
    from lm_eval.tasks._index import Kind
    from lm_eval.tasks._yaml_loader import load_yaml

    found: list[str] = []
    seen: set[tuple[str, bool]] = set()

    def config(entry) -> dict:
        if entry.yaml_path is None:
            return entry.cfg or {}
        try:
            return load_yaml(entry.yaml_path, resolve_func=False)  # functions stay unimported
        except (OSError, ValueError, yaml.YAMLError):
            return {}  # lm-eval reports a broken config itself, and still checks unsafe_code after loading

    def visit(item: str | dict, inherited: bool) -> None:
        if isinstance(item, dict):
            if isinstance(item.get("task"), str) and item["task"] in index:
                visit(item["task"], inherited or bool(item.get("unsafe_code")))
            elif (inherited or item.get("unsafe_code")) and item.get("task") not in found:
                found.append(str(item.get("task")))
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
        elif unsafe and item not in found:
            found.append(item)

    for name in names:
        visit(name, False)
    return found
