"""The sandboxed process: it confines itself, runs the model's program, then answers the judge's calls.

Started by the parent (spot_eval.execution.sandbox) as a fresh interpreter, `python -I -S -B launcher.py ...`, with
three inherited pipes: its confinement report to the parent, the judge's calls in, its replies out. It imports
only the standard library and its siblings syscalls.py and wire.py, before confining itself.

Confinement, in order, and what each piece is for:
  - own mount and network namespaces (and, where the harness is not root, a user namespace to hold them): no
    network, and a file system of its own;
  - a new root: a tmpfs holding only the read set (the Python installation and its standard library, the shared
    libraries, time-zone data, the loader cache, /dev/null and the random devices), bound read-only, and the
    working directory, a tmpfs of `disk_bytes` (all the files the program writes together are capped, and vanish
    with it). Everything else does not exist there: `stat`, `readlink` and `access` on the rest of the file
    system fail with ENOENT, `/proc` included, whatever the Landlock ABI (no ABI up to 7, Linux 6.18's,
    restricts those metadata calls);
  - Landlock, over the same paths: reads only in the read set and the working directory, writes, creations and
    removals only in the working directory; TCP from ABI 4, device ioctls from ABI 5, signals and abstract unix
    sockets scoped to the program itself from ABI 6;
  - a uid of its own (1e9 + its pid) when the harness runs as root: a call that slipped every filter could still
    signal, trace or set the limits of no other process, since they all belong to other users. (Where the harness
    is not root the program keeps the harness's uid; the parent reports that as a gap.)
  - resource limits: CPU seconds, address space, file size, no core files, no new processes;
  - a seccomp allow list (spot_eval.execution.syscalls): every call not on it fails with EPERM, and the few that
    name a process (prlimit64, sched_getaffinity) are allowed only for pid 0, the caller.
Then it runs the program (`runpy`, as "__sandbox__", so a demo under `if __name__ == "__main__":` does not run),
says "ready" (or what the program raised), and serves: each request names a global of the program, or calls,
iterates, reads or sets an attribute of one of its objects; each reply is plain data, or a reference to an
object that stays here (spot_eval.execution.wire). The tests are never here.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import runpy
import sys
import traceback
import types

if __name__ == "__main__":  # the child: its siblings by path, before any confinement (no site-packages)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import syscalls
    import wire
else:  # imported by the tests, which drive the server in-process
    from spot_eval.execution import syscalls, wire

# Landlock (include/uapi/linux/landlock.h; the same syscall numbers on x86_64 and aarch64).
_LANDLOCK_CREATE_RULESET, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LANDLOCK_CREATE_RULESET_VERSION, _LANDLOCK_RULE_PATH_BENEATH = 1 << 0, 1
# Access rights by the ABI that introduced them: everything that writes, creates, removes or renames.
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_REFER, _FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15  # ABI 2, 3, 5
_FS_CHANGES = sum(1 << bit for bit in (4, 5, 6, 7, 8, 9, 10, 11, 12))  # REMOVE_DIR/FILE, MAKE_CHAR ... MAKE_SYM
_NET_TCP = (1 << 0) | (1 << 1)  # BIND_TCP, CONNECT_TCP (ABI 4)
_SCOPE_ALL = (1 << 0) | (1 << 1)  # ABSTRACT_UNIX_SOCKET, SIGNAL (ABI 6)

_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND = 1, 2, 4, 8, 32, 4096
_MS_REC, _MS_PRIVATE, _MNT_DETACH = 1 << 14, 1 << 18, 2
# statvfs flags -> mount flags: what a read-only remount of a bind mount must keep (the kernel refuses to clear
# these on a mount that a user namespace inherited).
_LOCKED = {1: _MS_RDONLY, 2: _MS_NOSUID, 4: _MS_NODEV, 8: _MS_NOEXEC, 1024: 1024, 2048: 2048, 4096: 1 << 21}
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
_DISK_INODES = 4096  # files and directories on the program's tmpfs (each costs kernel memory, not disk)
_OWN_UID_BASE = 1_000_000_000  # + the child's pid: a uid that no other process has (pids < 2**22)


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return libc


def _mount(libc: ctypes.CDLL, source: str | None, target: str, fstype: str | None, flags: int, options: str | None = None):
    encoded = [s.encode() if s is not None else None for s in (source, target, fstype, options)]
    if libc.mount(encoded[0], encoded[1], encoded[2], flags, encoded[3]) != 0:
        raise OSError(ctypes.get_errno(), f"mount({source}, {target}, {fstype})")


# ---- the file system the program sees ----


def _readable_paths() -> tuple[list[str], list[str]]:
    """(directories, files) the program may read: the Python installation and its standard library, the shared
    libraries its extension modules load, time-zone data, the loader cache, and the null and random devices.
    Not the rest of /etc, the home directories, the project, its virtual environment or the Hugging Face cache."""
    import sysconfig

    # The installation's paths, not a virtual environment's (whose lib/ holds only site-packages, which -S skips).
    paths = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})
    directories = [sys.base_prefix, sys.base_exec_prefix, paths["stdlib"], paths["platstdlib"],
                   "/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/share/zoneinfo"]
    files = ["/etc/ld.so.cache", "/etc/localtime", "/dev/null", "/dev/urandom", "/dev/random"]
    return [d for d in directories if os.path.isdir(d)], [f for f in files if os.path.exists(f)]


def _enter_view(libc: ctypes.CDLL, workdir: str, disk_bytes: int, program: bytes,
                read_set: tuple[list[str], list[str]]) -> tuple[bool, int, int]:
    """Own mount and network namespaces and a new root holding only the read set and the working directory (a
    tmpfs of `disk_bytes` holding `program`, owned by the uid the program will run as). Returns (namespaces
    entered, the disk cap, that uid); (False, 0, own uid) where the kernel (or a policy such as an AppArmor
    userns restriction) refuses the namespaces, and the program then runs in the harness's file system."""
    uid, gid = os.getuid(), os.getgid()
    root_harness = uid == 0
    if libc.unshare(_CLONE_NEWNS | _CLONE_NEWNET | (0 if root_harness else _CLONE_NEWUSER)) != 0:
        return False, 0, uid
    if not root_harness:  # the same ids inside as outside, so that files the program creates have an owner
        for name, line in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(line)
    program_uid, program_gid = (_OWN_UID_BASE + os.getpid(),) * 2 if root_harness else (uid, gid)
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing mounted from here on propagates out
    # The new root is a tmpfs over the working directory (empty but for the program, which is read already).
    root = workdir
    _mount(libc, "spot-sandbox-root", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
    _bind_read_set(libc, root, read_set)
    home = root + os.path.realpath(workdir)
    os.makedirs(home, exist_ok=True)
    options = f"size={disk_bytes},nr_inodes={_DISK_INODES},mode=0700,uid={program_uid},gid={program_gid}"
    _mount(libc, "spot-sandbox", home, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, options)
    with open(os.path.join(home, "program.py"), "wb") as f:
        f.write(program)
    _mount(libc, None, root, None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    # pivot_root(".", "."): the new root goes over the old one, which is then detached, out of reach.
    os.chdir(root)
    if libc.syscall(_PIVOT_ROOT[os.uname().machine], b".", b".") != 0:
        raise OSError(ctypes.get_errno(), "pivot_root")
    if libc.umount2(b".", _MNT_DETACH) != 0:
        raise OSError(ctypes.get_errno(), "umount2(old root)")
    os.chdir(os.path.realpath(workdir))
    return True, disk_bytes, program_uid


def _bind_read_set(libc: ctypes.CDLL, root: str, read_set: tuple[list[str], list[str]]) -> None:
    """Bind each path of the read set, read-only, at its own place under `root` (a directory beneath one bound
    already comes with it), with the links on the way to it."""
    directories, files = read_set
    bound: list[str] = []
    for path in sorted(directories, key=len) + files:
        real = _mirror_links(root, path)
        if any(real == b or real.startswith(b.rstrip("/") + "/") for b in bound):
            continue
        target = root + real
        if os.path.isdir(real):
            os.makedirs(target, exist_ok=True)
        else:  # a file (the loader cache, a device) is bound onto an empty file
            os.makedirs(os.path.dirname(target), exist_ok=True)
            open(target, "a").close()
        _mount(libc, real, target, None, _MS_BIND | _MS_REC)
        kept = sum(flag for bit, flag in _LOCKED.items() if os.statvfs(real).f_flag & bit)
        _mount(libc, None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | kept)
        bound.append(real)


def _mirror_links(root: str, path: str) -> str:
    """Recreate under `root` each symbolic link along `path` (/lib -> usr/lib), so that `path` resolves in the
    new root as it does outside; returns the real path, where the bind mount goes."""
    current = ""
    for part in path.strip("/").split("/"):
        current = f"{current}/{part}"
        if os.path.islink(current):
            link = root + current
            if not os.path.lexists(link):
                os.makedirs(os.path.dirname(link), exist_ok=True)
                os.symlink(os.readlink(current), link)
            current = os.path.realpath(current)
    return os.path.realpath(path)


def _restrict_files(libc: ctypes.CDLL, workdir: str, read_set: tuple[list[str], list[str]]) -> int:
    """Landlock: reading only beneath `_readable_paths()` and `workdir`; writing, creating and removing only beneath
    `workdir` (and writing /dev/null); TCP, device ioctls and, from ABI 6, signals and abstract unix sockets kept
    inside the program. Returns the ABI used (0: none)."""

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
    handled = reads | files | _FS_CHANGES | (_FS_REFER if abi >= 2 else 0) | (_FS_IOCTL_DEV if abi >= 5 else 0)
    attr = RulesetAttr(handled, _NET_TCP if abi >= 4 else 0, _SCOPE_ALL if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24  # the struct grew a field at ABI 4 and at ABI 6
    ruleset = libc.syscall(_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return 0
    directories, readable_files = read_set
    # The working directory: everything but device ioctls (it is a tmpfs; there are no devices on it).
    rules = [(workdir, handled & ~_FS_IOCTL_DEV), ("/dev/null", _FS_READ_FILE | files)]
    rules += [(d, reads) for d in directories] + [(f, _FS_READ_FILE) for f in readable_files if f != "/dev/null"]
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


def _confine(argv: list[str]) -> str:
    """Confine this process as the module docstring says; report what was granted on the report pipe. Returns
    the program's path."""
    report_fd, cpu_s, memory_bytes, file_bytes, disk_bytes = (int(argv[i]) for i in (1, 4, 5, 6, 7))
    script = argv[8]
    workdir = os.path.dirname(script)
    with open(script, "rb") as f:
        program = f.read()
    libc = _libc()
    harness_uid = os.getuid()
    read_set = _readable_paths()  # here, before any namespace, in the harness's view of the file system
    namespaces, disk, program_uid = _enter_view(libc, workdir, disk_bytes, program, read_set)
    pr_set_no_new_privs = 38
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:  # Landlock and seccomp both require it
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    landlock_abi = _restrict_files(libc, os.path.realpath(workdir), read_set)
    if program_uid != os.getuid():  # root: drop to a uid of its own, with every capability
        os.setgroups([])
        os.setresgid(program_uid, program_uid, program_uid)
        os.setresuid(program_uid, program_uid, program_uid)
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
    granted = {"seccomp": True, "landlock_abi": landlock_abi, "namespaces": namespaces, "disk_bytes": disk,
               "own_uid": program_uid != harness_uid}
    os.write(report_fd, json.dumps(granted).encode())
    os.close(report_fd)
    return script


# ---- serving the judge ----


class _Objects:
    """The program's objects that crossed as references: number -> object, kept alive so no id is reused."""

    def __init__(self):
        self.objects: list[object] = []
        self.numbers: dict[int, int] = {}

    def number(self, obj: object) -> int:
        if id(obj) not in self.numbers:
            self.numbers[id(obj)] = len(self.objects)
            self.objects.append(obj)
        return self.numbers[id(obj)]

    def resolve(self, number: int) -> object:
        if not 0 <= number < len(self.objects):
            raise wire.WireError(f"no object #{number}")
        return self.objects[number]


def _answer(program: dict, request: tuple, objects: _Objects) -> tuple:
    """The reply to one request of the judge (judge.py's Channel says what each means)."""
    op, *args = request
    if op != "get":  # the object a request acts on, by its number
        args[0] = objects.resolve(args[0])
    if op == "get":
        if args[0] not in program:
            return ("missing",)
        value = program[args[0]]
        return ("module",) if isinstance(value, types.ModuleType) else ("value", value)
    if op == "call":
        function, positional, keywords = args
        before = wire.encode((positional, keywords), objects.number)
        result = function(*positional, **keywords)
        changed = wire.encode((positional, keywords), objects.number) != before  # an argument it mutated
        return ("value", (result, positional if changed else None, keywords if changed else None))
    if op == "getattr":
        return ("value", getattr(args[0], args[1]))
    if op == "setattr":
        setattr(args[0], args[1], args[2])
        return ("value", None)
    if op == "iter":
        return ("value", iter(args[0]))
    if op == "next":
        try:
            return ("value", next(args[0]))
        except StopIteration:
            return ("stop",)
    raise ValueError(f"unknown request {op!r}")


def _raised(err: BaseException) -> tuple:
    try:
        message = str(err)
    except BaseException:  # noqa: BLE001 - an exception whose __str__ raises
        message = "?"
    return ("raised", type(err).__name__, message[:2000])


def _serve(program: dict, call_fd: int, reply_fd: int) -> None:
    objects = _Objects()
    while (data := wire.receive(call_fd)) is not None:
        try:
            reply = _answer(program, wire.decode(data, objects.resolve), objects)
            encoded = wire.encode(reply, objects.number)
        except BaseException as err:  # noqa: BLE001 - the program's exception is the judge's to see
            encoded = wire.encode(_raised(err))
        wire.send(reply_fd, encoded)


def main(argv: list[str]) -> None:
    call_fd, reply_fd = int(argv[2]), int(argv[3])
    script = _confine(argv)
    sys.argv = [script]
    try:
        program = runpy.run_path(script, run_name="__sandbox__")
    except BaseException as err:  # noqa: BLE001 - SystemExit too: the program left before its tests
        if not isinstance(err, SystemExit):
            traceback.print_exc()
        wire.send(reply_fd, wire.encode(_raised(err)))
        sys.exit(1)
    wire.send(reply_fd, wire.encode(("ready",)))
    _serve(program, call_fd, reply_fd)


if __name__ == "__main__":
    main(sys.argv)
