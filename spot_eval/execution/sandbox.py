"""Run a model-written program in a confined subprocess, and judge its tests outside it.

Two processes per candidate, both fresh interpreters (`python -I -S -B`, no site-packages, no PYTHON* variables,
an environment of PATH, LANG and HOME only): the sandboxed child (spot_eval.execution.launcher), which confines
itself and then holds the program, and the judge (spot_eval.execution.judge), which holds no model-written code,
runs the problem's tests and computes the verdict. They talk over two pipes, in plain data
(spot_eval.execution.wire). The program's process decides nothing: `sys.exit(0)`, a patched `exec`, a rewritten
test frame or a forged message on its pipe can make its functions return something, never make the tests pass.

`run` / `run_many` are this side; `confinement()` says which layers the kernel granted (run.json and MLflow's
`sandbox/*`); seccomp is the one that is required. Each Outcome is small and printable whatever the program sent:
its stderr, the judge's reason and the crossings are cut to fixed lengths here, and every character that is not
printable (NUL, ESC, lone surrogates, right-to-left overrides) is escaped (`_shown`), so what reaches logs and reports
is inert text; the judge, which decodes what the program sends, bounds it there (judge.py, wire.py) and runs
under limits of its own (JUDGE_MEMORY_BYTES). What is not guaranteed: tests whose inputs are objects of the
program's own classes (MBPP 367; `weaker_guarantee` in tasks/spot_mbpp.yaml) get those objects as the program
builds them; and against a kernel exploit, only a container or a VM around the harness helps.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from spot_eval.execution.problems import Tests

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import BinaryIO

Status = Literal["passed", "failed", "timeout", "error"]

STDERR_TAIL = 2000  # characters of the program's stderr kept in an Outcome
REASON_CHARS = 2000  # characters of the judge's reason kept in an Outcome
CROSSING_CHARS = 120  # characters of each crossing kept ("reduced " and a class name of at most wire.MAX_NAME)
VERDICT_BYTES = 64 << 10  # of the judge's verdict (JSON) read; a longer one is no verdict (the judge's is ~10 kB at most)
_LAUNCHER = Path(__file__).resolve().with_name("launcher.py")
_JUDGE = Path(__file__).resolve().with_name("judge.py")
_ENV_PATH = "/usr/local/bin:/usr/bin:/bin"


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up (e.g. no seccomp on this kernel), so nothing was run."""


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 10.0  # wall clock for the program and its tests; CPU time is capped at the same seconds
    memory_bytes: int = 1 << 30  # RLIMIT_AS: the address space, so an allocation past it is a MemoryError
    file_bytes: int = 1 << 20  # RLIMIT_FSIZE: the largest file the program may write, its stderr included
    disk_bytes: int = 64 << 20  # all the files the program writes together (its working directory is a tmpfs)


# The judge's own address space (RLIMIT_AS, which it sets on itself; its CPU seconds are the program's). It holds
# no model-written code, but it decodes what the program sends: a message (wire.MAX_MESSAGE, twice while it is
# read), its decoded value (wire.MAX_DECODED) and the tests' own work fit, with room to spare; past it the judge
# fails the candidate (MemoryError) or dies without a verdict, which fails it too.
JUDGE_MEMORY_BYTES = 1 << 30


@dataclass(frozen=True)
class Confinement:
    """What the kernel let the child do to confine itself."""

    seccomp: bool  # an allow list of system calls; every other call fails with EPERM (required)
    landlock_abi: int  # 0: reads and writes are not confined by Landlock (no Landlock on this kernel)
    namespaces: bool  # own mount and network namespaces, and a root holding only the read set
    disk_bytes: int  # the cap on all the files the program writes (its tmpfs); 0: none (no namespaces)
    own_uid: bool  # a uid no other process has (the harness is root); False: the harness's own uid

    def as_params(self) -> dict[str, object]:
        return {f"sandbox/{key}": value for key, value in asdict(self).items()}

    def gaps(self) -> list[str]:
        """What this kernel did not grant, in words (run.json's sandbox/gaps; empty where everything holds)."""
        return [gap for granted, gap in (
            (self.landlock_abi >= 1, "no Landlock: the program's reads and writes are not confined to its directory"),
            (self.namespaces, "no namespaces: the program sees the harness's file system (stat, /proc) and network"),
            (self.disk_bytes > 0, "no tmpfs: only each file's size is capped, not the total the program writes"),
            (self.own_uid, "the program runs as the harness's user (not root): a call that slipped the system-call "
                           "filter could reach the harness's processes"),
        ) if not granted]


