"""Speculative methods by name: parsing `methods=`/`budgets=` and building their drafters.

A method item is `name[@budget][:path]`: `spot@20`, `spiffy@3:graph.json`, `spot_gamma`. Items are
joined with `+` (lm-eval splits `--model_args` on commas, so a comma cannot separate list items).
Without `@budget` an item runs at every budget of `budgets=`. Without `:path` the drafter shipped
for the target's block length is used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from spot.drafters import AdversarialDrafter, Drafter, OracleDrafter, RandomDrafter
from spot_eval.checkpoints.shipped import shipped_drafter

LEARNED = ("spot", "spot_gamma", "spiffy")
REFERENCE = ("random", "adversarial", "oracle")  # need the draft-free trajectory (oracle, adversarial)
KNOWN = LEARNED + REFERENCE
_ITEM = re.compile(r"^(?P<name>[a-z_]+)(?:@(?P<budget>-?\d+))?(?::(?P<path>.+))?$")


@dataclass(frozen=True)
class MethodSpec:
    name: str
    budget: int
    path: str | None = None

    @property
    def label(self) -> str:
        return f"{self.name}@{self.budget}"

    @property
    def needs_reference(self) -> bool:
        return self.name in ("oracle", "adversarial")


def split_list(value: object) -> list[str]:
    """`a+b`, `a|b`, `a b`, a list or a single value -> ['a', 'b']."""
    if value is None or value == "":
        return []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [v for v in re.split(r"[+| ]", str(value)) if v]


def parse_methods(methods: object, budgets: object) -> list[MethodSpec]:
    """Expand `methods` x `budgets` into specs; every bad item is named with the fix."""
    items = split_list(methods)
    default_budgets = [int(b) for b in split_list(budgets)]
    if default_budgets and not items:
        raise ValueError(f"budgets={budgets} given without a drafter-based method; add methods=spot (or spiffy)")
    specs: list[MethodSpec] = []
    for item in items:
        match = _ITEM.match(item)
        if match is None or match["name"] not in KNOWN:
            raise ValueError(f"unknown method {item!r}; choose from {', '.join(KNOWN)} as name[@budget][:path]")
        budgets_here = [int(match["budget"])] if match["budget"] else default_budgets
        if not budgets_here:
            raise ValueError(f"method {item!r} has no budget; write {match['name']}@8 or pass budgets=8+20")
        for budget in budgets_here:
            if budget < 1:
                raise ValueError(f"method {item!r}: budget must be >= 1, got {budget}")
            path = match["path"]
            if path is not None and not Path(path).exists():
                raise FileNotFoundError(f"method {item!r}: drafter file {path} does not exist")
            specs.append(MethodSpec(match["name"], budget, path))
    return specs


def build_drafter(spec: MethodSpec, target, policy: str, reference=None) -> Drafter:
    """The drafter for one spec. `reference` is the request's draft-free Generation (record=True),
    needed only by the oracle and the adversary."""
    if spec.name == "random":
        return RandomDrafter(target.vocab_size)
    if spec.name == "oracle":
        return OracleDrafter(reference.trajectory)
    if spec.name == "adversarial":
        return AdversarialDrafter(reference.trajectory, target.vocab_size)
    if spec.path and not Path(spec.path).exists():
        raise FileNotFoundError(f"{spec.name} drafter file {spec.path} does not exist")
    path = Path(spec.path) if spec.path else shipped_drafter(spec.name, target.block_length)
    if not path.exists():
        raise FileNotFoundError(
            f"no {spec.name} drafter at {path}: none ships for block length {target.block_length}; "
            f"train one (spot-eval train-drafter / spiffy-calibrate) and pass {spec.name}:PATH"
        )
    if spec.name == "spiffy":
        from spot.drafters.spiffy import SpiffyDrafter
        from spot_eval.checkpoints.spiffy_graph import graph_for_target

        # Spiffy's budget is D*, the nodes its online pruning keeps (the whole graph when larger).
        return SpiffyDrafter(graph_for_target(target, policy, path), prune_to=spec.budget)
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
    return SpotDrafter(checkpoint.model.to(target.device), gamma=gamma, name=spec.name)
