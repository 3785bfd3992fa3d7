"""The trusted side of the boundary: a problem's tests run here, and the verdict is computed here, outside the
process that ran the model's program.

Python offers no isolation inside one interpreter: a program that runs first, with `ctypes`, `gc` and `builtins`
at hand, can rewrite any test or guard that shares its process. So the tests (the dataset's code, trusted) never
enter the sandbox. The judge is a fresh interpreter that holds no model-written code: it runs the problem's
trusted prelude (HumanEval's prompt, with its helpers such as HumanEval/32's `poly`), then the tests, with the
judge's own built-ins, in a namespace where each name the tests take from the program is a `Handle`. Calling a
handle sends its arguments, as plain data (spot_eval.execution.wire), to the sandboxed child, which calls the
program's function and sends back what it returned, as plain data, or the name and message of what it raised.
Every comparison, loop and assertion of the tests then runs here, on fresh built-in values: whatever the program
patches in its own process (`builtins.exec`, `ast.parse`, the frames of its server, the heap) changes nothing that
decides the score.

What the judge never does with what comes from the program: evaluate or import it, unpickle it, or call a method
of it; a value is plain data or a `Handle`, and a handle lets the tests do only what crosses as plain data.

Values that cannot cross as plain data, and what the judge does (the `crossings` of its verdict):
  - an argument the program mutates (a list it sorts in place): sent back as plain data, and written into the
    tests' own object ("argument sent back");
  - a subclass of a built-in type (a `Counter`): reduced, on the program's side, to the built-in value it holds
    ("reduced <class>");
  - a generator or iterator: the tests iterate it item by item, each item plain data ("iterated");
  - a function the program returns: calls cross as any other ("returned callable");
  - an object of a class the program defines (MBPP 367's `Node`): a handle the tests may call, read and set
    attributes of, and hand back to the program ("program object"). The verdict is still computed here, on
    plain data, but the test's input is then the program's own object, which behaves as the program says: the
    weaker guarantee (`Outcome.weaker`; per task, `weaker_guarantee` in the task's YAML, and docs/sandbox.md).
Comparing a handle, or asking its truth or length, fails the test: that would let the object decide.

What the program sends is bounded here, whatever encoder it used: each message by wire.decode's limits, all its
messages together by CANDIDATE_BYTES, its objects by MAX_HANDLES, the class names the verdict lists by
REDUCED_NAMES, and the judge itself by its own CPU and address-space limits, which it sets first.

Run as `python -I -S -B judge.py CALL_FD REPLY_FD CPU_SECONDS MEMORY_BYTES` with the spec (JSON) on stdin; prints
the verdict (JSON). Imports only the standard library (and wire.py beside it).
"""

from __future__ import annotations

import builtins
import importlib
import json
import os
import resource
import sys
import traceback

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import wire
else:
    from spot_eval.execution import wire

MESSAGE_CHARS = 1000  # of an exception message the program sends
CANDIDATE_BYTES = 256 << 20  # all the messages of one program together (one is at most wire.MAX_MESSAGE)
MAX_HANDLES = 1 << 16  # the program's objects the tests may hold (MBPP 367's trees need a few)
REDUCED_NAMES = 8  # classes the verdict names among its crossings; values of any other class are only counted

# The built-in exceptions the tests see when the program raises one (by name; anything else is ProgramError).
_EXCEPTIONS = {name: obj for name, obj in vars(builtins).items()
               if isinstance(obj, type) and issubclass(obj, Exception) and name != "ExceptionGroup"}
_EXITS = {"SystemExit", "KeyboardInterrupt", "GeneratorExit"}


class ProgramError(Exception):
    """The program raised an exception that is not a built-in one; the tests see it under this name."""


class ProgramLeft(BaseException):
    """The program's process ended, exited, or broke the protocol. A BaseException, so that a test's
    `except Exception` cannot swallow it; and once it is raised the verdict is "failed" whatever the tests do."""


class Handle:
    """An object of the program's, on its side of the boundary (a function, a class, an object, a generator).
    The tests may call it, iterate it, read and set its attributes and hand it back to the program; each crosses
    as plain data. What would let the object itself decide a test (==, <, truth, len) is refused."""

    __slots__ = ("_channel", "_number", "_named")

    def __init__(self, channel: Channel, number: int, named: bool):
        object.__setattr__(self, "_channel", channel)
        object.__setattr__(self, "_number", number)
        object.__setattr__(self, "_named", named)

    def __call__(self, *args, **kwargs):
        if not self._named:
            self._channel.crossings.add("returned callable")
        return self._channel.call(self._number, args, kwargs)

    def __iter__(self):
        self._channel.crossings.add("iterated")
        return self._channel.request("iter", self._number)

    def __next__(self):
        self._channel.crossings.add("iterated")
        return self._channel.request("next", self._number)

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):  # the judge's own machinery probing (copy, pickle)
            raise AttributeError(name)
        self._channel.crossings.add("program object")
        return self._channel.request("getattr", self._number, name)

    def __setattr__(self, name: str, value: object) -> None:
        self._channel.crossings.add("program object")
        self._channel.request("setattr", self._number, name, value)

    def _refuse(self, *_):
        raise wire.NotPlainData(
            f"a test compared or tested a program object ({self!r}), not plain data (int, float, complex, str, bytes, "
            "bool, None, or lists, tuples, dicts and sets of them): the object would decide the test")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __len__ = __contains__ = _refuse
    __hash__ = object.__hash__  # identity: a handle may be a dict key without asking the object

    def __repr__(self) -> str:
        return f"<program object #{self._number}>"


