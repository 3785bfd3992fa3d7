"""The hub's `code_eval` interface over spot-eval's sandbox, for lm-eval's own `mbpp` and `humaneval`.

`spot-eval cache-datasets` installs this file in evaluate's module cache as `evaluate-metric--code_eval`, which
`evaluate.load("code_eval")` takes when the hub is offline. It keeps code_eval's inputs, its
HF_ALLOW_CODE_EVAL=1 consent and its return value, `(pass_at_k, results)`, but each program runs in a confined
subprocess and its tests in the judge, outside the program's process (spot_eval.execution.sandbox), instead of
both in a thread of the evaluating process. A reference that is a vendored MBPP or HumanEval problem's test code
(what lm-eval's `mbpp` and `humaneval` pass) is recognised, so its prompt's helpers are the judge's own, as in the
spot tasks (spot_eval.execution.problems.lookup).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import evaluate

from spot_eval.execution.code_exec.code_exec import PROGRAMS
from spot_eval.execution.pass_at_k import sandboxed_pass_at_k

_DESCRIPTION = """code_eval's interface (predictions: candidates per problem; references: each problem's test code;
k; num_workers; timeout), every candidate run with its tests in spot-eval's sandbox."""

_INPUTS = """
Args:
    predictions: per problem, a list of candidate programs.
    references: per problem, its test code.
    k: the k of pass@k (default [1, 10, 100]); a k larger than some problem's candidate count is left out.
    num_workers: sandboxed programs run at once (default 4).
    timeout: seconds a program may run (default 3.0).
Returns:
    (pass_at_k, results): {"pass@k": mean over problems}, and per problem index a list of
    (completion_id, {"task_id", "completion_id", "passed", "result", "crossings"}) as code_eval returns, with
    what crossed the boundary other than plain data (spot_eval.execution.judge).
"""

_CONSENT = """spot-eval's code_eval runs model-written programs (in its sandbox). As with the hub's code_eval,
set HF_ALLOW_CODE_EVAL=1 to say you accept that: export HF_ALLOW_CODE_EVAL="1"."""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _INPUTS)
class CodeEval(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            module_type="metric",
            description=_DESCRIPTION,
            citation="",
            inputs_description=_INPUTS,
            features=PROGRAMS,
        )

    def _compute(self, predictions: list[list[str]], references: list[str], k: Sequence[int] = (1, 10, 100),
                 num_workers: int = 4, timeout: float = 3.0):
        if os.getenv("HF_ALLOW_CODE_EVAL", "0") != "1":
            raise ValueError(_CONSENT)
        scores, outcomes = sandboxed_pass_at_k(predictions, references, k, timeout, num_workers)
        results = {
            task: [(n, {"task_id": task, "completion_id": n, "passed": o.passed, "result": "passed" if o.passed else o.status,
                        "crossings": list(o.crossings)})
                   for n, o in enumerate(problem)]
            for task, problem in enumerate(outcomes)
        }
        return scores, results
