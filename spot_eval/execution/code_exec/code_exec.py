"""pass@k of generated programs, each run in `spot_eval.execution.sandbox` and judged against its tests outside it.

An `evaluate` metric loaded from its folder, `evaluate.load("<path to this folder>")`, so it needs no hub.
It replaces the hub's `code_eval` that lm-eval's mbpp and humaneval tasks load: the same inputs and the same
unbiased estimator, but each program runs in a confined subprocess and its tests in the judge, outside the
program's process, rather than both in a thread of the evaluating process; no HF_ALLOW_CODE_EVAL switch is involved.
"""

from __future__ import annotations

from collections.abc import Sequence

import datasets
import evaluate

from spot_eval.execution.pass_at_k import WORKERS, sandboxed_pass_at_k
from spot_eval.execution.sandbox import Limits

_DESCRIPTION = """Runs every candidate program in a sandboxed subprocess and its problem's test code in a judge
process outside it, every call between them in plain data, and estimates pass@k with the unbiased estimator 1 - C(n-c, k) / C(n, k) of Chen et al. (2021), where n is the
number of candidates of a problem and c the number that passed."""

_CITATION = """@article{chen2021codex,
  title={Evaluating Large Language Models Trained on Code},
  author={Mark Chen and others},
  journal={arXiv preprint arXiv:2107.03374},
  year={2021}
}"""

_INPUTS = """
Args:
    predictions: list of lists of candidate programs, one list per problem.
    references: list of test programs, one per problem (they fail by raising), run in the judge against each
        candidate (spot_eval.execution.judge); a vendored MBPP or HumanEval problem's is recognised.
    k: the k of pass@k to report; pass@k is left out when a problem has fewer than k candidates.
    timeout_s: wall-clock (and CPU) seconds each candidate may run.
    workers: how many candidates run at once.
Returns:
    {"pass@<k>": mean over problems, ..., "outcomes": per problem, the sandbox Outcome of each candidate}
"""


# The inputs of both sandboxed metrics (this one and the hub-compatible code_eval): candidate programs per problem,
# and each problem's tests.
PROGRAMS = datasets.Features({"predictions": datasets.Sequence(datasets.Value("string")), "references": datasets.Value("string")})


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _INPUTS)
class CodeExec(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            module_type="metric",
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_INPUTS,
            features=PROGRAMS,
        )

    def _compute(
        self,
        predictions: list[list[str]],
        references: list[str],
        k: Sequence[int] = (1,),
        timeout_s: float = Limits.timeout_s,
        workers: int = WORKERS,
    ) -> dict:
        scores, outcomes = sandboxed_pass_at_k(predictions, references, k, timeout_s, workers)
        return {**scores, "outcomes": outcomes}
