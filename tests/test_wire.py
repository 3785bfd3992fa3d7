"""spot_eval.execution.wire: plain data round-trips exactly, anything else crosses as a reference, and the
judge's decoder refuses every malformed message."""

from __future__ import annotations

import collections
import math
import os
import struct

import pytest

from spot_eval.execution import wire
from spot_eval.execution.wire import NotPlainData, WireError, decode, encode

PLAIN = [None, True, False, 0, -1, 2**200, -(2**65) + 3, 1.5, -0.0, math.inf, 1j, -2.5 + 3j, "", "héllo \udc80", b"\x00\xff",
         [], (), set(), frozenset(), {}, [1, [2, (3, {4: "x"})]], {(1, 2): frozenset({"a"}), None: [b""]}, {1, 2.5, "x", ()}]


# A set's repr follows the hash seed, which differs between pytest-xdist's workers; the test ids must not.
@pytest.mark.parametrize("value", PLAIN, ids=lambda v: repr(sorted(v, key=repr) if isinstance(v, (set, frozenset)) else v))
def test_plain_data_round_trips_exactly(value):
    back = decode(encode(value))
    assert back == value and type(back) is type(value)
    assert repr(back) == repr(value)  # -0.0 stays negative, bool stays bool


def test_nan_round_trips():
    assert math.isnan(decode(encode(float("nan"))))


class Eq(str):
    __eq__ = lambda self, other: True  # noqa: E731
    __hash__ = str.__hash__


class Meta(type):
    """A metaclass whose classes hash and compare like `str`: a `type(x) in {str, ...}` lookup believes them."""

    __hash__ = lambda cls: hash(str)  # noqa: E731
    __eq__ = lambda cls, other: True  # noqa: E731


class Fake(metaclass=Meta):
    __eq__ = lambda self, other: True  # noqa: E731
    __hash__ = lambda self: 0  # noqa: E731


@pytest.mark.parametrize(
    ("value", "expected", "names"),
    [
        (Eq("wrong"), "wrong", ["Eq"]),  # the value it holds, read through str's own method
        (collections.Counter("aab"), {"a": 2, "b": 1}, ["Counter"]),
        (collections.namedtuple("P", "x y")(1, [2, Eq("z")]), (1, [2, "z"]), ["P", "Eq"]),
        ({Eq("k"): collections.OrderedDict(a=1)}, {"k": {"a": 1}}, ["Eq", "OrderedDict"]),
    ],
)
def test_a_subclass_of_a_built_in_type_crosses_as_the_value_it_holds(value, expected, names):
    heard = []
    back = decode(encode(value), reduced=heard.append)
    assert back == expected and type(back) is type(expected) and heard == names
    if isinstance(expected, dict):
        assert all(type(k) is str for k in back)


def test_anything_else_is_a_reference_or_refused():
    assert Fake in {str} and type(Fake()) in {str, int}  # what the attack relies on
    objects = [Fake(), object(), len, iter([1]), math, range(3), bytearray(b"x")]
    assert decode(encode(objects, reference=lambda obj: [id(o) for o in objects].index(id(obj))), reference=lambda n: ("ref", n)) == [
        ("ref", n) for n in range(len(objects))]
    for value in objects:
        with pytest.raises(NotPlainData, match="is not plain data"):
            encode(value)  # without a reference function (the judge's own arguments)


def test_a_cycle_or_deep_nesting_is_refused():
    deep: list = []
    for _ in range(200):
        deep = [deep]
    cycle: list = []
    cycle.append(cycle)
    for value in (deep, cycle):
        with pytest.raises(NotPlainData, match="nested deeper than 100"):
            encode(value)


