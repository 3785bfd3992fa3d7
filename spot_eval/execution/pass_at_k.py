"""pass@k of generated programs, each run in the sandbox and judged against its problem's tests outside it
(spot_eval.execution.sandbox).

Plain functions, without `evaluate`: importing `evaluate` costs ~5 s of CPU (it imports transformers' pipelines),
which every process of an `lm_eval` run that scores spot_mbpp or spot_humaneval would pay before its first
request. The metrics (code_exec/, code_eval/) wrap the same functions for `evaluate.load` users.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import fmean

from spot_eval.execution import problems
from spot_eval.execution.problems import Tests
from spot_eval.execution.sandbox import Limits, SandboxError, confinement, run_many

WORKERS = 2  # candidates that run at once unless the caller says otherwise


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate for one problem with n candidates of which c passed (Chen et al. 2021,
    eq. 1). Exact integer binomials, so it is also exact for large n."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def sandboxed_pass_at_k(predictions: list[list[str]], references: Sequence[str | Tests], k: Sequence[int],
                        timeout_s: float = Limits.timeout_s, workers: int = WORKERS) -> tuple[dict[str, float], list[list]]:
    """({"pass@k": mean over problems}, per problem the sandbox Outcome of each candidate). A k larger than some
    problem's candidate count is left out. A reference is a problem's `Tests`, or its test code (a known MBPP or
    HumanEval problem's is recognised: spot_eval.execution.problems.lookup). What the code tasks score with
    (tasks/execution.py), and what both metrics compute: code_exec, and the code_eval that lm-eval's own tasks
    load (spot_eval/execution/code_eval)."""
    try:
        confinement()  # refuse, with the reason, where nothing can be confined; once per process
    except SandboxError as err:
        raise ValueError(str(err)) from None
    tests = [problems.lookup(r) if isinstance(r, str) else r for r in references]
    # Each candidate runs in the sandbox; its problem's tests run in the judge, outside it (sandbox.py).
    pairs = [(candidate, t) for candidates, t in zip(predictions, tests, strict=True) for candidate in candidates]
    flat = iter(run_many([c for c, _ in pairs], Limits(timeout_s=timeout_s), workers, tests=[t for _, t in pairs]))
    outcomes = [[next(flat) for _ in candidates] for candidates in predictions]
    counts = [(len(problem), sum(o.passed for o in problem)) for problem in outcomes]  # (n, c) per problem
    ks = [k] if isinstance(k, int) else k
    scores = {f"pass@{k_}": fmean(pass_at_k(n, c, k_) for n, c in counts) for k_ in ks if all(n >= k_ for n, _ in counts)}
    return scores, outcomes
