"""`spot-eval calibrate-reach`: fit the calibrations that budget=auto sizes SPOT's trees by, on
held-out trajectories, and store them in the drafter checkpoint: the reach of the order model's
trees (spot/drafters/reach.py has the definition), and the stale-confidence order's temperature
with the reach of its trees (spot/drafters/stale.py), the cheap mode for small trees. A SPOT-R
file gets the same two: its own trees' reach, and SPOT-RC's order temperature (chosen by its
replayed trees) with theirs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path

import torch

from spot.drafters.reach import ReachCalibration, ReplayedTree, fit_reach, replay, with_table
from spot.drafters.refresh_training import RefreshTrainConfig, heldout_split
from spot.drafters.spot import SpotDrafter
from spot.drafters.stale import TREE_TEMPERATURES, StaleOrder, fit_by_trees, fit_temperature
from spot_eval.checkpoints.drafter import load_checkpoint, save_checkpoint
from spot_eval.checkpoints.fingerprint import fingerprint_mismatch
from spot_eval.checkpoints.refresh_head import FORMAT as REFRESH_FORMAT
from spot_eval.checkpoints.refresh_head import load_refresh, recorded_tokens, save_orders
from spot_eval.training.fit_gamma import heldout_blocks
from spot_eval.training.trajectories import read_blocks, read_manifest, read_projections

REFRESH_KIND = REFRESH_FORMAT.rsplit("/", 1)[0] + "/"  # a SPOT-R file's format, any version
ORDER_BUDGET = 8  # the tree size SPOT-RC's order temperature is chosen at: the comparison's headline budget


def calibrate_reach_command(
    drafter: str | Path,
    trajectories: Sequence[str | Path],
    budget: int,
    out: str | Path | None,
    max_blocks: int,
    all_blocks: bool = False,
    progress: Callable[[int, int], None] | None = None,
    order_temperature: float | None = None,
) -> dict:
    """Replay plain SPOT's walk at `budget` over the requests the drafter's training held out, in both
    modes, fit, store; returns what was stored and the calibration tables (of a fit on half the
    trees, measured on the other half). SPOT-gamma reuses them: the calibrated score is the path's
    log-score without gamma. all_blocks: every block of `trajectories`, which were collected apart
    from the drafter's training data. A SPOT-R file: calibrate_refresh (`order_temperature`, `progress` its own)."""
    if max_blocks < 1:
        raise ValueError(f"--max-blocks must be >= 1, got {max_blocks}")
    if _is_refresh(drafter):
        if all_blocks:  # its head reads the projections of the one collect it was trained on: no other blocks exist
            raise ValueError(f"{drafter} is a SPOT-R file, calibrated on the requests its training held out of the one "
                             "collect it was trained on (another collect's projections differ); drop --all-blocks")
        return calibrate_refresh(drafter, trajectories, budget, out, max_blocks, order_temperature=order_temperature,
                                 progress=progress)
    if order_temperature is not None:
        raise ValueError(f"--order-temperature is SPOT-RC's, set in a SPOT-R file; {drafter} is a SPOT checkpoint, whose "
                         "stale order's temperature is fitted (drop --order-temperature)")
    checkpoint = load_checkpoint(drafter)
    heldout = heldout_blocks(checkpoint, trajectories, all_blocks)[:max_blocks]
    stale_fit = fit_temperature(heldout)
    spot = SpotDrafter(checkpoint.model, stale=StaleOrder(stale_fit.temperature))
    reach, model_report = _fit(list(replay(spot.grow, heldout, budget)))
    stale_reach, stale_report = _fit(list(replay(spot.grow, heldout, budget, mode="stale")))
    stale = StaleOrder(stale_fit.temperature, stale_reach)
    report = {"budget": budget, "heldout_blocks": len(heldout), **model_report,
              "stale": {**asdict(stale_fit), **stale_report}}
    save_checkpoint(out or drafter, checkpoint.model, checkpoint.fingerprint,
                    {**checkpoint.metrics, "reach_fit": report}, gamma=checkpoint.gamma, reach=reach, stale=stale)
    return report