@dataclass(frozen=True)
class Outcome:
    """How one program ended. `passed`: the judge ran its tests to their end; `failed`: a test failed, the
    program raised before its tests, or its process ended while they ran (sys.exit, os._exit, a hook);
    `timeout`: it hit the wall-clock or CPU limit; `error`: a signal killed it (a crash), or the sandbox could not
    be set up."""

    status: Status
    stderr: str  # the program's stderr, its last STDERR_TAIL characters
    reason: str = ""  # the judge's words: which test failed and how, or why the program's side ended
    crossings: tuple[str, ...] = ()  # what crossed the boundary other than plain data (spot_eval.execution.judge)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def weaker(self) -> bool:
        """The tests used objects of the program's own classes: their inputs were as the program built them."""
        return "program object" in self.crossings


def run(program: str, limits: Limits = Limits(), tests: Tests | str | None = None) -> Outcome:
    """Run `program` in the sandbox and `tests` (a str: tests of no known problem) in the judge, and say how it
    ended. Without tests, it passes when it runs to its end."""
    outcome, _ = _run(program, limits, Tests(tests) if isinstance(tests, str) else tests or Tests(""))
    return outcome


def run_many(programs: Sequence[str], limits: Limits = Limits(), workers: int = 2,
             tests: Sequence[Tests | str | None] | None = None) -> list[Outcome]:
    """`run` over many programs (each with its tests, where given), `workers` at a time, in order."""
    pairs = zip(programs, tests if tests is not None else [None] * len(programs), strict=True)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda pair: run(pair[0], limits, pair[1]), pairs))


@functools.cache
def confinement() -> Confinement:
    """What this kernel grants the sandbox, found by confining one empty program (once per process).

    Raises:
        SandboxError: the child could not confine itself at all (no seccomp): nothing can be run safely.
    """
    outcome, granted = _run("pass", Limits(timeout_s=30.0), Tests(""))
    if granted is None or not outcome.passed:
        reason = ((outcome.stderr + "\n" + outcome.reason).strip().splitlines() or [outcome.status])[-1][-300:]
        raise SandboxError(
            f"model-written code cannot be confined on this machine ({reason}); "
            "the sandbox needs seccomp (Linux >= 3.5 on x86_64 or aarch64), so run the code tasks where it is available"
        )
    return granted


# Both processes' interpreter: isolated (no user site, no PYTHON* variables), no site module, no bytecode written.
_PYTHON = (sys.executable, "-I", "-S", "-B")


def command(script: Path, limits: Limits, fds: tuple[int, int, int]) -> list[str]:
    """The child's command line (bench/sandbox_syscalls.py runs it under strace to derive the allow list)."""
    argv = [*_PYTHON, str(_LAUNCHER), *map(str, fds), str(math.ceil(limits.timeout_s))]
    return argv + [str(limits.memory_bytes), str(limits.file_bytes), str(limits.disk_bytes), str(script)]


