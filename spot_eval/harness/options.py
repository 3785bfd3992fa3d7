"""Options: every user setting written once, as a field of one typed class, and each front door generated from it.

A setting is a dataclass field declared with `spot.config.setting` (its help, choices, what leaving it unset
means). `DecodeConfig` holds the decoder's (nested `Sampling` included), `spot_eval.harness.settings` the
target's (`TargetSettings`), the evaluation's (`RunSettings`) and the tracking's (`TrackingSettings`). From
those fields come, with no other list to keep in step:

    lm_eval's model_args      `parse` (typed, each bad value named), then `build` the classes
    spot-eval's flags         `add_flags` (and `given` to read them back)
    the model_args reference  docs/generate.py, from `Option.help`, `Option.choices` and `Option.shown_default`

Ranges and the other rules stay with each class (`DecodeConfig.__post_init__`), so both front doors refuse a
value with the same words.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from spot.config import Setting
from spot_eval.harness.settings import as_bool, as_float, as_int

KINDS = {bool: as_bool, int: as_int, float: as_float}


@dataclass(frozen=True)
class Option:
    """One setting as a front door sees it.

    name: its model_args name (the flag: `--name-with-dashes`). path: the field names that reach it from its class
    (("sampling", "temperature")). kind: bool, int, float or str. optional: None is a value (unset).
    """

    name: str
    path: tuple[str, ...]
    kind: type
    optional: bool
    default: object
    setting: Setting

    @property
    def help(self) -> str:
        return self.setting.help

    @property
    def choices(self) -> tuple[str, ...]:
        return self.setting.choices

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def type_name(self) -> str:
        return self.kind.__name__ + (" | None" if self.optional else "")

    @property
    def shown_default(self) -> str:
        """The default as the docs and --help say it: a value, or what leaving it unset means."""
        if self.setting.shown is not None:
            return self.setting.shown
        if self.default is None:
            return self.setting.unset or "unset"
        return str(self.default).lower() if isinstance(self.default, bool) else str(self.default)

    def coerce(self, value: object) -> object:
        """A value as lm-eval hands it over (a string, or a number it coerced: `-1` arrives as `-1.0`), typed."""
        if value is None:
            return None
        return self.check(KINDS[self.kind](self.name, value) if self.kind in KINDS else str(value))

    def check(self, value: object) -> object:
        """The value, or a ValueError where it is not one of `choices`, in the words both front doors use."""
        if self.choices and value is not None and value not in self.choices:
            raise ValueError(f"unknown {self.name} {value!r}; choose one of {', '.join(self.choices)}")
        return value


def options(cls: type) -> tuple[Option, ...]:
    """The settings of a dataclass, in field order, a nested settings class's (DecodeConfig.sampling) in its place."""
    hints = typing.get_type_hints(cls)
    out: list[Option] = []
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            out += [dataclasses.replace(o, path=(f.name, *o.path)) for o in options(kind)]
            continue
        setting = f.metadata.get("setting")
        if setting is None:
            continue  # set by the program, not the user (DecodeConfig.budget: the method's)
        args = set(typing.get_args(kind)) if isinstance(kind, types.UnionType) else {kind}
        base = next(iter(args - {type(None)}))
        default = None if setting.unset is not None else f.default
        out.append(Option(setting.option or f.name, (f.name,), base, type(None) in args or default is None, default, setting))
    return tuple(out)


def parse(opts: Iterable[Option], given: Mapping[str, object]) -> dict[str, object]:
    """Every option's typed value by name: the given ones coerced, the others their defaults. Unknown names are refused."""
    opts = tuple(opts)
    by_name = {o.name: o for o in opts}
    unknown = sorted(k for k in given if k not in by_name)
    if unknown:
        hint = " (list items are joined with '+': methods=spot+spiffy, budgets=8+20)" if any(
            given[k] in ("", None) for k in unknown) else ""
        raise ValueError(f"unknown model_args {', '.join(unknown)}{hint}; known: {', '.join(sorted(by_name))}")
    return {o.name: o.default if given.get(o.name) is None else o.coerce(given[o.name]) for o in opts}


def build(cls: type, values: Mapping[str, object], opts: Iterable[Option] | None = None, **fixed: object) -> object:
    """An instance of `cls` from option values by name (the missing ones its defaults), nested classes included;
    `fixed`: fields set by the program (DecodeConfig's block_length once the checkpoint is read)."""
    opts = options(cls) if opts is None else tuple(opts)
    fields: dict[str, dict] = {}
    for o in opts:
        if o.name in values:
            node = fields
            for part in o.path[:-1]:
                node = node.setdefault(part, {})
            node[o.path[-1]] = values[o.name]
    return _make(cls, {**fields, **fixed})


def _make(cls: type, fields: dict) -> object:
    hints = typing.get_type_hints(cls)
    return cls(**{k: _make(hints[k], v) if isinstance(v, dict) and dataclasses.is_dataclass(hints[k]) else v
                  for k, v in fields.items()})


def values_of(instance: object, opts: Iterable[Option]) -> dict[str, object]:
    """The options' values held by an instance of their class, by name (the inverse of `build`)."""
    out = {}
    for o in opts:
        value = instance
        for part in o.path:
            value = getattr(value, part)
        out[o.name] = value
    return out


def add_flags(parser: argparse.ArgumentParser, opts: Iterable[Option], only: Iterable[str] | None = None,
              helps: Mapping[str, str] | None = None) -> None:
    """A flag per option (`only`: these names, in this order); `helps` replaces an option's help where a command
    gives it another meaning (its default then said there, if at all). Numbers are checked by argparse's type, the
    rest by the class, as model_args are."""
    by_name = {o.name: o for o in opts}
    for name in only or by_name:
        o = by_name[name]
        text = (helps or {}).get(name) or o.help + ("" if o.kind is bool else f" (default: {o.shown_default})")
        flags = [o.flag, *("--" + a.replace("_", "-") for a in o.setting.aliases)]
        metavar = "{" + ",".join(o.choices) + "}" if o.choices else None
        if o.kind is bool:
            parser.add_argument(*flags, dest=o.name, action=argparse.BooleanOptionalAction, default=o.default, help=text)
        else:
            parser.add_argument(*flags, dest=o.name, type=_chosen(o) if o.choices else o.kind, default=o.default,
                                metavar=metavar, help=text)


def _chosen(o: Option) -> Callable[[str], object]:
    """argparse's type for an option with choices: its value, or the option's own refusal (Option.check) as the
    flag's error (argparse's `choices` would word it otherwise than model_args do)."""
    def parse(text: str) -> object:
        try:
            return o.check(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return parse


def given(args: argparse.Namespace, opts: Iterable[Option]) -> dict[str, object]:
    """The parsed flags' values by option name."""
    return {o.name: getattr(args, o.name) for o in opts if hasattr(args, o.name)}