class Channel:
    """The pipes to the sandboxed child: one request at a time, one reply each."""

    def __init__(self, call_fd: int, reply_fd: int):
        self.call_fd, self.reply_fd = call_fd, reply_fd
        self.handles: dict[int, Handle] = {}
        self.crossings: set[str] = set()
        self.unnamed = 0  # reduced values of the classes past the first REDUCED_NAMES
        self.received = 0  # bytes of all the program's messages
        self.left: str | None = None  # why the program's side is gone, once it is

    def handle(self, number: int) -> Handle:
        if number not in self.handles:
            if len(self.handles) >= MAX_HANDLES:
                self.leave(f"the program's side sent more than {MAX_HANDLES} objects")
            self.handles[number] = Handle(self, number, False)
        return self.handles[number]

    def reduced(self, name: str) -> None:
        """A value the program reduced from an object of a subclass: its class is named among the crossings, up to
        REDUCED_NAMES classes (so that the verdict stays small whatever the program sends), and counted past them."""
        kind = f"reduced {name}"
        if kind in self.crossings:
            return
        if sum(k.startswith("reduced ") for k in self.crossings) < REDUCED_NAMES:
            self.crossings.add(kind)
        else:
            self.unnamed += 1

    def summary(self) -> list[str]:
        """The crossings, as the verdict lists them: each kind once, at most REDUCED_NAMES classes by name."""
        more = [f"reduced ({self.unnamed} more values, of other classes)"] if self.unnamed else []
        return sorted(self.crossings) + more

    def _number(self, value: object) -> int:
        """A handle inside a value the tests send (an argument, an attribute's new value), as its number."""
        if type(value) is not Handle:
            raise wire.NotPlainData(f"the tests would hand the program a {type(value).__qualname__}, which cannot cross "
                                    "the boundary (only plain data and the program's own objects can)")
        self.crossings.add("program object")  # handed back to the program: an input the program built
        return value._number

    def receive(self) -> tuple:
        """The child's next message, rebuilt; leaves (ProgramLeft) at the end of the stream or on a malformed one."""
        try:
            data = wire.receive(self.reply_fd)
            if data is None:
                self.leave("the program's process ended before the tests did (it exited, or was killed)")
            self.received += len(data)
            if self.received > CANDIDATE_BYTES:
                self.leave(f"the program's side sent more than {CANDIDATE_BYTES} bytes in all")
            message = wire.decode(data, self.handle, self.reduced)
        except wire.WireError as err:
            self.leave(f"the program's side sent a malformed message ({err})")
        if type(message) is not tuple or not message or type(message[0]) is not str:
            self.leave("the program's side sent a message that is not a reply")
        return message

    def leave(self, why: str):
        self.left = self.left or why
        raise ProgramLeft(self.left)

    def exchange(self, *message: object) -> tuple:
        """Send one request; its reply, as the child sent it."""
        if self.left:
            raise ProgramLeft(self.left)
        data = wire.encode(message, self._number)
        try:
            wire.send(self.call_fd, data)
        except BrokenPipeError:
            self.leave("the program's process ended before the tests did (it exited, or was killed)")
        return self.receive()

    def request(self, *message: object) -> object:
        """Send one request; the value it returned (StopIteration at the end of an iterator; the exception the
        program raised, rebuilt)."""
        reply = self.exchange(*message)
        kind = reply[0]
        if kind == "value" and len(reply) == 2:
            return reply[1]
        if kind == "stop":
            raise StopIteration
        if kind == "raised" and len(reply) == 3 and type(reply[1]) is str and type(reply[2]) is str:
            raise self.rebuilt(reply[1], reply[2])
        self.leave(f"the program's side sent an unexpected reply ({kind[:40]!r})")

    def call(self, function: int, args: tuple, kwargs: dict) -> object:
        """`function(*args, **kwargs)` on the program's side. Arguments it mutated come back with the result and
        are written into the tests' own objects, as if they had been shared."""
        reply = self.request("call", function, args, kwargs)
        if type(reply) is not tuple or len(reply) != 3:
            self.leave("the program's side sent a malformed result")
        result, new_args, new_kwargs = reply
        if new_args is not None or new_kwargs is not None:
            self.crossings.add("argument sent back")
            if type(new_args) is tuple and len(new_args) == len(args):
                for old, new in zip(args, new_args, strict=True):
                    restore(old, new)
            if type(new_kwargs) is dict:
                for key, old in kwargs.items():
                    if key in new_kwargs:
                        restore(old, new_kwargs[key])
        return result

    def rebuilt(self, name: str, message: str) -> BaseException:
        """The exception the program raised, as the tests see it: a built-in one by its name, else ProgramError."""
        message = message[:MESSAGE_CHARS]
        if name in _EXITS:
            self.left = f"the program's function raised {name} ({message})"
            return ProgramLeft(self.left)
        cls = _EXCEPTIONS.get(name)
        if cls is not None:
            try:
                return cls(message)
            except Exception:  # one whose constructor wants more (UnicodeDecodeError)
                pass
        return ProgramError(f"{name[:100]}: {message}")


