"""spot_eval.execution.judge: the tests run outside the program, and what crosses the boundary does so as plain
data: each kind of value a program can hand its tests (judge.py's docstring), what the judge makes of it, and what
it refuses."""

from __future__ import annotations

import os
import threading

import pytest

from spot_eval.data import datasets
from spot_eval.execution import judge, launcher, problems, wire
from spot_eval.execution.judge import Handle, restore
from spot_eval.execution.sandbox import Limits, run_many
from spot_eval.execution.wire import NotPlainData

NODE = "class Node:\n    def __init__(self, data):\n        self.data, self.left = data, None\n"
DEPTH = "def depth(node):\n    return 0 if node is None else 1 + depth(node.left)\n"

# (id, program, tests, status, crossings, a fragment of the judge's reason)
CASES = [
    ("plain call", "def f(x):\n    return [x, {x: (x,)}]\n", "assert f(2) == [2, {2: (2,)}]", "passed", (), ""),
    ("a generator, iterated item by item", "def f(n):\n    yield from range(n)\n",
     "assert list(f(3)) == [0, 1, 2]\nassert sorted(map(lambda v: -v, f(2))) == [-1, 0]", "passed", ("iterated",), ""),
    ("an argument mutated in place is sent back", "def f(xs, d):\n    xs.sort()\n    xs[0].append(9)\n    d['k'] = 1\n",
     "a, d = [[5], [1]], {}\nkept = a\nf(a, d=d)\nassert kept == [[1, 9], [5]] and d == {'k': 1}",
     "passed", ("argument sent back",), ""),
    ("objects of the program's class: the weaker guarantee", NODE + DEPTH,
     "root = Node(1)\nroot.left = Node(2)\nroot.left.left = Node(3)\nassert depth(root) == 3 and root.data == 1",
     "passed", ("program object",), ""),
    ("a Counter compares as the dict it is", "import collections\ndef f(s):\n    return collections.Counter(s)\n",
     "assert f('aab') == {'a': 2, 'b': 1}", "passed", ("reduced Counter",), ""),
    ("a returned function", "def f(k):\n    return lambda x: k * x\n", "assert f(3)(2) == 6", "passed", ("returned callable",), ""),
    ("a constant and a module the program imported", "import math\nLIMIT = 3\n",
     "assert LIMIT == 3 and math.isqrt(17) == 4", "passed", (), ""),
    ("a built-in exception crosses by name", "def f():\n    raise ValueError('bad')\n",
     "try:\n    f()\nexcept ValueError as e:\n    assert str(e) == 'bad'\nelse:\n    raise AssertionError", "passed", (), ""),
    ("the program's own exception is ProgramError", "class Oops(Exception):\n    pass\ndef f():\n    raise Oops('x')\n",
     "f()", "failed", (), "ProgramError: Oops: x"),
    ("comparing a program object fails", "class Any:\n    __eq__ = lambda s, o: True\ndef f():\n    return Any()\n",
     "assert f() == 3", "failed", (), "a test compared or tested a program object"),
    ("the truth of a program object fails", "class T:\n    __bool__ = lambda s: True\ndef f():\n    return T()\n",
     "assert f()", "failed", (), "a test compared or tested a program object"),
    ("a test's own function cannot cross", "def f(g):\n    return g(1)\n", "assert f(lambda x: x) == 1", "failed", (),
     "cannot cross the boundary"),
    ("sys.exit inside a call fails even if the tests swallow it", "import sys\ndef f():\n    sys.exit(0)\n",
     "try:\n    f()\nexcept BaseException:\n    pass", "failed", (), "raised SystemExit"),
    ("os._exit inside a call", "import os\ndef f():\n    os._exit(0)\n", "f()", "failed", (), "process ended before the tests"),
    ("a name the program lacks is a NameError, as upstream", "x = 1\n", "f()", "failed", (), "NameError"),
]


@pytest.fixture(scope="module")
def outcomes() -> dict:
    """Every case in one batch: the sandbox's start-up is most of each one's time."""
    results = run_many([c[1] for c in CASES], Limits(timeout_s=10.0), tests=[c[2] for c in CASES])
    return dict(zip([c[0] for c in CASES], results, strict=True))


@pytest.mark.parametrize(("name", "status", "crossings", "reason"), [(c[0], *c[3:]) for c in CASES], ids=[c[0] for c in CASES])
def test_each_kind_of_value_crosses_as_the_judge_says(outcomes, name, status, crossings, reason):
    outcome = outcomes[name]
    assert (outcome.status, outcome.crossings) == (status, crossings), outcome.reason + outcome.stderr
    assert reason in outcome.reason
    assert outcome.weaker == ("program object" in crossings)


