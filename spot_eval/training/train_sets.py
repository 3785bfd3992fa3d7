"""`spot-eval train-sets`: train SPOT-Sets' set model (spot.drafters.set_model) on threshold trajectories
recorded with hidden states, or calibrate another target's model for this one (`--init-from`).

Calibration keeps the network and continues training it on the new target's trajectories (`--prompts N`:
the first N requests recorded), through the new target's projections (fitted by its `collect`): the
network's inputs keep their meaning (principal coordinates, whitened), only the directions behind them
are the new target's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path

import torch

from spot.drafters.order_training import Progress
from spot.drafters.set_model import Projection
from spot.drafters.set_training import SetTrainConfig, train_set_model
from spot_eval.checkpoints.set_model import load_set_model, save_set_model
from spot_eval.training.fit_sets import threshold_data
from spot_eval.training.trajectories import read_projections


def train_sets_command(
    trajectories: Sequence[str | Path],
    out: str | Path,
    config: SetTrainConfig,
    init_from: str | Path | None = None,
    prompts: int | None = None,
    progress: Callable[[Progress], None] | None = None,
) -> dict:
    data = threshold_data(trajectories)
    projections = [read_projections(d) for d in trajectories]
    for directory, other in zip(trajectories[1:], projections[1:], strict=True):
        if not all(torch.equal(a, b) for a, b in zip(_tensors(projections[0]), _tensors(other), strict=True)):
            raise ValueError(f"{directory} and {trajectories[0]} were projected on different bases (each collect fits its own): "
                             "collect into one directory (a larger --prompts extends it)")
    blocks = data.blocks
    if prompts is not None:
        if prompts < 2:
            raise ValueError(f"--prompts must be >= 2 (one is held out), got {prompts}")
        requests = list(dict.fromkeys(b.request for b in blocks))[:prompts]  # in recorded (plan) order
        if len(requests) < prompts:
            raise ValueError(f"--prompts {prompts} asks for more requests than the trajectories hold ({len(requests)})")
        kept = set(requests)
        blocks = [b for b in blocks if b.request in kept]
    if not blocks:
        raise ValueError(f"{trajectories[0]} holds no recorded blocks to train on; collect more prompts")
    init = None
    if init_from is not None:
        loaded = load_set_model(init_from)
        if loaded.threshold != data.threshold:
            raise ValueError(f"{init_from} was trained at threshold {loaded.threshold}, the trajectories at {data.threshold}")
        init = loaded.model
    hidden, embedding = (Projection.from_dict(projections[0][k]) for k in ("hidden", "embedding"))
    # the network's input widths are the recorded data's (a calibrated network keeps its own, checked in training)
    widths = {"topk": blocks[0].topk_ids.shape[-1], "hidden_dims": hidden.dims, "embedding_dims": embedding.dims}
    config = replace(config, threshold=data.threshold, model=replace(config.model, **widths))
    result = train_set_model(blocks, projections[0]["token_coords"], config, init=init, progress=progress)
    metrics = {
        "parameters": result.parameters, "steps": result.steps, "stopped_early": result.stopped_early,
        "train_requests": result.train_requests, "heldout_requests": result.heldout_requests,
        "train_examples": result.train_examples, "seconds": round(result.seconds, 1),
        "init_from": None if init_from is None else str(init_from),
        "heldout": asdict(result.heldout),
    }
    save_set_model(out, result.model, hidden, embedding, data.fingerprint, data.threshold, metrics)
    return metrics


def _tensors(projections: dict) -> list[torch.Tensor]:
    return [projections["hidden"]["mean"], projections["hidden"]["basis"], projections["embedding"]["mean"],
            projections["embedding"]["basis"], projections["token_coords"]]