def _run(program: str, limits: Limits, tests: Tests) -> tuple[Outcome, Confinement | None]:
    try:
        names = tests.program_names()
    except SyntaxError as err:
        return Outcome("failed", "", f"[spot-eval judge: the tests do not parse: {err}]"), None
    spec = json.dumps({"tests": tests.code, "prelude": tests.prelude, "names": names,
                       "filename": f"<tests of {tests.problem or 'the program'}>"}).encode()
    with (
        tempfile.TemporaryDirectory(prefix="spot-sandbox-", ignore_cleanup_errors=True) as workdir,
        tempfile.TemporaryFile() as stderr,
        tempfile.TemporaryFile() as verdict_file,  # files, not pipes: this side reads a bounded part of each
        tempfile.TemporaryFile() as judge_stderr,
    ):
        script = Path(workdir) / "program.py"
        script.write_text(program, encoding="utf-8")
        # Three pipes: the child's report of its confinement, the judge's calls, the child's replies.
        report_r, report_w = os.pipe()
        call_r, call_w = os.pipe()
        reply_r, reply_w = os.pipe()
        try:
            child = _spawn(command(script, limits, (report_w, call_r, reply_w)), workdir, stderr, (report_w, call_r, reply_w))
            judge_limits = (str(math.ceil(limits.timeout_s)), str(JUDGE_MEMORY_BYTES))
            judge = _spawn([*_PYTHON, str(_JUDGE), str(call_w), str(reply_r), *judge_limits], workdir,
                           judge_stderr, (call_w, reply_r), stdin=subprocess.PIPE, stdout=verdict_file)
        finally:
            for fd in (report_w, call_r, reply_w, call_w, reply_r):
                os.close(fd)
        with os.fdopen(report_r, "rb") as report:
            try:
                judge.communicate(spec, timeout=limits.timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(judge.pid)
                judge.wait()
            # Also after a verdict: the program's process, and anything it left behind in its group, dies now.
            _kill_group(child.pid)
            returncode = child.wait()
            granted = _granted(report.read())
        tail = _tail(stderr)
        verdict = _verdict(verdict_file)
        judge_said = (_tail(judge_stderr).strip().splitlines() or [""])[-1]
    if timed_out:
        return Outcome("timeout", tail), granted
    if verdict is None:  # the judge died: at its own limits (what the program sent), or of a fault of its own
        status: Status = "timeout" if judge.returncode == -signal.SIGXCPU else "failed"
        why = f"[spot-eval judge: no verdict (the judge's exit status {judge.returncode}): {judge_said}]"
        return Outcome(status, tail, _shown(why, REASON_CHARS)), granted
    if granted is None:
        return Outcome("error", f"the sandbox could not confine the program: {tail}"), None
    crossings = tuple(_shown(kind, CROSSING_CHARS) for kind in verdict["crossings"])
    return Outcome(_status(verdict, returncode), tail, _shown(verdict["message"], REASON_CHARS), crossings), granted


def _status(verdict: dict, returncode: int) -> Status:
    """The verdict's status; where the program's process ended while the tests ran, how it ended decides: the
    CPU limit is a timeout, a crash (a signal other than ours) an error."""
    if verdict["status"] == "passed":
        return "passed"
    if verdict["left"] and returncode == -signal.SIGXCPU:
        return "timeout"
    if verdict["left"] and returncode < 0 and returncode != -signal.SIGKILL:
        return "error"
    return "failed"


def _verdict(stream: BinaryIO) -> dict | None:
    """The judge's verdict; None where it wrote none, or one too long to be its own (VERDICT_BYTES)."""
    stream.seek(0)
    data = stream.read(VERDICT_BYTES + 1)
    if len(data) > VERDICT_BYTES:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def _granted(report: bytes) -> Confinement | None:
    try:
        return Confinement(**json.loads(report))
    except (ValueError, TypeError):
        return None


def _spawn(argv: list[str], workdir: str, stderr, fds: tuple[int, ...], stdin=subprocess.DEVNULL,
           stdout=subprocess.DEVNULL) -> subprocess.Popen:
    return subprocess.Popen(argv, cwd=workdir, env={"PATH": _ENV_PATH, "LANG": "C.UTF-8", "HOME": workdir},
                            stdin=stdin, stdout=stdout, stderr=stderr, pass_fds=fds, start_new_session=True)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is already empty
        os.killpg(pgid, signal.SIGKILL)


def _tail(stream: BinaryIO) -> str:
    size = stream.seek(0, os.SEEK_END)
    stream.seek(max(0, size - 4 * STDERR_TAIL))  # utf-8 is at most 4 bytes a character
    return _shown(stream.read().decode("utf-8", errors="replace"), STDERR_TAIL, tail=True)


def _shown(text: str, chars: int, tail: bool = False) -> str:
    """`text` as an Outcome keeps it: its first `chars` characters (its last, where `tail`), with each character
    that is not printable but a newline (NUL, ESC and the other controls, lone surrogates, U+202E and the other
    bidirectional overrides) written as its escape (\\x1b, \\udc80, \\u202e), so that what the program wrote
    cannot drive a terminal or reorder a log line. Cut again once escaped: never more than `chars` characters."""
    def cut(s: str) -> str:
        return s[-chars:] if tail else s[:chars]

    return cut("".join(c if c.isprintable() or c == "\n" else c.encode("unicode_escape").decode("ascii") for c in cut(text)))
