"""The built-in methods, one `Method` each: what it reads, how its drafter is built, and how the reports name and
draw it. They reach the harness as a plugin's methods do (spot_eval.registry, where they come first and their names
win); the reports take their row order from this tuple, and the docs their costs.
"""

from __future__ import annotations

from spot.drafters import AdversarialDrafter, Drafter, OracleDrafter, RandomDrafter
from spot_eval.method import Build, FileKind, Method, file_head

ORDER_MODEL = FileKind(b"PK", "an order-model checkpoint", ".pt", "train-drafter")
SET_MODEL = FileKind(b"PK", "a set model", ".pt", "train-sets")
SET_PREDICTOR = FileKind(b"{", "a stale set predictor", ".json", "fit-sets")
SPIFFY_GRAPH = FileKind(b"{", "a Spiffy graph", ".json", "spiffy-calibrate")
REFRESH_HEAD = FileKind(b"PK", "a SPOT-R drafter", ".pt", "train-refresh")


def _freedave(b: Build) -> Drafter:
    from spot.drafters.freedave import FreeDaveDrafter

    return FreeDaveDrafter()


def _freedave_reused(b: Build) -> Drafter:
    from spot.drafters.freedave import FreeDaveDrafter

    return FreeDaveDrafter(name="freedave_reused", reuse_sample=True)


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


def _hybrid(b: Build) -> Drafter:
    from spot.drafters.hybrid import HybridDrafter

    return HybridDrafter(_spot(b))  # calibrated: SPOT's reach beside the chain's rate on the request


def _spot_r(b: Build, name: str = "spot_r", mode: str = "model") -> Drafter:
    from spot.drafters.spot import SpotDrafter
    from spot_eval.checkpoints.refresh_head import refresh_for_target
    from spot_eval.checkpoints.shipped import DRAFTERS

    loaded, tokens = refresh_for_target(b.target, b.policy, b.path)
    # spot_r: every node's order read by the order model from its refreshed distribution (model_depth=1, the root's
    # only, saves drafting time for fewer forwards saved: bench/peers.py); spot_rc: from the refreshed confidences,
    # no model call. With auto, spot_r may pick SPOT-RC's trees per block (as spot@auto picks its stale order's);
    # spot_rc is never offered the model's
    drafter = SpotDrafter(loaded.order.model.to(b.target.device), name=name, tokens=tokens, model_depth=None,
                          stale=loaded.stale, mode=mode, reach=loaded.reach if mode == "model" else None)
    if b.auto and mode not in drafter.modes:
        if b.path.parent == DRAFTERS:  # its collect (whose projections the head reads) does not ship: a new file
            fix = ("train one for budget=auto (spot-eval collect --hidden-dims 64, then train-refresh, which calibrates "
                   "it: docs/methods/spot.md)")
        else:
            fix = (f"fit one with spot-eval calibrate-reach --drafter {b.path} --trajectories DIR (the collect it was "
                   "trained on; --out writes a copy)")
        raise ValueError(f"{b.path} holds no reach calibration of {name}'s trees, which {name}@auto sizes them by: "
                         f"{fix}, or use a fixed budget ({name}@8)")
    return drafter


def _spot_rc(b: Build) -> Drafter:
    return _spot_r(b, "spot_rc", "stale")


def _sets(b: Build) -> Drafter:
    """SPOT-Sets' drafter (sets_max: the same drafter under max-commit acceptance, Method.acceptance)."""
    from spot.drafters.sets import SetsDrafter
    from spot_eval.checkpoints.set_model import set_model_for_target
    from spot_eval.checkpoints.set_predictor import set_predictor_for_target

    learned = SET_MODEL.matches(file_head(b.path))
    return SetsDrafter((set_model_for_target if learned else set_predictor_for_target)(b.target, b.policy, b.threshold, b.path))


