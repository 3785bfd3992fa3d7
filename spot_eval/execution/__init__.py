"""Running model-written programs: the sandbox, and the `evaluate` metric that scores code with it.

- `sandbox.py`: the confined subprocess (parent side `run` / `run_many`; the same file is the child).
- `code_exec/`: an `evaluate` metric loaded from its folder (`evaluate.load(CODE_EXEC_METRIC)`), so
  it needs no hub; the code tasks' `process_results` (tasks/execution.py) call it.

Imports nothing of spot_eval outside this subpackage.
"""

from pathlib import Path

CODE_EXEC_METRIC = Path(__file__).resolve().parent / "code_exec"
