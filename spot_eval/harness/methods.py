"""Speculative methods by name: parsing `methods=`/`budgets=` and building their drafters.

A method item is `name[@budget][:path]`: `spot@20`, `spiffy@3:graph.json`, `spot_gamma`, `spot@auto`,
`freedave@8`. Items are joined with `+` (lm-eval splits `--model_args` on commas, so a comma cannot separate
list items). Without `@budget` an item runs at every budget of `budgets=`. Without `:path` a learned method
uses the drafter shipped for the target's block length; a training-free one takes no path. `auto` sizes every
tree by what a verify costs on the device (spot.sizing), up to `max_budget` nodes. The names, and what each
reads and builds, are the registry's (spot_eval.registry: the built-in methods, installed plugins' and those of
the plugin files the run names with `plugins=`).

Every method is lossless (exact acceptance) except the lossy ones (`Family.acceptance`), which are opt-in and
never a default: `sets_max` is SPOT-Sets' drafter under max-commit acceptance (spot.acceptance), whose outputs
differ from the draft-free decoder's by design; the harness reports how often instead of failing.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from spot import DecodeConfig
from spot.drafters import Drafter
from spot_eval import registry
from spot_eval.checkpoints.shipped import shipped_drafter, shipped_policies
from spot_eval.checkpoints.spiffy_graph import load_graph
from spot_eval.families import SPIFFY_GRAPH
from spot_eval.harness.settings import DRAFT_TIMEOUT, MAX_BUDGET, as_int
from spot_eval.harness.watchdog import Watched
from spot_eval.method import Build, Method, PluginError, file_head

_ITEM = re.compile(r"^(?P<name>[a-z_0-9]+?)(?:@(?P<budget>-?\d+|auto))?(?::(?P<path>.+))?$")
_FILE_ITEM = re.compile(r"^(?P<file>[^@:]*(?:\.py|/)[^@:]*):(?P<name>\w+)")  # my_drafter.py:MyDrafter@8, the spelling refused


def auto_methods() -> tuple[str, ...]:
    """The methods whose drafters know their reach (budget=auto)."""
    return tuple(name for name, e in registry.entries().items() if e.method.auto and e.method.build is not None)


@dataclass(frozen=True)
class MethodSpec:
    name: str
    budget: int  # with auto: the cap
    path: str | None = None
    auto: bool = False

    @property
    def label(self) -> str:
        return f"{self.name}@auto" if self.auto else f"{self.name}@{self.budget}"

    @property
    def method(self) -> Method:
        return registry.entry(self.name).method

    @property
    def origin(self) -> registry.Origin:
        return registry.entry(self.name).origin

    @property
    def needs_reference(self) -> bool:
        return self.method.needs_reference

    @property
    def lossy(self) -> bool:
        """Its outputs differ from the draft-free decoder's by design: report divergences, never fail on them."""
        return self.method.lossy

    def config(self, config: DecodeConfig) -> DecodeConfig:
        """The run's decoder config as this method decodes with it: its budget, and its acceptance rule."""
        return replace(config, budget=self.budget, acceptance=self.method.acceptance)


def split_list(value: object) -> list[str]:
    """`a+b`, `a|b`, `a b`, a list or a single value -> ['a', 'b']."""
    if value is None or value == "":
        return []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [v for v in re.split(r"[+| ]", str(value)) if v]


def parse_methods(methods: object, budgets: object, max_budget: int = MAX_BUDGET) -> list[MethodSpec]:
    """Expand `methods` x `budgets` into specs; every bad item is named with the fix."""
    items = split_list(methods)
    default_budgets = [b if b == "auto" else as_int("budgets", b) for b in split_list(budgets)]
    if default_budgets and not items:
        raise ValueError(f"budgets={budgets} given without a drafter-based method; add methods=spot (or spiffy)")
    specs: list[MethodSpec] = []
    for item in items:
        file_item = _FILE_ITEM.match(item)
        if file_item is not None:
            raise ValueError(f"method {item!r}: a plugin file is named apart from its methods: plugins={file_item['file']} "
                             f"and methods=NAME@8, NAME the name its Method declares (spot-eval methods --plugins "
                             f"{file_item['file']} lists them)")
        match = _ITEM.match(item)
        if match is None or match["name"] not in registry.methods():
            raise ValueError(f"unknown method {item!r}; choose from {', '.join(registry.methods())} as name[@budget][:path] "
                             "(a plugin's method: plugins=FILE, or install its package)")
        method = registry.entry(match["name"]).method
        if match["path"] and not method.learned:
            raise ValueError(f"method {item!r}: {match['name']} reads no file (it drafts from the target's own outputs); "
                             f"drop ':{match['path']}'")
        budgets_here = [match["budget"] if match["budget"] == "auto" else int(match["budget"])] if match["budget"] else default_budgets
        if not budgets_here:
            raise ValueError(f"method {item!r} has no budget; write {match['name']}@8 or pass budgets=8+20")
        for budget in budgets_here:
            if budget == "auto":
                if not method.auto:
                    raise ValueError(f"method {item!r}: budget auto needs calibrated reach probabilities, which "
                                     f"{', '.join(auto_methods())} have; give {match['name']} a fixed budget ({match['name']}@3)")
                specs.append(MethodSpec(match["name"], max_budget, match["path"], auto=True))
                continue
            if budget < 1:
                raise ValueError(f"method {item!r}: budget must be >= 1, got {budget}")
            specs.append(MethodSpec(match["name"], budget, match["path"]))
    return specs


