"""The sandbox's seccomp filter: an allow list of system calls; every other call fails with EPERM.

An allow list, not a deny list: a call that is not named here is refused, whatever it is (`io_uring_setup`,
which opens sockets without `socket()`; `bpf`, `userfaultfd`, `perf_event_open`, `keyctl`; a call the kernel
adds next year). The filter also refuses every call of another ABI (an i386 `int 0x80`, and on x86_64 the
x32 ABI's numbers, which have bit 30 set).

Derived by `bench/sandbox_syscalls.py`: it runs the 164 HumanEval canonical solutions and the 974 MBPP reference
solutions, each with its tests, in the sandbox under `strace -f`, and lists what they call after the filter is
installed. On x86_64 (Debian 12's glibc 2.36, CPython 3.11, 2026-12-03) that was 16 calls:

    read write openat close lseek fcntl ioctl newfstatat brk mmap munmap mremap mprotect futex
    rt_sigaction exit_group

The groups below add what the standard library calls for the same kind of work on other machines or in other
programs: other glibc versions' spellings of the same operation (`fstat`, `statx`, `stat`), time and sleeping,
directory listing and creation inside the working directory, process identity, and random bytes. Left out on
purpose: creating processes and threads (clone, fork, execve), every socket call, signalling or reading other
processes, namespaces and mounts, deleting and renaming files, pipes, memfd, io_uring, bpf, keyrings, prctl.

The calls that name a process, `prlimit64` and `sched_getaffinity`, are allowed only with pid 0 (the caller),
checked on their first argument: a program can read and set its own limits (CPython's `resource` does), never the
harness's or another process's (RLIMIT_NOFILE = 3 on the harness would kill it with EMFILE). The kernel reads a
pid_t, the low 32 bits of the argument, so those are what the filter compares.

`ioctl` is allowed only for the terminal queries (TCGETS, TIOCGWINSZ) and the close-on-exec flags (FIOCLEX,
FIONCLEX) that CPython makes; any other request fails.

The numbers: arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/unistd.h (aarch64), checked
against the installed kernel headers by tests/test_sandbox.py. AUDIT_ARCH_* values: include/uapi/linux/audit.h.

This module is imported by the sandbox's child before it confines itself, so it imports only the standard library.
"""

from __future__ import annotations

import struct

