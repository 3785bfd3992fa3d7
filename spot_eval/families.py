"""Every method family, one entry each: what it reads, how its drafter is built, and how the reports name and
draw it. The harness parses `methods=` against these (spot_eval.harness.methods), the reports take their names,
colours and row order from them, and the docs their costs; a new method is one drafter under spot/drafters/
and one entry in FAMILIES.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from spot.drafters import AdversarialDrafter, Drafter, OracleDrafter, RandomDrafter


@dataclass(frozen=True)
class FileKind:
    """One kind of file a learned method reads, told by its first bytes (torch.save writes a zip archive)."""

    magic: bytes
    what: str
    suffix: str
    command: str  # the spot-eval command that makes it

    def matches(self, head: bytes) -> bool:
        """Whether `head` (a file's first bytes, `file_head`) starts a file of this kind."""
        return (head.lstrip() if self.magic == b"{" else head).startswith(self.magic)


def file_head(path: Path) -> bytes:
    """The first bytes of a file, enough for `FileKind.matches` (a drafter file may be tens of MB)."""
    with path.open("rb") as f:
        return f.read(16)


@dataclass(frozen=True)
class Build:
    """What a drafter is built from: the loaded target, the run's policy and threshold, the method's budget (with
    budget=auto its cap) and file, and the request's draft-free Generation for the reference drafters."""

    target: object
    policy: str
    budget: int
    auto: bool
    path: Path | None
    reference: object = None
    threshold: float | None = None


@dataclass(frozen=True)
class Family:
    """name: as in `methods=name@N`. display: in tables and legends. colour: its bars and lines (Okabe-Ito, one per
    family). files: what it reads (none: training-free). auto: its trees carry calibrated reach, so budget=auto can
    size them. acceptance: "max_commit" for a lossy, opt-in method. cost: what a new target costs it (the docs)."""

    name: str
    display: str
    colour: str
    build: Callable[[Build], Drafter] | None
    files: tuple[FileKind, ...] = ()
    auto: bool = False
    acceptance: str = "exact"
    needs_reference: bool = False
    hatch: str = ""
    cost: str = ""

    @property
    def lossy(self) -> bool:
        return self.acceptance != "exact"

    @property
    def learned(self) -> bool:
        return bool(self.files)


ORDER_MODEL = FileKind(b"PK", "an order-model checkpoint", ".pt", "train-drafter")
SET_MODEL = FileKind(b"PK", "a set model", ".pt", "train-sets")
SET_PREDICTOR = FileKind(b"{", "a stale set predictor", ".json", "fit-sets")
SPIFFY_GRAPH = FileKind(b"{", "a Spiffy graph", ".json", "spiffy-calibrate")


def _freedave(b: Build) -> Drafter:
    from spot.drafters.freedave import FreeDaveDrafter

    return FreeDaveDrafter()


def _ssd(b: Build) -> Drafter:
    from spot.drafters.freedave import FreeDaveDrafter

    return FreeDaveDrafter(name="ssd")


def _spiffy(b: Build, order: str = "score") -> Drafter:
    from spot.drafters.spiffy import SpiffyDrafter
    from spot_eval.checkpoints.spiffy_graph import graph_for_target

    # v4's budget is D*, the nodes its online pruning keeps (the whole graph when larger); v1's the first nodes of
    # the calibrated graph. With auto, the cap: the rule sizes the pruned graph by its calibration counts.
    drafter = SpiffyDrafter(graph_for_target(b.target, b.policy, b.path), prune_to=b.budget, order=order)
    if b.auto and not drafter.modes:
        raise ValueError(f"{b.path} holds a hand-made graph without calibration counts, which spiffy@auto sizes by: "
                         "calibrate one (spot-eval spiffy-calibrate) or use a fixed D* (spiffy@3)")
    return drafter


def _spiffy_v1(b: Build) -> Drafter:
    return _spiffy(b, order="calibration")


def _spot(b: Build, name: str = "spot") -> Drafter:
    from spot.drafters.spot import SpotDrafter
    from spot_eval.checkpoints.drafter import load_checkpoint
    from spot_eval.checkpoints.fingerprint import check_fingerprint, target_fingerprint

    checkpoint = load_checkpoint(b.path)
    check_fingerprint(checkpoint.fingerprint, target_fingerprint(b.target, b.policy))
    gamma = None
    if name == "spot_gamma":
        if checkpoint.gamma is None:
            raise ValueError(f"{b.path} holds no fitted gamma; fit one with spot-eval fit-gamma before using spot_gamma")
        gamma = checkpoint.gamma if isinstance(checkpoint.gamma, (list, tuple)) else [checkpoint.gamma]
    drafter = SpotDrafter(checkpoint.model.to(b.target.device), gamma=gamma, name=name, reach=checkpoint.reach,
                          stale=checkpoint.stale)
    if b.auto and not drafter.modes:
        raise ValueError(f"{b.path} holds no reach calibration, which {name}@auto sizes its trees by: fit one with "
                         f"spot-eval calibrate-reach --drafter {b.path} --trajectories DIR, or use a fixed budget")
    return drafter


def _spot_gamma(b: Build) -> Drafter:
    return _spot(b, "spot_gamma")


def _sets(b: Build) -> Drafter:
    """SPOT-Sets' drafter (sets_max: the same drafter under max-commit acceptance, Family.acceptance)."""
    from spot.drafters.sets import SetsDrafter
    from spot_eval.checkpoints.set_model import set_model_for_target
    from spot_eval.checkpoints.set_predictor import set_predictor_for_target

    learned = SET_MODEL.matches(file_head(b.path))
    return SetsDrafter((set_model_for_target if learned else set_predictor_for_target)(b.target, b.policy, b.threshold, b.path))


# In row order: draft-free first, then the training-free rivals, Spiffy, SPOT's family, the reference drafters.
FAMILIES = (
    Family("draft_free", "draft-free", "#999999", None),
    Family("freedave", "FreeDave", "#56B4E9", _freedave, cost="nothing: it drafts from the target's last logits"),
    Family("ssd", "SSD", "#56B4E9", _ssd, hatch="..", cost="nothing: FreeDave's chain under SSD's name"),
    Family("spiffy_v1", "Spiffy v1", "#E69F00", _spiffy_v1, (SPIFFY_GRAPH,), auto=True, hatch="..",
           cost="a calibrated graph (spot-eval spiffy-calibrate)"),
    Family("spiffy", "Spiffy", "#E69F00", _spiffy, (SPIFFY_GRAPH,), auto=True,
           cost="a calibrated graph (spot-eval spiffy-calibrate)"),
    Family("spot", "SPOT", "#0072B2", _spot, (ORDER_MODEL,), auto=True,
           cost="trajectories and a trained order model (spot-eval collect, train-drafter)"),
    Family("spot_gamma", "SPOT-γ", "#009E73", _spot_gamma, (ORDER_MODEL,), auto=True,
           cost="SPOT's, and fitted exponents (spot-eval fit-gamma)"),
    Family("sets", "SPOT-Sets", "#CC79A7", _sets, (SET_MODEL, SET_PREDICTOR),
           cost="threshold trajectories with hidden states and a trained set model (spot-eval collect, train-sets)"),
    Family("sets_max", "SPOT-Sets (max-commit)", "#D55E00", _sets, (SET_MODEL, SET_PREDICTOR), acceptance="max_commit",
           cost="SPOT-Sets'"),
    Family("random", "random", "#666666", lambda b: RandomDrafter(b.target.vocab_size)),
    Family("adversarial", "adversarial", "#F0E442", lambda b: AdversarialDrafter(b.reference.trajectory, b.target.vocab_size),
           needs_reference=True),
    Family("oracle", "oracle", "#000000", lambda b: OracleDrafter(b.reference.trajectory), needs_reference=True),
)
BY_NAME = {f.name: f for f in FAMILIES}
METHODS = tuple(f.name for f in FAMILIES if f.build is not None)  # what `methods=` may name


def build_drafter(name: str, b: Build, rule: dict | None = None) -> Drafter:
    """The drafter of one method; `rule`: the decoder's non-default reference rules (DecodeConfig.rule), said once when
    a learned drafter meets them."""
    f = BY_NAME[name]
    if rule and f.learned:
        warnings.warn(f"{name}@{'auto' if b.auto else b.budget}: its drafter was trained on trajectories of the default "
                      "decoding rule (probability confidence in float64, the mask out of the softmax, no first-token commit, no "
                      "cap); this run "
                      f"decodes under {', '.join(f'{k}={v}' for k, v in rule.items())}. The output is still exactly the "
                      "draft-free decoder's; fewer drafts may be accepted.", UserWarning, stacklevel=3)
    return f.build(b)
