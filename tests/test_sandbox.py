"""spot_eval.execution.sandbox: what a confined program can and cannot do, how each way of ending is reported, and
the boundary between the judge and the program (wire.py's format, judge.py's handles)."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spot_eval.execution import sandbox, syscalls
from spot_eval.execution.sandbox import Limits, Outcome, SandboxError, run, run_many

FAST = Limits(timeout_s=5.0)
PROJECT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("program", "status"),
    [
        ("x = 1 + 1\nassert x == 2", "passed"),
        ("assert 1 == 2", "failed"),
        ("raise ValueError('boom')", "failed"),
        ("def f(:\n    pass", "failed"),
        ("raise SystemExit(3)", "failed"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", "failed"),  # kill is denied: EPERM
        ("import ctypes\nctypes.string_at(0)", "error"),  # a real segfault is a crash, not a failure
        ("if __name__ == '__main__':\n    raise SystemExit(1)", "passed"),  # demo blocks do not run
    ],
)
def test_status_of_each_ending(program: str, status: str) -> None:
    assert run(program, FAST).status == status


def test_outcome_keeps_the_stderr_tail() -> None:
    outcome = run("import sys\nprint('x' * 5000, file=sys.stderr)\nraise KeyError('the-end')", FAST)
    assert outcome == Outcome("failed", outcome.stderr, outcome.reason)
    assert not outcome.passed and not outcome.weaker
    assert outcome.reason == "[spot-eval judge: failed: the program raised KeyError before its tests ('the-end')]"
    assert len(outcome.stderr) == sandbox.STDERR_TAIL
    assert outcome.stderr.rstrip().endswith("KeyError: 'the-end'")


def test_infinite_loop_is_killed_at_the_wall_clock_limit() -> None:
    start = time.monotonic()
    outcome = run("while True:\n    pass", Limits(timeout_s=1.0))
    assert outcome.status == "timeout"
    assert time.monotonic() - start < 4.0


def test_sleeping_program_is_killed_too() -> None:
    # Uses no CPU, so only the wall-clock limit (and the process-group kill) can end it.
    start = time.monotonic()
    assert run("import time\ntime.sleep(60)", Limits(timeout_s=1.0)).status == "timeout"
    assert time.monotonic() - start < 4.0


@pytest.mark.parametrize(
    ("program", "limits"),
    [
        ("data = bytearray(16 << 30)", FAST),  # one 16 GiB allocation against the default 1 GiB cap
        # Doubling until the cap; a smaller cap keeps what it really touches small on a shared machine.
        ("data = 'x'\nwhile True:\n    data += data", Limits(timeout_s=5.0, memory_bytes=256 << 20)),
    ],
    ids=["at-once", "growing"],
)
def test_memory_bomb_fails_cleanly(program: str, limits: Limits) -> None:
    outcome = run(program, limits)
    assert outcome.status == "failed"
    assert "MemoryError" in outcome.stderr


def test_no_inherited_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPOT_TEST_SECRET_TOKEN", "hunter2")
    program = "import os, sys\nprint(sorted(os.environ), file=sys.stderr)\nassert 'SPOT_TEST_SECRET_TOKEN' not in os.environ"
    outcome = run(program, FAST)
    assert outcome.passed
    assert outcome.stderr.strip() == str(["HOME", "LANG", "PATH"])
    assert "hunter2" not in outcome.stderr


def test_writes_land_in_a_temporary_directory_that_is_removed() -> None:
    program = (
        "import os, sys\n"
        "open('result.txt', 'w').write('42')\n"
        "print(os.getcwd(), file=sys.stderr)\n"
        "assert os.path.exists(os.path.join(os.getcwd(), 'result.txt'))\n"
        "assert os.path.expanduser('~') == os.getcwd()\n"
    )
    outcome = run(program, FAST)
    assert outcome.passed, outcome.stderr
    workdir = Path(outcome.stderr.strip())
    assert workdir.name.startswith("spot-sandbox-")
    assert not workdir.exists()


def test_large_files_are_refused() -> None:
    outcome = run("open('big', 'w').write('x' * (2 << 20))", FAST)  # 2 MiB against a 1 MiB cap
    assert outcome.status == "failed"
    assert "File too large" in outcome.stderr


@pytest.mark.parametrize(
    ("program", "error"),
    [
        # A fork bomb, bounded: if a fork ever succeeded, its child would exit at once.
        ("import os\nfor _ in range(20):\n    if os.fork() == 0:\n        os._exit(0)", "PermissionError"),
        ("import os\nassert os.system('true') == 0", "AssertionError"),  # system() reports the failed fork
        ("import subprocess\nsubprocess.run(['true'])", "PermissionError"),
        ("import os\nos.execv('/bin/true', ['true'])", "PermissionError"),
        ("import threading\nthreading.Thread(target=print).start()", "can't start new thread"),
        ("import socket\nsocket.create_connection(('127.0.0.1', 9))", "PermissionError"),
        ("import os\nopen('doomed', 'w').close()\nos.remove('doomed')", "PermissionError"),
        ("import os\nos.kill(1, 0)", "PermissionError"),
    ],
    ids=["fork", "os.system", "subprocess", "exec", "thread", "socket", "unlink", "kill"],
)
def test_processes_network_signals_and_deletion_are_denied(program: str, error: str) -> None:
    outcome = run(program, FAST)
    assert outcome.status == "failed"
    assert error in outcome.stderr


def test_stdout_spam_does_not_hang() -> None:
    start = time.monotonic()
    outcome = run("for _ in range(20_000):\n    print('spam' * 1024)", FAST)  # 80 MB to stdout
    assert outcome.passed
    assert time.monotonic() - start < 5.0


def test_run_many_keeps_order_and_reports_each_program() -> None:
    programs = [f"assert {i % 2} == 0" for i in range(6)]
    assert [o.status for o in run_many(programs, FAST)] == ["passed", "failed"] * 3


def test_a_child_that_cannot_confine_itself_is_an_error_and_refused_up_front(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Stands in for a kernel without seccomp: the launcher exits before reporting its confinement.
    launcher = tmp_path / "broken_launcher.py"
    launcher.write_text("raise OSError('no seccomp here')\n")
    monkeypatch.setattr(sandbox, "_LAUNCHER", launcher)
    outcome = run("pass", FAST)  # one program: recorded as an error, and the evaluation goes on
    assert outcome.status == "error" and "could not confine the program" in outcome.stderr
    sandbox.confinement.cache_clear()
    try:
        with pytest.raises(SandboxError, match="cannot be confined on this machine.*no seccomp here"):
            sandbox.confinement()
    finally:
        sandbox.confinement.cache_clear()


def test_this_machine_grants_every_layer() -> None:
    """The CI machine (Linux 6.18) has seccomp, Landlock and unprivileged namespaces; elsewhere the report
    says which layer is missing (tests/test_sandbox_attacks.py checks what each one stops)."""
    granted = sandbox.confinement()
    assert granted.seccomp and granted.landlock_abi >= 1 and granted.namespaces and granted.disk_bytes == Limits().disk_bytes
    assert granted.gaps() == []
    assert granted.own_uid  # this machine's harness runs as root
    assert sandbox.Confinement(True, 0, False, 0, False).gaps() == [
        "no Landlock: the program's reads and writes are not confined to its directory",
        "no namespaces: the program sees the harness's file system (stat, /proc) and network",
        "no tmpfs: only each file's size is capped, not the total the program writes",
        "the program runs as the harness's user (not root): a call that slipped the system-call filter could reach "
        "the harness's processes"]
    assert granted.as_params()["sandbox/landlock_abi"] == granted.landlock_abi


def run_filter(code: bytes, machine: str, nr: int, arg1: int = 0, arch: int | None = None, arg0: int = 0) -> int:
    """The verdict of a classic-BPF seccomp program on one system call (the opcodes syscalls.py emits)."""
    # struct seccomp_data: nr, arch, instruction_pointer, args[6] (a pid is args[0]; ioctl's request args[1])
    data = struct.pack("iIQ6Q", nr, syscalls.AUDIT_ARCH[machine] if arch is None else arch, 0, arg0, arg1, 0, 0, 0, 0)
    program = [struct.unpack_from("HBBI", code, 8 * i) for i in range(len(code) // 8)]
    pc, accumulator = 0, 0
    while True:
        op, jt, jf, k = program[pc]
        if op == syscalls.RET_K:
            return k
        if op == syscalls.LD_W_ABS:
            accumulator, pc = struct.unpack_from("I", data, k)[0], pc + 1
        else:
            taken = accumulator == k if op == syscalls.JEQ_K else accumulator >= k
            pc += 1 + (jt if taken else jf)


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_seccomp_filter_allows_only_its_list(machine: str) -> None:
    code, numbers = syscalls.seccomp_filter(machine), syscalls.NUMBERS[machine]
    allowed = syscalls.allowed(machine)
    for name, nr in allowed.items():
        if name != "ioctl":
            assert run_filter(code, machine, nr) == syscalls.RET_ALLOW, name
    for name in syscalls.OWN_PROCESS_ONLY:  # pid 0 is the caller; any other pid, or a high word the kernel drops
        assert [run_filter(code, machine, numbers[name], arg0=pid) for pid in (0, 1, 4242, 1 << 32)] == [
            syscalls.RET_ALLOW, syscalls.RET_EPERM, syscalls.RET_EPERM, syscalls.RET_ALLOW], name
    refused = {"x86_64": {"socket": 41, "socketpair": 53, "connect": 42, "clone": 56, "fork": 57, "execve": 59, "kill": 62,
                          "ptrace": 101, "unlink": 87, "rename": 82, "pipe": 22, "prctl": 157, "io_uring_setup": 425,
                          "io_uring_enter": 426, "bpf": 321, "userfaultfd": 323, "perf_event_open": 298, "keyctl": 250,
                          "add_key": 248, "memfd_create": 319, "unshare": 272, "mount": 165, "clone3": 435},
               "aarch64": {"socket": 198, "socketpair": 199, "connect": 203, "clone": 220, "execve": 221, "kill": 129,
                           "ptrace": 117, "unlinkat": 35, "renameat2": 276, "pipe2": 59, "prctl": 167, "io_uring_setup": 425,
                           "io_uring_enter": 426, "bpf": 280, "userfaultfd": 282, "perf_event_open": 241, "keyctl": 219,
                           "add_key": 217, "memfd_create": 279, "unshare": 97, "mount": 40, "clone3": 435}}[machine]
    assert not set(refused) & set(allowed)
    for name, nr in refused.items():
        assert run_filter(code, machine, nr) == syscalls.RET_EPERM, name
    unlisted = [nr for nr in range(512) if nr not in allowed.values()]
    assert all(run_filter(code, machine, nr) == syscalls.RET_EPERM for nr in unlisted)  # a call added next year too
    ioctl = numbers["ioctl"]
    assert [run_filter(code, machine, ioctl, request) for request in syscalls.IOCTLS.values()] == [syscalls.RET_ALLOW] * 4
    assert run_filter(code, machine, ioctl, 0x541B) == syscalls.RET_EPERM  # FIONREAD
    assert run_filter(code, machine, numbers["read"], arch=0x40000003) == syscalls.RET_EPERM  # i386 (int 0x80)
    if machine == "x86_64":
        assert run_filter(code, machine, 0x40000000 | numbers["read"]) == syscalls.RET_EPERM  # the x32 ABI


@pytest.mark.parametrize(("machine", "header"), [
    ("x86_64", Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")),
    ("aarch64", Path("/usr/include/asm-generic/unistd.h")),
])
def test_the_syscall_numbers_are_the_kernels(machine: str, header: Path) -> None:
    if not header.is_file():
        pytest.skip(f"{header} is not installed (Debian: linux-libc-dev)")
    defined = {m[1]: int(m[2]) for m in re.finditer(r"#define __NR(?:3264)?_(\w+)\s+(\d+)", header.read_text())}
    spelled = {"newfstatat": "fstatat"} if machine == "aarch64" else {}  # asm-generic's __NR3264_fstatat
    for name, nr in syscalls.NUMBERS[machine].items():
        assert defined[spelled.get(name, name)] == nr, name
    assert set(syscalls.NUMBERS[machine]) <= {n for group in syscalls.GROUPS.values() for n in group}


def test_an_unknown_architecture_is_refused() -> None:
    with pytest.raises(syscalls.UnknownArchitecture, match="riscv64"):
        syscalls.seccomp_filter("riscv64")


def test_the_program_sees_nothing_outside_its_read_set() -> None:
    """A new root holds only the read set: stat, lstat, readlink and access on anything else fail with ENOENT
    (Landlock, at any ABI up to this kernel's 7, governs opening files, not their metadata)."""
    outside = [str(PROJECT), str(PROJECT / "README.md"), "/etc/passwd", "/etc/shadow", "/proc/self/environ", "/proc/1",
               "/home", "/var", "/sys", "/run"]
    program = (
        "import os, sys\n"
        f"for path in {outside!r}:\n"
        "    for call in (os.stat, os.lstat, os.readlink):\n"
        "        try:\n"
        "            call(path)\n"
        "        except FileNotFoundError:\n"
        "            continue\n"
        "        raise AssertionError(f'{call.__name__}({path}) succeeded')\n"
        "    assert not os.access(path, os.F_OK), path\n"
        "assert os.path.isfile(os.__file__) and os.readlink('/etc/localtime')\n"  # the read set is there
    )
    outcome = run(program, FAST)
    assert outcome.passed, outcome.stderr


def test_without_its_filter_the_program_still_reaches_no_other_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The program's own uid is the second wall: with a seccomp filter that allows every call (a launcher whose
    syscalls module says so), prlimit64 and kill on the harness fail with EPERM, while prlimit64 on itself works."""
    allow_all = struct.pack("HBBI", syscalls.RET_K, 0, 0, syscalls.RET_ALLOW)
    launcher = tmp_path / "unfiltered_launcher.py"
    launcher.write_text(
        f"import sys\nsys.path.insert(0, {str(sandbox._LAUNCHER.parent)!r})\nimport syscalls\n"
        f"syscalls.seccomp_filter = lambda machine: {allow_all!r}\n"
        f"path = {str(sandbox._LAUNCHER)!r}\nexec(compile(open(path).read(), path, 'exec'), {{'__name__': '__main__', '__file__': path}})\n")
    monkeypatch.setattr(sandbox, "_LAUNCHER", launcher)
    program = (
        "import ctypes, errno, os, signal\n"
        "libc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
        "limit = (ctypes.c_uint64 * 2)(3, 3)\n"
        "assert libc.syscall(302, os.getppid(), 7, limit, None) == -1 and ctypes.get_errno() == errno.EPERM\n"  # RLIMIT_NOFILE
        "assert libc.syscall(302, os.getppid(), 7, None, (ctypes.c_uint64 * 2)()) == -1 and ctypes.get_errno() == errno.EPERM\n"
        "try:\n    os.kill(os.getppid(), 0)\nexcept PermissionError:\n    pass\nelse:\n    raise AssertionError('kill reached the harness')\n"
        "assert libc.syscall(302, 0, 7, None, (ctypes.c_uint64 * 2)()) == 0\n"
        "assert os.getuid() != 0\n"
    )
    outcome = run(program, FAST)
    assert outcome.passed, outcome.stderr + outcome.reason


def test_the_new_root_keeps_the_links_on_the_way_to_the_read_set(tmp_path: Path) -> None:
    """The read set as the launcher builds the new root from it: each link along a path (a merged /usr's
    /lib -> usr/lib) is recreated under the root, pointing where it points outside, so the path resolves there
    as it does here; the bind mounts then go on the real paths. Only the standard library's paths and the
    system's libraries and time zones are in it, never the project or its virtual environment."""
    from spot_eval.execution import launcher

    directories, files = launcher._readable_paths()
    assert str(PROJECT) not in directories and all(not d.startswith(str(PROJECT)) for d in directories)
    assert "/etc/ld.so.cache" in files and "/dev/null" in files
    root = str(tmp_path)
    for path in directories + files:
        assert launcher._mirror_links(root, path) == str(Path(path).resolve())
        current = ""
        for part in path.strip("/").split("/"):
            current = f"{current}/{part}"
            if Path(current).is_symlink():
                assert (tmp_path / current.lstrip("/")).readlink() == Path(current).readlink()
                current = str(Path(current).resolve())


