"""spot_eval.execution.sandbox: what a confined program can and cannot do, and how each way of ending is reported."""

from __future__ import annotations

import re
import struct
import time
from pathlib import Path

import pytest

from spot_eval.execution import sandbox, syscalls
from spot_eval.execution.sandbox import Limits, Outcome, SandboxError, run, run_many

FAST = Limits(timeout_s=5.0)


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
    assert outcome == Outcome("failed", outcome.stderr)
    assert not outcome.passed
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
    assert sandbox.Confinement(True, 0, False, 0).gaps() == [
        "no Landlock: the program's reads and writes are not confined to its directory",
        "no unprivileged namespaces: /proc shows other processes, and the network is the host's",
        "no tmpfs: only each file's size is capped, not the total the program writes"]
    assert granted.as_params()["sandbox/landlock_abi"] == granted.landlock_abi


def run_filter(code: bytes, machine: str, nr: int, arg1: int = 0, arch: int | None = None) -> int:
    """The verdict of a classic-BPF seccomp program on one system call (the opcodes syscalls.py emits)."""
    # struct seccomp_data: nr, arch, instruction_pointer, args[6] (the request is ioctl's args[1])
    data = struct.pack("iIQ6Q", nr, syscalls.AUDIT_ARCH[machine] if arch is None else arch, 0, 0, arg1, 0, 0, 0, 0)
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
