"""Which system calls benchmark programs make inside the sandbox: how the seccomp allow list
(spot_eval/execution/syscalls.py) was derived.

Runs the HumanEval canonical solutions and the MBPP reference solutions, each judged against its tests, through
the sandbox with `strace -f` on the child, and counts, per system call made after the child installed its
seccomp filter (the program, its answers to the judge's calls and the interpreter's exit), how many programs
made it. Prints one
JSON line: the machine, the programs and how many passed, the calls (name -> programs), and the calls that
the allow list lacks (`missing`, empty when the list covers every program) or has that no program made.
A call the allow list lacks shows as an EPERM in the trace, so `missing` is read from the trace, not from
the outcome. Needs strace (`apt-get install strace`).

Usage: python bench/sandbox_syscalls.py [--mbpp-splits test+train+validation+prompt] [--workers 2] [--limit N]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from spot_eval.data import datasets
from spot_eval.execution import problems, sandbox, syscalls

# strace -f lines: "<pid> name(args...) = result", or "<pid> <... name resumed> ..." for a call that another
# process's line interrupted.
_CALL = re.compile(r"^(?:\d+\s+)?(?:<\.\.\. )?([a-z_0-9]+)(?:\(| resumed>)")
_INSTALLED = re.compile(r"prctl\(PR_SET_SECCOMP|seccomp\(SECCOMP_SET_MODE_FILTER")


def programs(splits: list[str]) -> list[tuple[str, str, problems.Tests]]:
    """(name, program, tests) of every HumanEval problem and MBPP item of `splits`, as the code tasks build them."""
    out = [(p["task_id"], p["prompt"] + p["canonical_solution"], problems.humaneval(p)) for p in datasets.load("humaneval_test")]
    for split in splits:
        out += [(f"mbpp/{d['task_id']}", d["code"], problems.mbpp(d)) for d in datasets.mbpp_split(split)]
    return out


def traced_calls(log: Path) -> tuple[set[str], set[str]]:
    """(calls made after the filter was installed, those of them that failed with EPERM) in one strace log."""
    made, denied, after = set(), set(), False
    for line in log.read_text(errors="replace").splitlines():
        if not after:
            after = bool(_INSTALLED.search(line))
            continue
        match = _CALL.match(line)
        if match:
            made.add(match.group(1))
            if "= -1 EPERM" in line:
                denied.add(match.group(1))
    return made, denied


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mbpp-splits", default="test+train+validation+prompt")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--limit", type=int, default=None, help="the first N programs only (a quick look)")
    args = parser.parse_args()
    strace = shutil.which("strace")
    if strace is None:
        raise SystemExit("error: strace is not installed (apt-get install strace)")
    items = programs(args.mbpp_splits.split("+"))[: args.limit]
    logs = Path(tempfile.mkdtemp(prefix="sandbox-syscalls-"))
    command = sandbox.command

    def traced(script: Path, limits: sandbox.Limits, fds: tuple[int, int, int]) -> list[str]:
        log = logs / f"{os.getpid()}-{script.parent.name}.log"
        return [strace, "-f", "-qq", "-o", str(log), "--", *command(script, limits, fds)]

    sandbox.command = traced
    outcomes = sandbox.run_many([p for _, p, _ in items], sandbox.Limits(timeout_s=30.0), args.workers, [t for _, _, t in items])
    counts: collections.Counter[str] = collections.Counter()
    denied: collections.Counter[str] = collections.Counter()
    for log in logs.iterdir():
        made, refused = traced_calls(log)
        counts.update(made)
        denied.update(refused)
    shutil.rmtree(logs)
    machine = os.uname().machine
    allowed = set(syscalls.allowed(machine)) if machine in syscalls.NUMBERS else set()
    print(json.dumps({
        "bench": "sandbox_syscalls", "machine": machine, "programs": len(items),
        "passed": sum(o.passed for o in outcomes),
        "failed": [name for (name, _, _), o in zip(items, outcomes, strict=True) if not o.passed],
        "calls": dict(sorted(counts.items())), "denied": dict(sorted(denied.items())),
        "missing": sorted(set(counts) - allowed), "unused": sorted(allowed - set(counts)),
    }))


if __name__ == "__main__":
    main()
