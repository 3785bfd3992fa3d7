"""The boundary's data format: plain data, and references to the program's objects, as bytes.

Every value that crosses between the judge (spot_eval.execution.judge, trusted) and the sandboxed program
(spot_eval.execution.launcher) is encoded here. Plain data is `int`, `float`, `complex`, `str`, `bytes`, `bool`,
`None`, and lists, tuples, dicts, sets and frozensets of them; anything else the program holds (a function, an
object of its class, a generator) crosses as a reference, a number that only the program's side can resolve.

`decode` is the judge's half, and it is strict: it reads tags, never types; builds fresh built-in objects (a
subclass cannot come out of it, whatever went in); refuses an unknown tag, a length past the end, bytes left over,
a dict key or set member that is not hashable, nesting deeper than MAX_DEPTH; and never evaluates, imports or
unpickles anything. A reference comes out as whatever `reference` makes of its number (the judge's `Handle`).
It also holds every limit itself, whatever encoder wrote the bytes: a class name of at most MAX_NAME characters, a
str, bytes or int of at most MAX_STRING bytes, a container of at most MAX_ITEMS items, and a value that takes at
most MAX_DECODED bytes of memory once decoded, so that a message of a few bytes an item (empty lists, repeated
references) cannot grow into gigabytes on the trusted side.

`encode` runs on both sides. On the program's side it is the program's to subvert, which changes nothing: it can
only choose what bytes it sends, which is what its functions return anyway. It dispatches on `type(x) is ...`
(a metaclass whose hash and equality mimic `str` matches no `is`); a subclass of a built-in type (a
`collections.Counter`, a namedtuple, a `class Eq(str)`) is reduced to the built-in value it holds, read through
the built-in type's own methods, and tagged with its class name so the judge can say that it happened.

Imported by the sandbox's child before it confines itself, so it imports only the standard library.
"""

from __future__ import annotations

import os
import struct
import sys
from collections.abc import Callable

MAX_DEPTH = 100  # nesting of containers in one value
MAX_MESSAGE = 64 << 20  # bytes in one message; a longer one is refused (a result of MBPP or HumanEval is tiny)
# Limits the decoder holds, since the encoder on the program's side is the program's to replace.
MAX_NAME = 100  # characters in the class name of a reduced value (the encoder cuts it there)
MAX_STRING = 16 << 20  # bytes of one str, bytes or int
MAX_ITEMS = 1 << 20  # items in one container
MAX_DECODED = 128 << 20  # bytes one decoded value takes in memory: each object's sys.getsizeof and a pointer to it

# One byte per tag.
NONE, TRUE, FALSE, INT, FLOAT, COMPLEX, STR, BYTES = b"N", b"T", b"F", b"I", b"D", b"C", b"S", b"B"
LIST, TUPLE, SET, FROZENSET, DICT, REF, REDUCED = b"L", b"U", b"E", b"Z", b"M", b"R", b"X"

_LEN = struct.Struct("<I")
_ID = struct.Struct("<Q")
_DOUBLE = struct.Struct("<d")
_COMPLEX = struct.Struct("<dd")


class WireError(ValueError):
    """Bytes that are not a well-formed value: the judge refuses them, and the test fails."""


class NotPlainData(TypeError):
    """A value that cannot cross as plain data where only plain data may (the judge's own arguments)."""


# ---- encoding ----


def encode(value: object, reference: Callable[[object], int] | None = None) -> bytes:
    """`value` as bytes. `reference(obj) -> number` stands for anything that is not plain data; without it,
    such a value raises NotPlainData."""
    out: list[bytes] = []
    _encode(value, out, reference, 0)
    return b"".join(out)


