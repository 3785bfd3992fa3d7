"""`spot-eval train-refresh`: train SPOT-R's refresh head (spot.drafters.refresh) on single-commit trajectories
recorded with hidden states, and write it with the SPOT order model whose trees it refreshes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

from spot.drafters.refresh_training import (
    RefreshTrainConfig,
    block_examples,
    concat,
    heldout_split,
    train_refresh,
)
from spot.drafters.set_model import Projection
from spot.drafters.stale import StaleOrder
from spot_eval.checkpoints.drafter import checkpoint_payload, load_checkpoint
from spot_eval.checkpoints.fingerprint import check_fingerprint
from spot_eval.checkpoints.refresh_head import save_refresh
from spot_eval.training.calibrate_reach import calibrate_refresh
from spot_eval.training.trajectories import read_blocks, read_manifest, read_projections


def train_refresh_command(trajectories: str | Path, order_model: str | Path, out: str | Path, config: RefreshTrainConfig,
                          examples_progress: Callable[[int, int], None] | None = None,
                          progress: Callable[[int, float], None] | None = None, order_temperature: float | None = None,
                          reach_budget: int = 20, max_blocks: int = 200,
                          calibrating: Callable[[int, int], None] | None = None) -> dict:
    """Train on every block of `trajectories` (one collect, its projections) and save to `out` with `order_model`
    (a SPOT checkpoint for the same target and policy), then calibrate it on the held-out requests (spot_eval.
    training.calibrate_reach.calibrate_refresh: SPOT-RC's order temperature, `order_temperature` or the one its
    replayed trees want, and both trees' reach at `reach_budget`, on at most `max_blocks` blocks; `calibrating` its
    progress); returns the metrics."""
    if order_temperature is not None and not order_temperature > 0:
        raise ValueError(f"--order-temperature must be positive, got {order_temperature}; leave it out to fit one")
    if min(reach_budget, max_blocks) < 1:
        raise ValueError(f"--reach-budget ({reach_budget}) and --max-blocks ({max_blocks}) must be >= 1")
    fingerprint = read_manifest(trajectories).fingerprint
    order = load_checkpoint(order_model)
    check_fingerprint(order.fingerprint, fingerprint, what=f"the order model {order_model} was trained",
                      fix="pass the SPOT drafter trained for the trajectories' target (--order-model)")
    projections = read_projections(trajectories)
    blocks = read_blocks(trajectories, policy="single")
    if not blocks:
        raise ValueError(f"{trajectories} holds no recorded blocks to train on; collect more prompts")
    if (recorded := blocks[0].topk_ids.shape[-1]) != order.config.topk:  # a node's stale top-k is the order model's
        raise ValueError(f"{trajectories} records the top {recorded} log-probabilities a position, but the order model "
                         f"{order_model} reads the top {order.config.topk}, which SPOT-R's head refreshes when it drafts: "
                         f"collect with --topk {order.config.topk}, or pass an order model trained on a top {recorded}")
    parts = []
    for i, block in enumerate(blocks):
        if (part := block_examples(block, config.head.max_staleness)) is not None:
            parts.append(part)
        if examples_progress is not None:
            examples_progress(i + 1, len(blocks))
    if not parts:
        raise ValueError(f"{trajectories} holds no hidden states: collect with --hidden-dims 64")
    examples = concat(parts)
    if not heldout_split(examples.request, config.heldout_fraction, config.seed).any():  # before an hour of training
        raise ValueError(f"--heldout {config.heldout_fraction} holds out none of the {len(examples.request.unique())} "
                         f"requests of {trajectories}: raise it, or collect more prompts (SPOT-RC's order temperature and "
                         "both trees' reach are calibrated on the held-out requests)")
    hidden, embedding = (Projection.from_dict(projections[k]) for k in ("hidden", "embedding"))
    head, metrics = train_refresh(examples, projections["token_coords"], config, progress)
    metrics = {**metrics, "parameters": sum(p.numel() for p in head.parameters()), "steps": config.steps,
               "order_model": str(order_model),
               "config": asdict(replace(config, head=head.config))}  # the widths the head was built with, not the defaults
    # the likelihood's temperature until the calibration replaces it with the trees' (or order_temperature)
    save_refresh(out, head, hidden, embedding, fingerprint, metrics, checkpoint_payload(order_model),
                 StaleOrder(metrics["order"]["temperature"]))
    report = calibrate_refresh(out, [trajectories], reach_budget, None, max_blocks, order_temperature=order_temperature,
                               progress=calibrating)
    return {**metrics, "order_temperature": report["order_temperature"], "reach_fit": report}