# Allowed calls by purpose (a name missing from an architecture's table does not exist there).
GROUPS: dict[str, tuple[str, ...]] = {
    # reading and writing open descriptors, and opening files (Landlock decides which files)
    "files": ("read", "write", "pread64", "readv", "writev", "openat", "close", "lseek", "fcntl", "dup", "dup2", "dup3",
              "ioctl", "fsync", "fdatasync", "ftruncate"),
    # file status, spelled per libc and architecture (os.stat, os.path.exists, io's buffer sizing)
    "status": ("newfstatat", "fstat", "stat", "lstat", "statx", "access", "faccessat", "faccessat2", "readlink",
               "readlinkat", "getcwd", "getdents64", "mkdir", "mkdirat"),
    # memory: the allocator and the interpreter's arenas
    "memory": ("brk", "mmap", "munmap", "mremap", "mprotect", "madvise", "futex"),
    # time and sleeping (the vDSO answers most clock reads; these are its fallbacks)
    "time": ("clock_gettime", "clock_getres", "gettimeofday", "nanosleep", "clock_nanosleep"),
    # the process's own signal handling (Python installs handlers; signalling others is refused)
    "signals": ("rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "sigaltstack", "restart_syscall"),
    # reading the process's own identity and limits
    "identity": ("getpid", "gettid", "getuid", "geteuid", "getgid", "getegid", "uname", "sysinfo", "prlimit64",
                 "getrlimit", "getrusage", "sched_getaffinity", "sched_yield", "getrandom"),
    "exit": ("exit", "exit_group"),
}

# Allowed only when their first argument, a pid, is 0: the calling process itself.
OWN_PROCESS_ONLY = ("prlimit64", "sched_getaffinity")

# ioctl requests allowed (asm-generic/ioctls.h; the same on x86_64 and aarch64)
IOCTLS = {"TCGETS": 0x5401, "TIOCGWINSZ": 0x5413, "FIONCLEX": 0x5450, "FIOCLEX": 0x5451}

# name -> number per architecture, for every name in GROUPS that the architecture has
NUMBERS: dict[str, dict[str, int]] = {
    "x86_64": {
        "read": 0, "write": 1, "pread64": 17, "readv": 19, "writev": 20, "openat": 257, "close": 3, "lseek": 8,
        "fcntl": 72, "dup": 32, "dup2": 33, "dup3": 292, "ioctl": 16, "fsync": 74, "fdatasync": 75, "ftruncate": 77,
        "newfstatat": 262, "fstat": 5, "stat": 4, "lstat": 6, "statx": 332, "access": 21, "faccessat": 269,
        "faccessat2": 439, "readlink": 89, "readlinkat": 267, "getcwd": 79, "getdents64": 217, "mkdir": 83,
        "mkdirat": 258, "brk": 12, "mmap": 9, "munmap": 11, "mremap": 25, "mprotect": 10, "madvise": 28, "futex": 202,
        "clock_gettime": 228, "clock_getres": 229, "gettimeofday": 96, "nanosleep": 35, "clock_nanosleep": 230,
        "rt_sigaction": 13, "rt_sigprocmask": 14, "rt_sigreturn": 15, "sigaltstack": 131, "restart_syscall": 219,
        "getpid": 39, "gettid": 186, "getuid": 102, "geteuid": 107, "getgid": 104, "getegid": 108, "uname": 63,
        "sysinfo": 99, "prlimit64": 302, "getrlimit": 97, "getrusage": 98, "sched_getaffinity": 204, "sched_yield": 24,
        "getrandom": 318, "exit": 60, "exit_group": 231,
    },
    "aarch64": {
        "read": 63, "write": 64, "pread64": 67, "readv": 65, "writev": 66, "openat": 56, "close": 57, "lseek": 62,
        "fcntl": 25, "dup": 23, "dup3": 24, "ioctl": 29, "fsync": 82, "fdatasync": 83, "ftruncate": 46,
        "newfstatat": 79, "fstat": 80, "statx": 291, "faccessat": 48, "faccessat2": 439, "readlinkat": 78,
        "getcwd": 17, "getdents64": 61, "mkdirat": 34, "brk": 214, "mmap": 222, "munmap": 215, "mremap": 216,
        "mprotect": 226, "madvise": 233, "futex": 98, "clock_gettime": 113, "clock_getres": 114, "gettimeofday": 169,
        "nanosleep": 101, "clock_nanosleep": 115, "rt_sigaction": 134, "rt_sigprocmask": 135, "rt_sigreturn": 139,
        "sigaltstack": 132, "restart_syscall": 128, "getpid": 172, "gettid": 178, "getuid": 174, "geteuid": 175,
        "getgid": 176, "getegid": 177, "uname": 160, "sysinfo": 179, "prlimit64": 261, "getrusage": 165,
        "sched_getaffinity": 123, "sched_yield": 124, "getrandom": 278, "exit": 93, "exit_group": 94,
    },
}  # fmt: skip
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000

# Classic-BPF opcodes (BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_JMP|BPF_JGE|BPF_K, BPF_RET|BPF_K) and
# seccomp verdicts (SECCOMP_RET_ALLOW; SECCOMP_RET_ERRNO with errno EPERM), from linux/filter.h and seccomp.h.
# Offsets into struct seccomp_data: nr 0, arch 4, args[0] and args[1] (their low 32 bits, little-endian) 16, 24.
LD_W_ABS, JEQ_K, JGE_K, RET_K = 0x20, 0x15, 0x35, 0x06
RET_ALLOW, RET_EPERM = 0x7FFF0000, 0x00050000 | 1
_NR, _ARCH, _ARG0, _ARG1 = 0, 4, 16, 24


class UnknownArchitecture(ValueError):
    """No allow list for this machine: nothing can be confined."""


def allowed(machine: str) -> dict[str, int]:
    """The allowed calls' numbers on `machine` (os.uname().machine)."""
    if machine not in NUMBERS:
        raise UnknownArchitecture(f"no seccomp allow list for architecture {machine!r} (known: {', '.join(NUMBERS)})")
    numbers = NUMBERS[machine]
    return {name: numbers[name] for group in GROUPS.values() for name in group if name in numbers}


def seccomp_filter(machine: str) -> bytes:
    """A classic-BPF program over `struct seccomp_data`: EPERM for another ABI, for every call not allowed, for an
    ioctl request not in IOCTLS and for a call of OWN_PROCESS_ONLY on a pid other than 0; allow the rest."""
    calls = allowed(machine)
    plain = [nr for name, nr in calls.items() if name != "ioctl" and name not in OWN_PROCESS_ONLY]
    own = [calls[name] for name in OWN_PROCESS_ONLY if name in calls]
    # (opcode, jump-if-true label, jump-if-false label, k); labels: "next", "allow", "deny", "ioctl"
    program: list[tuple[int, str, str, int]] = [
        (LD_W_ABS, "next", "next", _ARCH),
        (JEQ_K, "next", "deny", AUDIT_ARCH[machine]),
        (LD_W_ABS, "next", "next", _NR),
    ]
    if machine == "x86_64":
        program.append((JGE_K, "deny", "next", X32_SYSCALL_BIT))
    program += [(JEQ_K, "allow", "next", nr) for nr in plain]
    program += [(JEQ_K, "own", "next", nr) for nr in own]
    program += [(JEQ_K, "ioctl", "deny", calls["ioctl"])]
    program += [("own", "", "", 0), (LD_W_ABS, "next", "next", _ARG0), (JEQ_K, "allow", "deny", 0)]
    program += [("ioctl", "", "", 0), (LD_W_ABS, "next", "next", _ARG1)]
    program += [(JEQ_K, "allow", "next", request) for request in IOCTLS.values()]
    program += [("deny", "", "", 0), (RET_K, "next", "next", RET_EPERM), ("allow", "", "", 0), (RET_K, "next", "next", RET_ALLOW)]
    return _assemble(program)


def _assemble(program: list[tuple]) -> bytes:
    """Resolve the labels of `program` (entries ("label", "", "", 0) mark the next instruction) into sock_filter
    structs {u16 code, u8 jt, u8 jf, u32 k}; a jump is relative to the instruction after it."""
    instructions, labels = [], {}
    for entry in program:
        if isinstance(entry[0], str):
            labels[entry[0]] = len(instructions)
        else:
            instructions.append(entry)

    def offset(label: str, at: int) -> int:
        target = at + 1 if label == "next" else labels[label]
        if not 0 <= target - at - 1 <= 255:
            raise ValueError(f"a BPF jump of {target - at - 1} instructions does not fit in one byte")
        return target - at - 1

    return b"".join(struct.pack("HBBI", op, offset(jt, i), offset(jf, i), k) for i, (op, jt, jf, k) in enumerate(instructions))
