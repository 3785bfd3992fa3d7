"""Speculative methods by name: parsing `methods=`/`budgets=` and building their drafters.

A method item is `name[@budget][:path]`: `spot@20`, `spiffy@3:graph.json`, `spot_gamma`, `spot@auto`.
Items are joined with `+` (lm-eval splits `--model_args` on commas, so a comma cannot separate list
items). Without `@budget` an item runs at every budget of `budgets=`. Without `:path` the drafter
shipped for the target's block length is used. `auto` sizes every tree by what a verify costs on
the device (spot.sizing), up to `max_budget` nodes.

Every method is lossless (exact acceptance) except the `LOSSY` ones, which are opt-in and never a
default: `sets_max` is SPOT-Sets' drafter under max-commit acceptance (spot.acceptance), whose outputs
differ from the draft-free decoder's by design; the harness reports how often instead of failing.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from spot import DecodeConfig
from spot.drafters import AdversarialDrafter, Drafter, OracleDrafter, RandomDrafter
from spot_eval.checkpoints.shipped import shipped_drafter, shipped_policies
from spot_eval.harness.settings import MAX_BUDGET, as_int

LEARNED = ("spot", "spot_gamma", "spiffy", "sets", "sets_max")
LOSSY = {"sets_max": "max_commit"}  # method -> its lossy acceptance rule (DecodeConfig.acceptance)
AUTO = ("spot", "spot_gamma", "spiffy")  # the drafters that know their reach (budget=auto)
REFERENCE = ("random", "adversarial", "oracle")  # need the draft-free trajectory (oracle, adversarial)
KNOWN = LEARNED + REFERENCE
_ITEM = re.compile(r"^(?P<name>[a-z_]+)(?:@(?P<budget>-?\d+|auto))?(?::(?P<path>.+))?$")


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
    def needs_reference(self) -> bool:
        return self.name in ("oracle", "adversarial")

    @property
    def lossy(self) -> bool:
        """Its outputs differ from the draft-free decoder's by design: report divergences, never fail on them."""
        return self.name in LOSSY

    def config(self, config: DecodeConfig) -> DecodeConfig:
        """The run's decoder config as this method decodes with it: its budget, and its acceptance rule."""
        return replace(config, budget=self.budget, acceptance=LOSSY.get(self.name, "exact"))


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
        match = _ITEM.match(item)
        if match is None or match["name"] not in KNOWN:
            raise ValueError(f"unknown method {item!r}; choose from {', '.join(KNOWN)} as name[@budget][:path]")
        budgets_here = [match["budget"] if match["budget"] == "auto" else int(match["budget"])] if match["budget"] else default_budgets
        if not budgets_here:
            raise ValueError(f"method {item!r} has no budget; write {match['name']}@8 or pass budgets=8+20")
        for budget in budgets_here:
            if budget == "auto":
                if match["name"] not in AUTO:
                    raise ValueError(f"method {item!r}: budget auto needs calibrated reach probabilities, which "
                                     f"{', '.join(AUTO)} have; give {match['name']} a fixed budget ({match['name']}@3)")
                specs.append(MethodSpec(match["name"], max_budget, match["path"], auto=True))
                continue
            if budget < 1:
                raise ValueError(f"method {item!r}: budget must be >= 1, got {budget}")
            specs.append(MethodSpec(match["name"], budget, match["path"]))
    return specs


# What each learned method reads, by the first bytes of the file (torch.save writes a zip archive): its
# kinds, each (magic, what it is, its suffix, the command that makes it).
_ORDER_MODEL = (b"PK", "an order-model checkpoint", ".pt", "train-drafter")
_SETS = ((b"PK", "a set model", ".pt", "train-sets"), (b"{", "a stale set predictor", ".json", "fit-sets"))
_KINDS = {
    "spot": (_ORDER_MODEL,),
    "spot_gamma": (_ORDER_MODEL,),
    "spiffy": ((b"{", "a Spiffy graph", ".json", "spiffy-calibrate"),),
    "sets": _SETS,
    "sets_max": _SETS,
}


