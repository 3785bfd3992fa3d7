"""Target plugins: model families that installed packages teach spot-eval, by config.json's model_type.

A package declares its `ModelType`s under the `spot_eval.targets` entry-point group (each entry point a ModelType,
or a list or tuple of them). `discover` reads the group once per process, the first time a checkpoint is read
(spot_eval.checkpoints.target.read_target), so that every command (lm_eval --model spot, spot-eval decode, ...)
loads a plugin's checkpoints as it loads the built-in families'. The rules are the method plugins'
(spot_eval.registry): built-in model_types always win, then packages in the order Python lists them; a package
whose entry point does not import, or whose model_type is taken, is named in one PluginWarning line with the
package's name and version, and the rest still load.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

from spot.targets.checkpoint import FAMILIES, Family, register_family
from spot_eval.method import PluginWarning, declared

GROUP = "spot_eval.targets"
BUILT_IN = "built in"
_BUILT_IN_TYPES = frozenset(FAMILIES)  # before any plugin: spot.targets.checkpoint's own


@dataclass(frozen=True)
class ModelType:
    """A model family from a plugin: checkpoints whose config.json says `"model_type": name` load as `family` says
    (spot.targets.checkpoint.Family: the config and model classes, block-causal or bidirectional attention, the
    block size where config.json names none, weight renames, the logits' shift).

    reference: optionally the family's own generate function, `reference(model, prompt_ids, config) -> token ids`
    (model: the family's transformers model with the checkpoint's weights, float32 on the CPU, as its class loads
    them; prompt_ids: a list of ints, the last block partial; config: a spot.config.DecodeConfig at budget 0 with
    stop_at_eos False and a gen_length that ends the canvas on a whole block, so every one of its gen_length tokens
    is compared), which `spot-eval check-target` compares spot-eval's draft-free
    decoding with, token for token (for a bidirectional family, under the frozen-cache decoder the check runs:
    dual unless told, `none` being the uncached decoder of LLaDA's and Dream's own generate).
    """

    name: str
    family: Family
    reference: Callable | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"ModelType name must be config.json's model_type, a non-empty string; got {self.name!r}")
        if not isinstance(self.family, Family):
            raise ValueError(f"ModelType {self.name!r}: family must be a spot_eval.plugin.TargetFamily, got "
                             f"{type(self.family).__name__}")
        if self.reference is not None and not callable(self.reference):
            raise ValueError(f"ModelType {self.name!r}: reference must be a function (model, prompt_ids, config) -> "
                             f"token ids, got {type(self.reference).__name__}")


@dataclass(frozen=True)
class Entry:
    """A plugin's model_type as registered, and the package it came from ("NAME VERSION")."""

    model_type: ModelType
    package: str


_entries: dict[str, Entry] = {}  # plugin model_type -> its entry; the built-in ones are FAMILIES' own
_discovered = False


def discover() -> None:
    """Register the model_types of every installed package's `spot_eval.targets` entry points (once per process):
    one PluginWarning line for each that does not import or load."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    for problem in _load_entry_points():
        warnings.warn(problem, PluginWarning, stacklevel=2)


def origin(model_type: str) -> str:
    """Where a model_type comes from: "built in", "package NAME VERSION", or "register_family" (a family a program
    registered itself, spot.targets.checkpoint.register_family)."""
    discover()
    if model_type in _entries:
        return f"package {_entries[model_type].package}"
    if model_type in FAMILIES:
        return BUILT_IN if model_type in _BUILT_IN_TYPES else "register_family"
    raise ValueError(f"unknown model_type {model_type!r}; spot-eval loads {', '.join(FAMILIES)} (a plugin's: install "
                     f"the package that declares it under {GROUP})")


def reference(model_type: str) -> Callable | None:
    """The plugin's own generate function for a model_type (`ModelType.reference`); None for the built-in families and
    for plugins that give none."""
    discover()
    entry = _entries.get(model_type)
    return entry.model_type.reference if entry is not None else None


def _load_entry_points() -> list[str]:
    """Register the model_types the group's entry points declare; a line per one that failed."""
    problems = []
    for found in declared(GROUP):
        if found.error is not None:
            problems.append(f"spot-eval: the target plugin {found.point!r} of package {found.package} does not import "
                            f"({type(found.error).__name__}: {found.error}); the other model types still load")
        for model_type in found.items:
            problem = _admit(model_type, found.package, f"package {found.package} (entry point {found.point!r})")
            if problem is not None:
                problems.append(problem)
    return problems


def _admit(model_type: object, package: str, where: str) -> str | None:
    """Register `model_type` unless it is not a ModelType or its name is taken; the line that says why not, else
    None."""
    if not isinstance(model_type, ModelType):
        return (f"spot-eval: {where} declares a {type(model_type).__name__}, not a spot_eval.plugin.ModelType; it was "
                "not loaded")
    name = model_type.name
    if name in FAMILIES:
        taken = origin(name)
        return (f"spot-eval: model_type {name!r} of {where} clashes with the {name!r} of {taken}, which keeps it; "
                "rename the plugin's model_type")
    try:
        register_family(name, model_type.family)
    except ValueError as err:
        return f"spot-eval: {where}: {err}; it was not loaded"
    _entries[name] = Entry(model_type, package)
    return None


def forget() -> None:
    """Start over at the next `discover` (tests that install and remove plugins): the plugins' model_types leave
    FAMILIES again."""
    global _discovered
    for name in _entries:
        FAMILIES.pop(name, None)
    _entries.clear()
    _discovered = False