def drafter_file(spec: MethodSpec, block_length: int, policy: str) -> Path | None:
    """The file a learned method reads (its own `path`, or the one shipped for `block_length` and `policy`),
    checked to exist and to be of one of the method's kinds before anything loads; None for a method that reads none."""
    kinds = spec.method.files
    if not kinds:
        return None
    path = Path(spec.path) if spec.path else shipped_drafter(spec.name, block_length, policy)
    if path is None or not path.is_file():
        if spec.path:
            raise FileNotFoundError(f"{spec.name} drafter file {path} does not exist")
        raise FileNotFoundError(
            f"no {spec.name} drafter ships for block length {block_length} under policy {policy} (shipped policies: "
            f"{', '.join(shipped_policies(spec.name))}): train one for this target "
            f"(spot-eval collect, then {' or '.join(kind.command for kind in kinds)}) and pass it "
            f"(lm_eval: methods={spec.name}:PATH; spot-eval decode: --drafter PATH)"
        )
    head = file_head(path)
    if not any(kind.matches(head) for kind in kinds):
        wanted = " or ".join(f"{kind.what} ({kind.suffix}, spot-eval {kind.command})" for kind in kinds)
        raise ValueError(f"{path} is not {wanted}, which method {spec.name} reads; pass such a file or pick the method it belongs to")
    if SPIFFY_GRAPH in kinds:  # its block length and policy are in the file: refused before the target loads
        graph = load_graph(path, block_length)
        if graph.policy != policy:
            raise ValueError(f"Spiffy graph {path} was calibrated for policy {graph.policy}, but this run decodes with "
                             f"policy {policy}; calibrate one for it (spot-eval spiffy-calibrate --unmasking {policy}) or "
                             f"pass a graph of {policy}")
    return path


def build_drafter(spec: MethodSpec, target, policy: str, reference=None, threshold: float | None = None,
                  rule: dict | None = None, draft_timeout: float = DRAFT_TIMEOUT) -> Drafter:
    """The drafter for one spec. `reference` is the request's draft-free Generation (record=True),
    needed only by the oracle and the adversary; `threshold` the decoder's (sets checks its predictor's);
    `rule` the decoder's non-default reference rules (DecodeConfig.rule), said once when a learned drafter meets them.
    A plugin's drafter comes under `draft_timeout` seconds per draft (spot_eval.harness.watchdog).

    Raises:
        PluginError: a plugin's build function raised or returned no drafter (naming the plugin; the cause chained).
    """
    path = drafter_file(spec, target.block_length, policy)
    method = spec.method
    if rule and method.learned:
        warnings.warn(f"{spec.label}: its drafter was trained on trajectories of the default "
                      "decoding rule (probability confidence in float64, the mask out of the softmax, no first-token commit, no "
                      "cap); this run "
                      f"decodes under {', '.join(f'{k}={v}' for k, v in rule.items())}. The output is still exactly the "
                      "draft-free decoder's; fewer drafts may be accepted.", UserWarning, stacklevel=2)
    b = Build(target, policy, spec.budget, spec.auto, path, reference, threshold)
    if spec.origin == registry.BUILT_IN:
        return method.build(b)
    try:
        drafter = method.build(b)
    except Exception as err:
        raise PluginError(f"method {spec.label} ({spec.origin}) failed to build its drafter: {type(err).__name__}: {err}") from err
    if not callable(getattr(drafter, "draft", None)):
        raise PluginError(f"method {spec.label} ({spec.origin}): its build returned a {type(drafter).__name__}, which has "
                          "no draft(ctx) method (spot_eval.plugin.Drafter)")
    return Watched(drafter, draft_timeout)