def test_a_builtin_name_the_reference_defines_is_the_programs_and_the_others_stay_the_judges():
    """MBPP 126 tests a function named `sum`: its tests call the program's `sum`. A program that rebinds another
    built-in its tests use (`abs`, `len`) or a helper of its prompt (HumanEval/32's `poly`) changes nothing."""
    item = next(d for d in datasets.mbpp_split("test") if d["task_id"] == 126)
    tests = problems.mbpp(item)
    assert tests.entries == ("sum",) and tests.program_names() == ["sum"]
    poly = next(p for p in datasets.load("humaneval_test") if p["task_id"] == "HumanEval/32")
    assert problems.humaneval(poly).program_names() == ["find_zero"]  # poly and the built-ins are the judge's
    assert problems.Tests("assert abs(f(1)) == len([g])").program_names() == ["f", "g"]
    wrong = "def sum(a, b):\n    return 0\nlen = lambda x: 3\n"
    right = item["code"] + "\nlen = lambda x: 3\n"
    assert [o.status for o in run_many([right, wrong], tests=[tests, tests])] == ["passed", "failed"]



def test_tests_of_no_known_problem_take_their_helpers_from_the_program_unless_given_a_prelude():
    """docs/sandbox.md, "Not guaranteed": upstream's behaviour for tests spot-eval does not vendor (a helper they
    call and do not define is the program's, so redefining it changes the verdict), and the prelude that closes it."""
    helper, code = "def poly(x):\n    return x * x\n", "assert poly(root()) == 9"
    bare, closed = problems.Tests(code), problems.Tests(code, prelude=helper)
    assert bare.program_names() == ["poly", "root"] and closed.program_names() == ["root"]
    right = helper + "def root():\n    return 3\n"
    cheat = "def poly(x):\n    return 9\n\ndef root():\n    return 2\n"  # a wrong root, its own poly to hide it
    outcomes = run_many([right, cheat, right, cheat], tests=[bare, bare, closed, closed])
    assert [o.status for o in outcomes] == ["passed", "passed", "passed", "failed"]

def test_a_handle_refuses_what_would_let_the_object_decide():
    handle = Handle(None, 7, named=False)  # no channel: none of these may reach the program
    for attempt in (lambda: handle == 1, lambda: handle != 1, lambda: handle < 1, lambda: bool(handle),
                    lambda: len(handle), lambda: 1 in handle):
        with pytest.raises(NotPlainData, match="program object #7"):
            attempt()
    assert {handle: 1}[handle] == 1  # hashing is the judge's (identity)
    with pytest.raises(AttributeError):
        handle.__deepcopy__  # noqa: B018 - the judge's own machinery probing a dunder stays here


def test_restore_writes_the_programs_copy_into_the_tests_objects_in_place():
    inner, d, s = [1], {"a": [1], "b": 2}, {1}
    outer = [inner, (d, s)]
    restore(outer, [[1, 2], ({"a": [3], "c": 4}, {5})])
    assert outer == [[1, 2], ({"a": [3], "c": 4}, {5})]
    assert outer[0] is inner and outer[1][0] is d and outer[1][1] is s and d["a"] is not None
    grown = [1]
    restore(grown, [1, 2, 3])
    assert grown == [1, 2, 3]


def judged(program: str, tests: str, prelude: str = "") -> dict:
    """The judge against the launcher's server in this one process, over real pipes, without the sandbox: the
    protocol alone (the CASES above run it across the boundary)."""
    namespace: dict = {"__name__": "__sandbox__"}
    exec(compile(program, "<program>", "exec"), namespace)
    call_r, call_w = os.pipe()
    reply_r, reply_w = os.pipe()

    def serve() -> None:
        wire.send(reply_w, wire.encode(("ready",)))
        launcher._serve(namespace, call_r, reply_w)
        os.close(reply_w)

    server = threading.Thread(target=serve)
    server.start()
    tests_ = problems.Tests(tests, prelude)
    spec = {"tests": tests_.code, "prelude": prelude, "names": tests_.program_names(), "filename": "<tests>"}
    try:
        return judge.judge(spec, judge.Channel(call_w, reply_r))
    finally:
        os.close(call_w)  # the server's end of the stream: it returns
        server.join()
        os.close(call_r)
        os.close(reply_r)