def calibrate_refresh(
    drafter: str | Path,
    trajectories: Sequence[str | Path],
    budget: int,
    out: str | Path | None,
    max_blocks: int,
    order_temperature: float | None = None,
    order_budget: int = ORDER_BUDGET,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """A SPOT-R file's calibrations, replayed over the requests its head's training held out of the trajectories it
    was trained on (their projections are the head's; the held-out requests as train-refresh recorded them, or for a
    file from before it recorded them, its split redrawn): SPOT-RC's order temperature
    (`order_temperature`, or the one whose trees commit the most per verify forward at `order_budget`,
    spot.drafters.stale.fit_by_trees), then at `budget` the reach of SPOT-R's trees and of SPOT-RC's; stored in
    the file (or a copy at `out`). Returns what was stored. progress(done, total): blocks replayed, of all replays."""
    loaded = load_refresh(drafter)
    if len(trajectories) != 1:
        raise ValueError(f"a SPOT-R file is calibrated on the one trajectory directory it was trained on, got "
                         f"{len(trajectories)}: pass only the directory given to train-refresh --trajectories")
    directory = trajectories[0]
    differences = fingerprint_mismatch(loaded.fingerprint, read_manifest(directory).fingerprint)
    if differences:
        raise ValueError(f"{directory} was recorded for another target than {drafter}: {'; '.join(differences)}; pass "
                         "the collect it was trained on")
    tokens = recorded_tokens(loaded, read_projections(directory), str(directory))
    blocks = [b for b in read_blocks(directory, policy="single") if b.hidden is not None]
    if not blocks:
        raise ValueError(f"{directory} holds no blocks with hidden states: pass the collect {drafter} was trained on")
    if "heldout_requests" in loaded.metrics:
        held = set(loaded.metrics["heldout_requests"])
        blocks = [b for b in blocks if b.request in held]
    else:  # a file from before train-refresh recorded them (or its settings): the default split, redrawn, the same
        # while the collect is
        split = RefreshTrainConfig()
        held = heldout_split(torch.tensor([b.request for b in blocks]), split.heldout_fraction, split.seed)
        blocks = [b for b, h in zip(blocks, held.tolist(), strict=True) if h]
    blocks = blocks[:max_blocks]
    if not blocks:
        raise ValueError(f"{directory} holds none of the requests {drafter}'s training held out: pass the collect it "
                         "was trained on, or train it again with a larger --heldout")

    def spot_r(stale: StaleOrder) -> SpotDrafter:  # SPOT-R's drafter as families._spot_r builds it, reading recorded inputs
        return SpotDrafter(loaded.order.model, tokens=tokens, model_depth=None, stale=stale)

    total, done = len(blocks) * (2 + (len(TREE_TEMPERATURES) if order_temperature is None else 0)), 0

    def replayed() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    report: dict = {"budget": budget, "heldout_blocks": len(blocks)}
    if order_temperature is None:
        tree_fit = fit_by_trees(lambda t: spot_r(StaleOrder(t)).grow, blocks, order_budget, progress=replayed)
        order_temperature = tree_fit.temperature
        report["order_fit"] = {"budget": order_budget, "commits_per_forward": tree_fit.commits_per_forward,
                               "grid": [list(row) for row in tree_fit.grid]}
    calibrated = spot_r(StaleOrder(order_temperature))
    trees = {}
    for mode in ("model", "stale"):
        trees[mode] = []
        for block in blocks:
            trees[mode] += replay(calibrated.grow, [block], budget, mode=mode)
            replayed()
    reach, report["spot_r"] = _fit(trees["model"])
    stale_reach, report["spot_rc"] = _fit(trees["stale"])
    stale = StaleOrder(order_temperature, stale_reach)
    report["order_temperature"] = order_temperature
    save_orders(drafter, out or drafter, stale, reach, {**loaded.metrics, "order_temperature": order_temperature,
                                                         "reach_fit": report}, loaded.sha256)
    return report


def _is_refresh(path: str | Path) -> bool:
    """Whether `path` is a SPOT-R file (a drafter checkpoint's loader names any other)."""
    try:
        raw = torch.load(path, weights_only=True, map_location="cpu")
    except Exception:  # noqa: BLE001  (the SPOT loader reports a damaged file)
        return False
    return isinstance(raw, dict) and str(raw.get("format", "")).startswith(REFRESH_KIND)  # retired versions: load_refresh says


def _fit(replayed: list[ReplayedTree | None]) -> tuple[ReachCalibration, dict]:
    """The calibration fitted on every tree, with the error table of a fit on every other tree measured
    on the rest; and its report."""
    trees = [t for t in replayed if t is not None]
    table = with_table(fit_reach(trees[::2]), trees[1::2])
    fit = replace(fit_reach(trees), bins=table.bins, error=table.error)
    forwards = len(replayed)
    return fit, {
        "trees": len(trees),
        "nodes": sum(len(t.scores) for t in trees),
        "commits_per_forward": (forwards - len(trees) + sum(t.steps for t in trees)) / max(forwards, 1),
        "knots": [len(m.scores) for m in fit.maps],
        "calibration_error": fit.error,
        "mean_reach": list(fit.mean_reach[:8]),
        "bins": [asdict(b) for b in fit.bins],
    }
