"""The harness's memory while it scores a batch of hostile candidates (issue 66, part 1).

Each hostile program replaces the program-side encoder (the launcher's `wire.encode`, which the program reaches
through `sys.modules`) and answers the judge's calls with messages that are well formed but not what that encoder
would send:
  - names: each reply is the right result, said to be reduced from 60 classes in turn, each with a name of 1 MiB
    (the encoder cuts a name at 100 characters), distinct from reply to reply: 60 MiB a message, under the
    64 MiB limit;
  - amplification: each reply is 12 lists of a million empty lists, 5 bytes each on the wire (60 MiB), some 64
    bytes each once decoded;
  - control: the name and message of the exception it raises, the class name of a value it returns and its
    stderr hold lone surrogates, NUL, ESC and a right-to-left override (U+202E).
A fresh interpreter (this script) imports the sandbox, scores `--candidates` of them (the three kinds in turn) with
`run_many` against an `add` problem's three asserts, and reports its own peak RSS (ru_maxrss) before and after and
the size of the outcomes. Prints one JSON object. (Not the children's peaks: a child's ru_maxrss starts from the
harness's, which it was forked from.)

Usage: python bench/sandbox_memory.py [--candidates 8]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

# The program side's encoder, replaced: `reply(calls)` builds the raw bytes of a call's reply; everything else (the
# "ready" message, the functions' handles) crosses as the launcher's own encoder writes it.
_ENCODER = """
import struct, sys
wire = sys.modules["wire"]
plain, calls = wire.encode, []

def count(n):
    return struct.pack("<I", n)

def text(s):
    data = s.encode("utf-8", "surrogatepass")
    return count(len(data)) + data

def encode(value, reference=None):
    if type(value) is tuple and len(value) == 2 and value[0] == "value" and type(value[1]) is tuple:  # a call's reply
        calls.append(1)
        head = wire.TUPLE + count(2) + wire.STR + text("value") + wire.TUPLE + count(3)
        return head + reply(len(calls), plain(value[1][0])) + wire.NONE + wire.NONE
    return plain(value, reference)

wire.encode = encode

def add(a, b):
    return a + b
"""
NASTY = "\udc80\x1b[2J\u202egnp.exe\x07"  # a lone surrogate, ESC (clears a terminal), a right-to-left override, BEL
HOSTILE = {
    "names": _ENCODER + (
        "def reply(n, result):  # the right result, reduced from 60 classes in turn\n"
        "    return b''.join(wire.REDUCED + text(f'{n}.{i}.' + 'N' * (1 << 20)) for i in range(60)) + result\n"),
    "amplification": _ENCODER + (
        "def reply(n, result):  # 12 lists of a million (the most items a container may have) empty lists\n"
        "    return wire.LIST + count(12) + (wire.LIST + count(1 << 20) + (wire.LIST + count(0)) * (1 << 20)) * 12\n"),
    "control": (
        f"import sys\nNASTY = {NASTY!r}\n"
        "sys.stderr.buffer.write(b'\\x00\\x1b[2J\\xe2\\x80\\xae\\xed\\xb2\\x80' + NASTY.encode('utf-8', 'surrogatepass') + b'\\n')\n"
        "Evil = type(NASTY[1:], (Exception,), {})  # a class name must encode: no surrogate\n"
        "Reduced = type(NASTY[1:], (int,), {})\n"
        "def add(a, b):\n"
        "    if a == 1:\n"
        "        return Reduced(3)  # crosses as 3, its class name among the crossings\n"
        "    raise Evil(NASTY + '\\x00' + NASTY * 300)\n"),
}
TESTS = "assert add(1, 2) == 3\nassert add(-5, 5) == 0\nassert add(2, 2) == 4\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=8)
    args = parser.parse_args()
    from spot_eval.execution.sandbox import run_many

    kinds = [list(HOSTILE)[i % len(HOSTILE)] for i in range(args.candidates)]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    outcomes = run_many([HOSTILE[kind] for kind in kinds], tests=[TESTS] * len(kinds))
    seconds = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    texts = [o.stderr + o.reason + "".join(o.crossings) for o in outcomes]
    print(json.dumps({
        "candidates": kinds,
        "statuses": [o.status for o in outcomes],
        "reasons": [o.reason[:200] for o in outcomes],
        "crossings": [list(o.crossings) for o in outcomes],
        "harness_peak_rss_mib": {"before": round(before / 1024, 1), "after": round(after / 1024, 1),
                                 "growth": round((after - before) / 1024, 1)},
        "largest_outcome_repr_chars": max(len(repr(o)) for o in outcomes),
        "all_printable": all(t.replace("\n", "").isprintable() for t in texts),
        "seconds": round(seconds, 1),
    }))


if __name__ == "__main__":
    main()
