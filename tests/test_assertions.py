"""spot_eval.execution.assertions on literal inputs: what the rewritten assertions reduce, and what they refuse."""

from __future__ import annotations

import ast
import collections
import math

import pytest

from spot_eval.execution import assertions
from spot_eval.execution.assertions import CHECKED, PLAIN, NotPlainData, guard, guards

plain, checked = guards()[PLAIN], guards()[CHECKED]


class Eq(str):
    __eq__ = lambda self, other: True  # noqa: E731
    __hash__ = str.__hash__


class Anything:
    __eq__ = lambda self, other: True  # noqa: E731
    __abs__ = lambda self: 0.0  # noqa: E731


def test_the_assertions_are_rewritten_and_nothing_else_is():
    tests = "def check(f):\n    x = f(1)\n    assert abs(f(2) - 3.5) < 1e-6 and not f(3), 'message'\ncheck(g)\n"
    assert ast.unparse(guard(tests, "tests.py")) == (
        "def check(f):\n    x = f(1)\n"
        "    assert __spot_plain__(__spot_plain__(__spot_plain__(__spot_checked__(abs)(__spot_plain__(__spot_checked__(f)(2)) "
        "- __spot_plain__(3.5))) < __spot_plain__(1e-06)) and __spot_plain__(not __spot_plain__(__spot_checked__(f)(3)))), "
        "'message'\ncheck(g)"
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (3, 3), (True, True), (None, None), (2.5, 2.5), (1j, 1j), (b"x", b"x"),
        (Eq("wrong"), "wrong"),  # a subclass: the value it holds, read through str's own method
        (collections.Counter("aab"), {"a": 2, "b": 1}),
        (collections.OrderedDict(a=1), {"a": 1}),
        (collections.namedtuple("P", "x y")(1, [2, Eq("z")]), (1, [2, "z"])),
        ({Eq("k"): frozenset({1})}, {"k": frozenset({1})}),
    ],
)
def test_plain_data_is_reduced_to_built_in_types(value, expected):
    reduced = plain(value)
    assert reduced == expected and type(reduced) is type(expected)
    if isinstance(expected, dict):
        assert all(type(k) is str for k in reduced)


@pytest.mark.parametrize("value", [Anything(), [1, Anything()], object(), math, {"a": {1: Anything()}}, range(3)])
def test_anything_else_fails_the_assertion(value):
    with pytest.raises(NotPlainData, match="not built-in data"):
        plain(value)


def test_a_value_nested_too_deep_fails():
    deep: list = []
    for _ in range(200):
        deep = [deep]
    with pytest.raises(NotPlainData, match="nested deeper than 100 levels"):
        plain(deep)


def test_built_ins_get_reduced_arguments_and_the_programs_functions_get_theirs_untouched():
    assert checked(abs)(Eq("x").__len__()) == 1
    with pytest.raises(NotPlainData, match="Anything"):
        checked(abs)(Anything())  # abs would ask the object's own __abs__
    assert checked(sorted)([3, 1], key=lambda v: -v) == [3, 1]  # a function argument passes as it is
    assert checked(list)(zip([1], [2], strict=True)) == [(1, 2)]
    pair = Anything()
    assert checked(lambda p: p)(pair) is pair  # a test may hand the program its own objects


def test_what_the_program_rebinds_later_changes_nothing(monkeypatch):
    """The guards hold the built-ins they were made with: a later `type` or `issubclass` in their module's globals
    (where a program that imports the module, or rebinds the built-ins, would put one) is never consulted."""
    reduce_now = guards()[PLAIN]
    monkeypatch.setattr(assertions, "type", lambda *a: int, raising=False)
    monkeypatch.setattr(assertions, "issubclass", lambda *a: True, raising=False)
    assert reduce_now(Eq("wrong")) == "wrong"
    with pytest.raises(NotPlainData):
        reduce_now(Anything())
