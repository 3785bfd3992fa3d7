"""Running model-written programs: the sandbox, the judge outside it, pass@k over them, and the `evaluate`
metrics that wrap it.

- `sandbox.py`: `run` / `run_many`: per candidate, the sandboxed child and the judge, and how it ended.
- `launcher.py`: the sandboxed child: confines itself (namespaces, a new root, Landlock, its own uid, rlimits,
  seccomp from `syscalls.py`), runs the program, answers the judge's calls.
- `judge.py`: the trusted side: the problem's tests, outside the program's process, every call into the program
  in plain data (`wire.py`); `problems.py`: what it needs to know of each MBPP and HumanEval problem.
- `pass_at_k.py`: each candidate judged, and the unbiased pass@k; the code tasks' `process_results`
  (tasks/execution.py) call it, without importing `evaluate`.
- `code_exec/`: the same as an `evaluate` metric loaded from its folder (`evaluate.load(CODE_EXEC_METRIC)`), so
  it needs no hub; `code_eval/`: the hub's code_eval interface over it, for lm-eval's own tasks.

Imports nothing of spot_eval but the vendored datasets (spot_eval.data), to know the problems.
"""

from pathlib import Path

CODE_EXEC_METRIC = Path(__file__).resolve().parent / "code_exec"