HARNESS_GROWTH_MIB = 32  # docs/sandbox.md, "Memory": the bound on the harness's peak RSS growth for eight hostile candidates


@pytest.mark.slow
def test_hostile_encoders_fail_small_and_printable_and_eight_of_them_keep_the_harness_small() -> None:
    """Issue 66: programs that replace the encoder on their side (bench/sandbox_memory.py says how) send class
    names of 1 MiB, messages of a few bytes an item that decode into gigabytes, and NUL, ESC, lone surrogates and
    U+202E in an exception, a class name and stderr. Each fails on the trusted side's own limits, its outcome is
    small and printable, and a batch of eight, in a harness of its own, grows its peak RSS by little."""
    bench = subprocess.run([sys.executable, str(PROJECT / "bench" / "sandbox_memory.py"), "--candidates", "8"],
                           capture_output=True, text=True, timeout=120)
    assert bench.returncode == 0, bench.stderr[-2000:]
    result = json.loads(bench.stdout)
    assert result["statuses"] == ["failed"] * 8, result["reasons"]
    reasons = dict(zip(result["candidates"], result["reasons"], strict=True))
    assert "sent a malformed message (a class name of 1048580 bytes (at most 400))" in reasons["names"]
    assert "sent a malformed message (a value that would take more than 128 MiB once decoded)" in reasons["amplification"]
    assert reasons["control"].startswith("[spot-eval judge: a test failed]\nProgramError: \\x1b[2J\\u202egnp.exe\\x07: \\udc80")
    assert ["reduced \\x1b[2J\\u202egnp.exe\\x07"] in result["crossings"]
    assert result["all_printable"]
    # 2000 characters of stderr and 2000 of reason at most, a few crossings; repr doubles each backslash.
    assert result["largest_outcome_repr_chars"] < 16_000
    assert result["harness_peak_rss_mib"]["growth"] < HARNESS_GROWTH_MIB