def restore(old: object, new: object) -> None:
    """Write `new` (the program's copy of a mutated argument) into `old` (the tests' object), in place, keeping
    the identity of the tests' nested lists, dicts and sets where the shapes agree."""
    if type(old) is list and type(new) is list:
        if len(old) != len(new):
            old[:] = new
            return
        for i, (o, n) in enumerate(zip(old, new, strict=True)):
            if _mutable(o) and type(o) is type(n):
                restore(o, n)
            elif o is not n:
                old[i] = n
    elif type(old) is dict and type(new) is dict:
        for key in [k for k in old if k not in new]:
            del old[key]
        for key, n in new.items():
            o = old.get(key)
            if _mutable(o) and type(o) is type(n):
                restore(o, n)
            else:
                old[key] = n
    elif type(old) is set and type(new) is set:
        old.clear()
        old.update(new)
    elif type(old) is tuple and type(new) is tuple and len(old) == len(new):
        for o, n in zip(old, new, strict=True):
            if _mutable(o) and type(o) is type(n):
                restore(o, n)


def _mutable(x: object) -> bool:
    return type(x) in (list, dict, set, tuple)


def judge(spec: dict, channel: Channel) -> dict:
    """Run the tests of `spec` ({"tests", "prelude", "names", "filename"}) against the program behind
    `channel`; the verdict {"status": "passed" | "failed", "message", "crossings", "left"}."""
    namespace = {"__name__": "__tests__", "__builtins__": builtins}
    try:
        loaded = channel.receive()
        if loaded[0] != "ready":
            kind = loaded[0][:40]
            name, message = (loaded[1], loaded[2]) if kind == "raised" and len(loaded) == 3 else ("?", "")
            raise ProgramLeft(f"the program raised {str(name)[:100]} before its tests ({str(message)[:MESSAGE_CHARS]})")
        exec(compile(spec["prelude"], "<prompt>", "exec"), namespace)
        for name in spec["names"]:
            namespace.update(_bind(channel, name))
        exec(compile(spec["tests"], spec["filename"], "exec"), namespace)
        if channel.left:  # a test swallowed ProgramLeft with a bare `except:`
            raise ProgramLeft(channel.left)
        status, message = "passed", ""
    except BaseException as err:  # noqa: BLE001 - every way of not reaching the end is a failure
        status, message = "failed", _describe(err)
    return {"status": status, "message": message, "crossings": channel.summary(), "left": channel.left is not None}


def _bind(channel: Channel, name: str) -> dict:
    """{name: what the tests see under it}: the program's global as plain data or a handle; for a module the
    program imported, the judge's own import of the standard-library module of that name; {} where the program
    has no such global (a NameError in the tests, as upstream)."""
    reply = channel.exchange("get", name)
    if reply[0] == "value" and len(reply) == 2:
        if type(reply[1]) is Handle:
            object.__setattr__(reply[1], "_named", True)
        return {name: reply[1]}
    if reply[0] == "module" and len(reply) == 1:
        return {name: importlib.import_module(name)} if name in sys.stdlib_module_names else {}
    if reply[0] == "missing" and len(reply) == 1:
        return {}
    channel.leave(f"the program's side sent an unexpected reply to a name ({reply[0][:40]!r})")


def _describe(err: BaseException) -> str:
    if isinstance(err, ProgramLeft):
        return f"[spot-eval judge: failed: {err}]"
    lines = traceback.format_exception_only(type(err), err)
    where = [f"  line {frame.lineno} of {frame.filename}" for frame in traceback.extract_tb(err.__traceback__)
             if not frame.filename.endswith(("judge.py", "wire.py"))][-1:]
    return "[spot-eval judge: a test failed]\n" + "".join(lines).strip()[:MESSAGE_CHARS] + "".join("\n" + w for w in where)


def main(argv: list[str]) -> None:
    call_fd, reply_fd, cpu_s, memory_bytes = (int(arg) for arg in argv[1:5])
    # Its own limits, before it reads anything: what the program sends is decoded here (sandbox.py says why these).
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    spec = json.loads(sys.stdin.read())
    verdict_fd = os.dup(1)
    with open(os.devnull, "w") as sys.stdout:  # what the tests print is not the verdict
        verdict = judge(spec, Channel(call_fd, reply_fd))
    os.write(verdict_fd, json.dumps(verdict).encode())


if __name__ == "__main__":
    main(sys.argv)