def _encode(x: object, out: list[bytes], reference: Callable[[object], int] | None, depth: int) -> None:
    t = type(x)
    if x is None:
        out.append(NONE)
    elif x is True or x is False:
        out.append(TRUE if x else FALSE)
    elif t is int:
        out += [INT, _int_bytes(x)]
    elif t is float:
        out += [FLOAT, _DOUBLE.pack(x)]
    elif t is complex:
        out += [COMPLEX, _COMPLEX.pack(x.real, x.imag)]
    elif t is str:
        out += [STR, _str_bytes(x)]
    elif t is bytes:
        out += [BYTES, _LEN.pack(len(x)), x]
    elif t is list or t is tuple or t is set or t is frozenset or t is dict:
        if depth >= MAX_DEPTH:
            raise NotPlainData(f"a value nested deeper than {MAX_DEPTH} levels (a cycle?)")
        _container(x, t, out, reference, depth + 1)
    else:
        base = _builtin_base(t)
        if base is None:
            if reference is None:
                raise NotPlainData(f"a value of type {t.__qualname__} is not plain data")
            out += [REF, _ID.pack(reference(x))]
            return
        name = t.__qualname__ if type(t.__qualname__) is str else "?"
        out += [REDUCED, _str_bytes(name[:MAX_NAME])]
        _encode(_reduce(x, base), out, reference, depth + 1)


def _container(x, t: type, out: list[bytes], reference, depth: int) -> None:
    if t is dict:
        items = list(dict.items(x))
        out += [DICT, _LEN.pack(len(items))]
        for key, item in items:
            _encode(key, out, reference, depth)
            _encode(item, out, reference, depth)
        return
    items = list(_ITER[t](x))
    out += [_TAGS[t], _LEN.pack(len(items))]
    for item in items:
        _encode(item, out, reference, depth)


_TAGS = {list: LIST, tuple: TUPLE, set: SET, frozenset: FROZENSET}
_ITER = {list: list.__iter__, tuple: tuple.__iter__, set: set.__iter__, frozenset: frozenset.__iter__}
_BASES = (int, float, complex, str, bytes, list, tuple, dict, frozenset, set)


def _builtin_base(t: type) -> type | None:
    for base in _BASES:
        if issubclass(t, base):  # type.__subclasscheck__: the real MRO, not a __class__ the object claims
            return base
    return None


def _reduce(x: object, base: type) -> object:
    """The built-in value a subclass instance holds, read through the built-in type's own methods (which the
    subclass's overrides never reach)."""
    if base is complex:
        return complex(complex.real.__get__(x), complex.imag.__get__(x))
    if base is dict:
        return dict(dict.items(x))
    if base in (list, tuple, set, frozenset):
        return base(_ITER[base](x))
    return {int: int.__int__, float: float.__float__, str: str.__str__, bytes: bytes.__bytes__}[base](x)