def _sets_r(b: Build) -> Drafter:
    """SPOT-RS: SPOT-Sets' tree, each node read from SPOT-R's refreshed distribution by the rule fitted beside it."""
    from spot.drafters.sets import SetsDrafter
    from spot_eval.checkpoints.refresh_head import refreshed_sets_for_target

    return SetsDrafter(refreshed_sets_for_target(b.target, b.policy, b.threshold, b.path), name="sets_r")


# In row order: draft-free first, then the training-free rivals, Spiffy, SPOT's family, the reference drafters.
FAMILIES = (
    Method("draft_free", None, "draft-free", "#999999"),
    Method("freedave", _freedave, "FreeDave", "#56B4E9", cost="nothing: it drafts from the target's last logits"),
    Method("freedave_reused", _freedave_reused, "FreeDave (reused sample)", "#56B4E9", hatch="//",
           cost="nothing: FreeDave's chain under its authors' sampling rule, the last forward's sample at every depth"),
    Method("ssd", _ssd, "SSD", "#56B4E9", hatch="..", cost="nothing: FreeDave's chain under SSD's name"),
    Method("spiffy_v1", _spiffy_v1, "Spiffy v1", "#E69F00", (SPIFFY_GRAPH,), auto=True, hatch="..",
           cost="a calibrated graph (spot-eval spiffy-calibrate)"),
    Method("spiffy", _spiffy, "Spiffy", "#E69F00", (SPIFFY_GRAPH,), auto=True,
           cost="a calibrated graph (spot-eval spiffy-calibrate)"),
    Method("spot", _spot, "SPOT", "#0072B2", (ORDER_MODEL,), auto=True,
           cost="trajectories and a trained order model (spot-eval collect, train-drafter)"),
    Method("spot_gamma", _spot_gamma, "SPOT-γ", "#009E73", (ORDER_MODEL,), auto=True,
           cost="SPOT's, and fitted exponents (spot-eval fit-gamma)"),
    Method("hybrid", _hybrid, "SPOT + FreeDave", "#56B4E9", (ORDER_MODEL,), hatch="xx",
           cost="SPOT's, with its reach calibration (spot-eval calibrate-reach): the FreeDave chain joins its tree"),
    Method("spot_r", _spot_r, "SPOT-R", "#005A8C", (REFRESH_HEAD,), auto=True, hatch="++",
           cost="SPOT's, trajectories with hidden states and a trained refresh head (spot-eval collect --hidden-dims, "
                "train-refresh)"),
    Method("spot_rc", _spot_rc, "SPOT-RC", "#3A9BD9", (REFRESH_HEAD,), auto=True, hatch="--",
           cost="SPOT-R's: its refreshed confidences order each node in place of the order model (no model call)"),
    Method("sets", _sets, "SPOT-Sets", "#CC79A7", (SET_MODEL, SET_PREDICTOR),
           cost="threshold trajectories with hidden states and a trained set model (spot-eval collect, train-sets)"),
    Method("sets_max", _sets, "SPOT-Sets (max-commit)", "#D55E00", (SET_MODEL, SET_PREDICTOR), acceptance="max_commit",
           cost="SPOT-Sets'"),
    Method("sets_r", _sets_r, "SPOT-RS", "#882255", (REFRESH_HEAD,), hatch="++",
           cost="SPOT-R's head, and a rule fitted on threshold trajectories recorded in its projections (spot-eval collect "
                "--projections-from, fit-sets --refresh)"),
    Method("random", lambda b: RandomDrafter(b.target.vocab_size), "random", "#666666",
           reads="the target's last logits (random well-formed trees: a test drafter)"),
    Method("adversarial", lambda b: AdversarialDrafter(b.reference.trajectory, b.target.vocab_size), "adversarial", "#F0E442",
           needs_reference=True, reads="the request's draft-free decode (near misses of it: a test drafter)"),
    Method("oracle", lambda b: OracleDrafter(b.reference.trajectory), "oracle", "#000000", needs_reference=True,
           reads="the request's draft-free decode (its true next states: the perfect-order bound)"),
)