def drafter_file(spec: MethodSpec, block_length: int, policy: str) -> Path | None:
    """The file a learned method reads (its own `path`, or the one shipped for `block_length` and `policy`),
    checked to exist and to be of one of the method's kinds before anything loads; None for the reference drafters."""
    if spec.name not in _KINDS:
        return None
    kinds = _KINDS[spec.name]
    path = Path(spec.path) if spec.path else shipped_drafter(spec.name, block_length, policy)
    if path is None or not path.is_file():
        if spec.path:
            raise FileNotFoundError(f"{spec.name} drafter file {path} does not exist")
        raise FileNotFoundError(
            f"no {spec.name} drafter ships for block length {block_length} under policy {policy} (shipped policies: "
            f"{', '.join(shipped_policies(spec.name))}): train one for this target "
            f"(spot-eval collect, then {' or '.join(command for *_, command in kinds)}) and pass it "
            f"(lm_eval: methods={spec.name}:PATH; spot-eval decode: --drafter PATH)"
        )
    if drafter_kind(spec, path) is None:
        wanted = " or ".join(f"{what} ({suffix}, spot-eval {command})" for _, what, suffix, command in kinds)
        raise ValueError(f"{path} is not {wanted}, which method {spec.name} reads; pass such a file or pick the method it belongs to")
    return path


def drafter_kind(spec: MethodSpec, path: Path) -> str | None:
    """The command that makes the file's kind among the method's (None: none of them)."""
    with path.open("rb") as f:
        head = f.read(16)
    for magic, _, _, command in _KINDS[spec.name]:
        if (head.lstrip() if magic == b"{" else head).startswith(magic):
            return command
    return None


def build_drafter(spec: MethodSpec, target, policy: str, reference=None, threshold: float | None = None,
                  rule: dict | None = None) -> Drafter:
    """The drafter for one spec. `reference` is the request's draft-free Generation (record=True),
    needed only by the oracle and the adversary; `threshold` the decoder's (sets checks its predictor's);
    `rule` the decoder's non-default reference rules (DecodeConfig.rule), said once when a trained drafter meets them."""
    if rule and spec.name not in ("random", "oracle", "adversarial"):
        warnings.warn(f"{spec.label}: its drafter was trained on trajectories of the default decoding rule (probability "
                      f"confidence, the mask out of the softmax, no first-token commit); this run decodes under "
                      f"{', '.join(f'{k}={v}' for k, v in rule.items())}. The output is still exactly the draft-free "
                      "decoder's; fewer drafts may be accepted.", UserWarning, stacklevel=2)
    if spec.name == "random":
        return RandomDrafter(target.vocab_size)
    if spec.name == "oracle":
        return OracleDrafter(reference.trajectory)
    if spec.name == "adversarial":
        return AdversarialDrafter(reference.trajectory, target.vocab_size)
    path = drafter_file(spec, target.block_length, policy)
    if spec.name in ("sets", "sets_max"):  # sets_max: the same drafter under max-commit acceptance (MethodSpec.config)
        from spot.drafters.sets import SetsDrafter
        from spot_eval.checkpoints.set_model import set_model_for_target
        from spot_eval.checkpoints.set_predictor import set_predictor_for_target

        learned = drafter_kind(spec, path) == "train-sets"
        return SetsDrafter((set_model_for_target if learned else set_predictor_for_target)(target, policy, threshold, path))
    if spec.name == "spiffy":
        from spot.drafters.spiffy import SpiffyDrafter
        from spot_eval.checkpoints.spiffy_graph import graph_for_target

        # Spiffy's budget is D*, the nodes its online pruning keeps (the whole graph when larger); with
        # auto, the cap: the rule sizes the pruned graph by its calibration counts.
        drafter = SpiffyDrafter(graph_for_target(target, policy, path), prune_to=spec.budget)
        if spec.auto and not drafter.modes:
            raise ValueError(f"{path} holds a hand-made graph without calibration counts, which spiffy@auto sizes by: "
                             "calibrate one (spot-eval spiffy-calibrate) or use a fixed D* (spiffy@3)")
        return drafter
    from spot.drafters.spot import SpotDrafter
    from spot_eval.checkpoints.drafter import load_checkpoint
    from spot_eval.checkpoints.fingerprint import check_fingerprint, target_fingerprint

    checkpoint = load_checkpoint(path)
    check_fingerprint(checkpoint.fingerprint, target_fingerprint(target, policy))
    gamma = None
    if spec.name == "spot_gamma":
        if checkpoint.gamma is None:
            raise ValueError(f"{path} holds no fitted gamma; fit one with spot-eval fit-gamma before using spot_gamma")
        gamma = checkpoint.gamma if isinstance(checkpoint.gamma, (list, tuple)) else [checkpoint.gamma]
    drafter = SpotDrafter(checkpoint.model.to(target.device), gamma=gamma, name=spec.name, reach=checkpoint.reach, stale=checkpoint.stale)
    if spec.auto and not drafter.modes:
        raise ValueError(f"{path} holds no reach calibration, which {spec.label} sizes its trees by: fit one with "
                         f"spot-eval calibrate-reach --drafter {path} --trajectories DIR, or use a fixed budget")
    return drafter