def _int_bytes(x: int) -> bytes:
    data = x.to_bytes((x.bit_length() + 8) // 8, "little", signed=True)
    return _LEN.pack(len(data)) + data


def _str_bytes(s: str) -> bytes:
    data = s.encode("utf-8", "surrogatepass")
    return _LEN.pack(len(data)) + data


# ---- decoding ----


def decode(data: bytes, reference: Callable[[int], object] = lambda number: number,
           reduced: Callable[[str], None] = lambda name: None) -> object:
    """The value `data` holds, as fresh built-in objects; `reference(number)` stands for each reference and
    `reduced(class name)` hears of each subclass value the sender reduced.

    Raises:
        WireError: `data` is not exactly one well-formed value.
    """
    reader = _Reader(bytes(data), reference, reduced)
    value = reader.value(0)
    if reader.at != len(reader.data):
        raise WireError(f"{len(reader.data) - reader.at} bytes after the value")
    return value


class _Reader:
    def __init__(self, data: bytes, reference: Callable[[int], object], reduced: Callable[[str], None]):
        self.data, self.at, self.reference, self.reduced = data, 0, reference, reduced
        self.left = MAX_DECODED  # bytes of memory the decoded value may still take

    def take(self, n: int) -> bytes:
        if n > len(self.data) - self.at:
            raise WireError("a length past the end of the message")
        chunk = self.data[self.at:self.at + n]
        self.at += n
        return chunk

    def length(self) -> int:
        return _LEN.unpack(self.take(4))[0]

    def sized(self, most: int, what: str) -> bytes:
        """The next length-prefixed run of bytes, refused past `most` before it is read."""
        n = self.length()
        if n > most:
            raise WireError(f"{what} of {n} bytes (at most {most})")
        return self.take(n)

    def text(self, most: int = MAX_STRING, what: str = "a string") -> str:
        try:
            return self.sized(most, what).decode("utf-8", "surrogatepass")
        except UnicodeDecodeError as err:
            raise WireError(f"a string that is not UTF-8: {err}") from None

    def name(self) -> str:
        name = self.text(4 * MAX_NAME, "a class name")  # utf-8 is at most 4 bytes a character
        if len(name) > MAX_NAME:
            raise WireError(f"a class name of {len(name)} characters (at most {MAX_NAME})")
        return name

    def value(self, depth: int) -> object:
        if depth > MAX_DEPTH:
            raise WireError(f"a value nested deeper than {MAX_DEPTH} levels")
        tag = self.take(1)
        if tag == REDUCED:
            self.reduced(self.name())
            return self.value(depth + 1)
        value = self.container(tag, depth + 1) if tag in _CONTAINERS else self.atom(tag)
        # Each item as it is decoded, then the container once built (a shared object such as None is counted too).
        self.left -= _POINTER + sys.getsizeof(value)
        if self.left < 0:
            raise WireError(f"a value that would take more than {MAX_DECODED >> 20} MiB once decoded")
        return value

    def atom(self, tag: bytes) -> object:
        if tag in _ATOMS:
            return _ATOMS[tag]
        if tag == INT:
            return int.from_bytes(self.sized(MAX_STRING, "an int"), "little", signed=True)
        if tag == FLOAT:
            return _DOUBLE.unpack(self.take(8))[0]
        if tag == COMPLEX:
            return complex(*_COMPLEX.unpack(self.take(16)))
        if tag == STR:
            return self.text()
        if tag == BYTES:
            return self.sized(MAX_STRING, "a bytes value")
        if tag == REF:
            return self.reference(_ID.unpack(self.take(8))[0])
        raise WireError(f"unknown tag {tag!r}")

    def container(self, tag: bytes, depth: int) -> object:
        count = self.length()
        if count > MAX_ITEMS:
            raise WireError(f"a container of {count} items (at most {MAX_ITEMS})")
        if count > len(self.data) - self.at:  # every item takes a byte at least
            raise WireError("a container longer than its message")
        try:
            if tag == DICT:
                return {self.value(depth): self.value(depth) for _ in range(count)}
            items = [self.value(depth) for _ in range(count)]
            return {LIST: list, TUPLE: tuple, SET: set, FROZENSET: frozenset}[tag](items)
        except TypeError as err:  # an unhashable key or member (a list as a dict key)
            raise WireError(f"a dict key or set member that cannot be one: {err}") from None


_ATOMS = {NONE: None, TRUE: True, FALSE: False}
_CONTAINERS = (LIST, TUPLE, SET, FROZENSET, DICT)
_POINTER = 8  # the slot that holds a decoded value in its container


# ---- messages on a pipe ----


def send(fd: int, message: bytes) -> None:
    """One message: its length, then its bytes (a pipe may take a long one in parts)."""
    view = memoryview(_LEN.pack(len(message)) + message)
    while view:
        view = view[os.write(fd, view):]


def receive(fd: int) -> bytes | None:
    """The next message, or None at the end of the stream (the other side closed it, or exited).

    Raises:
        WireError: a message longer than MAX_MESSAGE, or a stream cut inside a message.
    """
    header = _read_exactly(fd, 4)
    if header is None:
        return None
    size = _LEN.unpack(header)[0]
    if size > MAX_MESSAGE:
        raise WireError(f"a message of {size} bytes (at most {MAX_MESSAGE})")
    body = _read_exactly(fd, size)
    if body is None:
        raise WireError("the stream ended inside a message")
    return body


def _read_exactly(fd: int, n: int) -> bytes | None:
    parts, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            if left == n and n:
                return None
            raise WireError("the stream ended inside a message")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)