def test_the_protocol_in_one_process():
    assert judged("def f(x):\n    return x * 2\n", "assert f(21) == 42") == {
        "status": "passed", "message": "", "crossings": [], "left": False}
    wrong = judged("def f(x):\n    return x\n", "def check(c):\n    assert c(21) == 42\ncheck(f)")
    assert wrong["status"] == "failed" and wrong["message"].startswith("[spot-eval judge: a test failed]\nAssertionError")
    assert "line 2 of <tests>" in wrong["message"]
    # The prelude's helper is the judge's, whatever the program defines under its name.
    helper = judged("def helper(x):\n    return 0\ndef f(x):\n    return helper(x)\n", "assert f(2) == helper(2)",
                    prelude="def helper(x):\n    return x + 1\n")
    assert helper["status"] == "failed"
    objects = judged(NODE + DEPTH + "def gen(n):\n    yield from range(n)\n",
                     "r = Node(1)\nr.left = Node(2)\nassert depth(r) == 2 and r.data == 1 and list(gen(2)) == [0, 1]")
    assert objects["status"] == "passed" and objects["crossings"] == ["iterated", "program object"]
    raised = judged("def f():\n    raise KeyError('k')\n", "try:\n    f()\nexcept KeyError:\n    pass")
    assert raised["status"] == "passed"
    mutated = judged("def f(xs):\n    xs.append(len(xs))\n", "a = []\nf(a)\nf(xs=a)\nassert a == [0, 1]")
    assert (mutated["status"], mutated["crossings"]) == ("passed", ["argument sent back"])
    exited = judged("import sys\ndef f():\n    sys.exit(0)\n", "try:\n    f()\nexcept BaseException:\n    pass")
    assert (exited["status"], exited["left"]) == ("failed", True) and "raised SystemExit" in exited["message"]
    # A module the program imported is the judge's own import of the standard-library module of that name (an
    # alias names none); a name the program lacks is a NameError, as upstream.
    assert judged("import json\n", "assert json.dumps([1]) == '[1]'")["status"] == "passed"
    assert "NameError: name 'm' is not defined" in judged("import math as m\n", "m.sqrt(4)")["message"]
    assert "NameError: name 'g' is not defined" in judged("x = 1\n", "g()")["message"]
    # A built-in exception whose constructor wants more than a message comes back as ProgramError, named.
    assert "ProgramError: UnicodeDecodeError: 'utf-8' codec can't decode bytes in position 0-0: x" in judged(
        "def f():\n    raise UnicodeDecodeError('utf-8', b'', 0, 1, 'x')\n", "f()")["message"]


def judged_replies(tests: str, *replies: bytes) -> dict:
    """The verdict on `tests` where the program's side is ready, its name `f` is a function, and calling it gets
    `replies`, in turn, whatever the tests sent."""
    call_r, call_w = os.pipe()
    reply_r, reply_w = os.pipe()
    wire.send(reply_w, wire.encode(("ready",)))
    wire.send(reply_w, wire.encode(("value", object()), reference=lambda obj: 0))  # the name f: a function
    for reply in replies:
        wire.send(reply_w, reply)
    os.close(reply_w)
    spec = {"tests": tests, "prelude": "", "names": ["f"], "filename": "<tests>"}
    try:
        return judge.judge(spec, judge.Channel(call_w, reply_r))
    finally:
        for fd in (call_r, call_w, reply_r):
            os.close(fd)


@pytest.mark.parametrize("reply", [b"\x00garbage", wire.encode(True), wire.encode(("nonsense",)), wire.encode(("raised", 1))],
                         ids=["bytes", "not a reply", "unknown reply", "malformed raise"])
def test_a_malformed_reply_fails_the_tests_even_where_they_catch_everything(reply):
    """What the program's side sends is decoded strictly: garbage or a reply of no known form ends the judging,
    and the verdict fails even though the test swallows every exception."""
    verdict = judged_replies("try:\n    f()\nexcept BaseException:\n    pass", reply)
    assert (verdict["status"], verdict["left"]) == ("failed", True)
    assert verdict["message"].startswith("[spot-eval judge: failed: the program's side sent")


def test_what_the_program_sends_in_all_is_bounded(monkeypatch):
    """Beyond one message (wire.py's limits): the classes the verdict names, the program's objects the tests
    hold, and the bytes of all its messages together."""
    classes = [type(f"C{i:02}", (int,), {})(i) for i in range(20)]
    named = judged_replies("f()", wire.encode(("value", (classes, None, None))))
    assert named["status"] == "passed"
    assert named["crossings"] == [f"reduced C{i:02}" for i in range(judge.REDUCED_NAMES)] + [
        "reduced (12 more values, of other classes)"]
    monkeypatch.setattr(judge, "MAX_HANDLES", 4)
    objects = [object() for _ in range(5)]
    many = wire.encode(("value", (objects, None, None)), reference=lambda obj: 1 + [id(o) for o in objects].index(id(obj)))
    verdict = judged_replies("try:\n    f()\nexcept BaseException:\n    pass", many)
    assert (verdict["status"], verdict["message"]) == ("failed", "[spot-eval judge: failed: the program's side sent more than 4 objects]")
    monkeypatch.setattr(judge, "CANDIDATE_BYTES", 1000)
    verdict = judged_replies("for _ in range(3):\n    f()", *[wire.encode(("value", ("x" * 400, None, None)))] * 3)
    assert verdict["message"] == "[spot-eval judge: failed: the program's side sent more than 1000 bytes in all]"


def test_a_program_that_raised_before_its_tests_fails_with_what_it_raised():
    call_r, call_w = os.pipe()
    reply_r, reply_w = os.pipe()
    wire.send(reply_w, wire.encode(("raised", "ValueError", "boom")))
    os.close(reply_w)
    verdict = judge.judge({"tests": "", "prelude": "", "names": [], "filename": "<tests>"}, judge.Channel(call_w, reply_r))
    assert verdict == {"status": "failed", "message": "[spot-eval judge: failed: the program raised ValueError before its "
                       "tests (boom)]", "crossings": [], "left": False}
    for fd in (call_r, call_w, reply_r):
        os.close(fd)