def _length(n: int) -> bytes:
    return struct.pack("<I", n)


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"", "past the end"),
        (b"Q", "unknown tag"),
        (wire.STR + _length(10) + b"abc", "past the end"),
        (wire.LIST + _length(1000) + wire.NONE, "longer than its message"),
        (wire.NONE + wire.NONE, "1 bytes after the value"),
        (wire.STR + _length(1) + b"\xff", "not UTF-8"),
        (wire.DICT + _length(1) + wire.LIST + _length(0) + wire.NONE, "cannot be one"),  # a list as a dict key
        (wire.SET + _length(1) + wire.DICT + _length(0), "cannot be one"),
        ((wire.LIST + _length(1)) * 150 + wire.NONE, "nested deeper than 100"),
        (wire.FLOAT + b"\x00" * 4, "past the end"),
    ],
    ids=["empty", "tag", "string", "count", "trailing", "utf8", "key", "member", "deep", "float"],
)
def test_the_decoder_refuses_malformed_messages(data, error):
    with pytest.raises(WireError, match=error):
        decode(data)


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (wire.REDUCED + _length(101) + b"N" * 101 + wire.NONE, "a class name of 101 characters"),
        (wire.REDUCED + _length(1 << 20) + b"N" * (1 << 20) + wire.NONE, "a class name of 1048576 bytes"),
        (wire.STR + _length(wire.MAX_STRING + 1), "a string of 16777217 bytes"),  # refused before it is read
        (wire.BYTES + _length(wire.MAX_STRING + 1), "a bytes value of 16777217 bytes"),
        (wire.INT + _length(wire.MAX_STRING + 1), "an int of 16777217 bytes"),
        (wire.LIST + _length(wire.MAX_ITEMS + 1) + wire.NONE * (wire.MAX_ITEMS + 1), "a container of 1048577 items"),
    ],
    ids=["name", "long name", "string", "bytes", "int", "items"],
)
def test_the_decoder_holds_its_limits_whatever_the_encoder(data, error):
    """The program can replace the encoder on its side (tests/test_sandbox.py does, through the sandbox); the
    limits hold where the judge decodes."""
    with pytest.raises(WireError, match=error):
        decode(data)


def test_the_decoded_size_is_bounded_not_the_encoded_one(monkeypatch):
    """Empty sets: 5 bytes each on the wire, some 224 bytes each decoded. The budget is MAX_DECODED (128 MiB),
    made 4 MiB here so that the test decodes little."""
    monkeypatch.setattr(wire, "MAX_DECODED", 4 << 20)
    empty_sets = (wire.SET + _length(0)) * 20_000
    with pytest.raises(WireError, match="more than 4 MiB once decoded"):
        decode(wire.LIST + _length(20_000) + empty_sets)  # 100 kB: 4.4 MB decoded
    nested = wire.LIST + _length(4) + (wire.LIST + _length(5000) + empty_sets[:25_000]) * 4
    with pytest.raises(WireError, match="more than 4 MiB once decoded"):  # counted across containers
        decode(nested)
    assert len(decode(wire.LIST + _length(15_000) + empty_sets[:75_000])) == 15_000  # 3.4 MB


def test_a_class_name_at_the_limit_decodes():
    name = "\U0001f600" * wire.MAX_NAME  # 100 characters of 4 bytes each
    heard = []
    assert decode(wire.REDUCED + wire._str_bytes(name) + wire.NONE, reduced=heard.append) is None and heard == [name]


def test_messages_cross_a_pipe_whole_and_the_end_is_told_apart_from_a_cut():
    read, write = os.pipe()
    big = encode(["x" * 100_000] * 3)
    pid = os.fork()
    if pid == 0:  # a writer larger than the pipe's buffer
        os.close(read)
        wire.send(write, big)
        wire.send(write, b"")
        os._exit(0)
    os.close(write)
    assert wire.receive(read) == big and wire.receive(read) == b"" and wire.receive(read) is None
    os.waitpid(pid, 0)
    os.close(read)
    read, write = os.pipe()
    os.write(write, _length(10) + b"abc")
    os.close(write)
    with pytest.raises(WireError, match="ended inside a message"):
        wire.receive(read)
    os.close(read)
    read, write = os.pipe()
    os.write(write, _length(wire.MAX_MESSAGE + 1))
    os.close(write)
    with pytest.raises(WireError, match="a message of"):
        wire.receive(read)
    os.close(read)
