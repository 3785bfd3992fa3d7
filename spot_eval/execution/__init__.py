"""Running model-written programs: the sandbox, pass@k over it, and the `evaluate` metrics that wrap it.

- `sandbox.py`: the confined subprocess (parent side `run` / `run_many`; the same file is the child).
- `pass_at_k.py`: each candidate run with its tests in the sandbox, and the unbiased pass@k; the code tasks'
  `process_results` (tasks/execution.py) call it, without importing `evaluate`.
- `code_exec/`: the same as an `evaluate` metric loaded from its folder (`evaluate.load(CODE_EXEC_METRIC)`), so
  it needs no hub; `code_eval/`: the hub's code_eval interface over it, for lm-eval's own tasks.

Imports nothing of spot_eval outside this subpackage.
"""

from pathlib import Path

CODE_EXEC_METRIC = Path(__file__).resolve().parent / "code_exec"