def test_the_judge_keeps_its_own_memory_limit_and_a_judge_without_a_verdict_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The judge sets its own address-space limit (sandbox.JUDGE_MEMORY_BYTES); past it the candidate fails. A
    judge that dies without a verdict fails its candidate, with the judge's last words made printable."""
    big = ("def f():\n    return ['x' * (8 << 20)] * 5\n", "assert sum(map(len, f())) == 40 << 20")
    assert run(big[0], FAST, tests=big[1]).passed
    monkeypatch.setattr(sandbox, "JUDGE_MEMORY_BYTES", 48 << 20)  # too little to receive the 40 MiB the program returns
    outcome = run(big[0], FAST, tests=big[1])
    assert outcome.status == "failed" and outcome.reason.startswith("[spot-eval judge: a test failed]\nMemoryError")
    broken = tmp_path / "broken_judge.py"
    broken.write_text("raise OSError('\\x1b]0;owned\\x07 the judge broke')\n")
    monkeypatch.setattr(sandbox, "_JUDGE", broken)
    outcome = run("pass", FAST)  # one candidate fails, and the evaluation goes on
    assert (outcome.status, outcome.reason) == (
        "failed", "[spot-eval judge: no verdict (the judge's exit status 1): OSError: \\x1b]0;owned\\x07 the judge broke]")
    sandbox.confinement.cache_clear()
    try:  # a judge that never gives a verdict is refused up front, as a child that cannot confine itself is
        with pytest.raises(SandboxError, match="cannot be confined on this machine.*the judge broke"):
            sandbox.confinement()
    finally:
        sandbox.confinement.cache_clear()
