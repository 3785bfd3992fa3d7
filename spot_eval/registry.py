"""Every method a run can name, and where each comes from.

Three sources, one path: the built-in methods (spot_eval.families), the methods installed packages declare under
the `spot_eval.methods` entry-point group, and those of plugin files or modules named on the command line
(lm_eval's `plugins=`, spot-eval's `--plugins`). Each is a `spot_eval.method.Method`, admitted by `_admit`, which
keeps the first of two methods of one name: built-in names always win, then installed packages in the order
Python lists them, then plugin files in the order named.

A package whose entry point does not import, or a method whose name is taken, is named at start-up in one warning
line with the package it came from, and the rest still load (lm-eval's and pytest's rule). A plugin file named on
the command line that cannot be read or imported is an error: the user asked for it.

The reports read method names and colours from here (`described`); a run records each method's description in
run.json, so that a report drawn where a plugin is not installed still names and colours it as the run did
(`remember`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from spot_eval.families import FAMILIES
from spot_eval.method import Method, PluginWarning, declared

GROUP = "spot_eval.methods"


@dataclass(frozen=True)
class Origin:
    """Where a method comes from: `kind` "built in", "package" (`source`: the distribution's name and version) or
    "file" (`source`: the plugin file's path, or the module's name)."""

    kind: str
    source: str = ""

    def __str__(self) -> str:
        return self.kind if not self.source else f"{self.kind} {self.source}"


BUILT_IN = Origin("built in")


@dataclass(frozen=True)
class Entry:
    method: Method
    origin: Origin


_entries: dict[str, Entry] = {}
_files: dict[str, tuple[str, ...]] = {}  # a plugin file's resolved path (or module name) -> the names it added
_remembered: dict[str, Method] = {}  # descriptions read from runs (`remember`)


def entries() -> dict[str, Entry]:
    """name -> Entry: the built-in methods, then the installed packages' (read once per process), then the plugin
    files loaded so far (`load_plugins`)."""
    if not _entries:
        for method in FAMILIES:
            _entries[method.name] = Entry(method, BUILT_IN)
        for problem in _load_entry_points():
            warnings.warn(problem, PluginWarning, stacklevel=2)
    return _entries


def methods() -> tuple[str, ...]:
    """The names `methods=` may use: every method with a drafter (draft_free is the reference, not a method)."""
    return tuple(name for name, e in entries().items() if e.method.build is not None)


def entry(name: str) -> Entry:
    """The method of that name. Raises ValueError naming the known ones."""
    found = entries().get(name)
    if found is None or found.method.build is None:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(methods())} (a plugin's: plugins=FILE, or "
                         "install its package; spot-eval methods lists what is here)")
    return found


def described(name: str) -> Method:
    """How the reports name and draw a method: its entry, else the description a run recorded (`remember`), else a
    plain one (its name, a spare colour chosen by it)."""
    found = entries().get(name)
    if found is not None:
        return found.method
    return _remembered.get(name) or Method(name, None)


def description(name: str) -> dict:
    """What a run records of a method (run.json's "methods"), for `remember` where the method is not installed."""
    e = entries()[name]
    m = e.method
    return {"display": m.display, "colour": m.colour, "hatch": m.hatch, "acceptance": m.acceptance, "origin": str(e.origin)}


def remember(recorded: dict[str, dict]) -> None:
    """Descriptions from a run's run.json, for the methods this process does not know (a plugin installed where the
    run was made, not here); a method known here keeps its own."""
    for name, d in recorded.items():
        if name not in entries() and isinstance(d, dict):
            try:
                _remembered[name] = Method(name, None, str(d.get("display") or ""), str(d.get("colour") or ""),
                                           hatch=str(d.get("hatch") or ""), acceptance=str(d.get("acceptance") or "exact"))
            except ValueError:
                continue  # a hand-edited run.json: the plain description stands


def load_plugins(items: Iterable[str], option: str = "plugins") -> tuple[Entry, ...]:
    """Load plugin files or modules (each a path to a .py file, or a dotted module name on the import path) and
    admit every `Method` at their top level; a file loaded before is not loaded again.

    Returns the entries they added. Raises ValueError (naming `option`, how the user gave them) for a file that
    does not exist, does not import, or holds no Method."""
    entries()  # the built-in and installed methods first: their names win
    added: list[Entry] = []
    for item in items:
        key, module = _import_plugin(item, option)
        if key in _files:
            added += [entries()[n] for n in _files[key] if n in entries()]
            continue
        found = [v for v in vars(module).values() if isinstance(v, Method)]
        if not found:
            raise ValueError(f"{option}={item} holds no spot_eval.plugin.Method at its top level; describe each method "
                             "as NAME = Method(name=..., build=...) (docs/plugins.md)")
        origin = Origin("file", key)
        names = []
        for method in found:
            problem = _admit(method, origin)
            if problem is None:
                names.append(method.name)
                added.append(entries()[method.name])
            elif not (method.name in entries() and entries()[method.name].method is method):  # an import is no clash
                warnings.warn(problem, PluginWarning, stacklevel=2)
        _files[key] = tuple(names)
    return tuple(added)


def _import_plugin(item: str, option: str):
    """(the plugin's key, its module): a .py file imported under a name of its own, or a module by its name."""
    is_file = item.endswith(".py") or "/" in item or "\\" in item
    path = Path(item).expanduser().resolve()
    if is_file and not path.is_file():
        raise ValueError(f"{option}={item}: no such file; pass a plugin's .py file or an importable module name")
    try:
        if not is_file:
            return item, importlib.import_module(item)
        key = str(path)
        name = f"spot_eval_plugin_{path.stem}_{hashlib.sha256(key.encode()).hexdigest()[:8]}"
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # before it runs: dataclasses and pickling look their module up there
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
        return key, sys.modules[name]
    except Exception as err:
        raise ValueError(f"{option}={item} does not import: {type(err).__name__}: {err}") from err


def _load_entry_points() -> list[str]:
    """Admit the methods of every installed package's `spot_eval.methods` entry points (each a Method, or a list
    of them); returns a line per one that failed."""
    problems = []
    for found in declared(GROUP):
        origin = Origin("package", found.package)
        if found.error is not None:
            problems.append(f"spot-eval: the method plugin {found.point!r} of {origin} does not import "
                            f"({type(found.error).__name__}: {found.error}); the other methods still load")
        for method in found.items:
            problem = _admit(method, origin, found.point)
            if problem is not None:
                problems.append(problem)
    return problems


def _admit(method: object, origin: Origin, point: str | None = None) -> str | None:
    """Add `method` unless it is not a Method or its name is taken; the line that says why not, else None."""
    where = f"{origin}" + (f" (entry point {point!r})" if point else "")
    if not isinstance(method, Method):
        return (f"spot-eval: {where} declares a {type(method).__name__}, not a spot_eval.plugin.Method; it was not "
                "loaded")
    if method.build is None:
        return f"spot-eval: method {method.name!r} of {where} has no build function; it was not loaded"
    taken = _entries.get(method.name)
    if taken is not None:
        return (f"spot-eval: method {method.name!r} of {where} clashes with the {method.name!r} of {taken.origin}, which "
                "keeps the name; rename the plugin's method")
    _entries[method.name] = Entry(method, origin)
    return None


def forget_plugins() -> None:
    """Start over at the next `entries()` call (tests that install and remove plugins)."""
    _entries.clear()
    _files.clear()
    _remembered.clear()
