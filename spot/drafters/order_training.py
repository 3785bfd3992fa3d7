"""Train SPOT's order model on recorded draft-free trajectories (pure: returns data, never prints).

The loss is the cross-entropy of the order model's logits over a node's masked positions against
the position the target committed next from that node (`order_examples`), plus an auxiliary loss
[INF]: a second head predicts, for every masked position, its confidence under the logits the
target really decided that step on (a binary cross-entropy against that probability). The label
is the argmax of those confidences, so the auxiliary target says how close every other position
came; K targets per example instead of one label. An example is a
(block, root step s, depth d) triple; the triples are shuffled with the seed and turned into
features one batch at a time, since the features of every example at once (about 4 KiB each)
would not fit in memory for a real collection.

The held-out split is by request: every block of a held-out prompt is held out, so no step of its
trajectory is seen in training (adjacent steps of one block are near duplicates). The held-out
report gives, per depth, the model's next-commit top-1 accuracy and that of the heuristic the
model replaces, "argmax of the stale confidence among the node's masked positions".

Deterministic: the same blocks, config and seed give identical weights on one machine.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields

import torch
import torch.nn.functional as F

from spot.drafters.order_examples import ExampleBatch, RecordedBlock, make_examples, order_example_index
from spot.drafters.order_model import SCALARS, OrderModel, OrderModelConfig, parameter_count


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    steps: int | None = None  # optimizer steps; None: `epochs` passes over the training examples
    epochs: float = 1.0
    batch_size: int = 256
    lr: float = 1e-3
    min_lr_ratio: float = 0.05  # cosine decay after warmup ends at lr * min_lr_ratio
    warmup: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    confidence_weight: float = 1.0  # weight of the auxiliary loss on each position's fresh confidence (0: off)
    max_depth: int = 1  # examples at depths 0 .. max_depth - 1; SpotDrafter's default model_depth=1 only asks depth 0
    heldout_fraction: float = 0.1  # of the requests
    max_seconds: float | None = None  # safety cap: stop early (TrainResult.stopped_early) after this long
    device: str = "cpu"
    log_every: int = 20
    model: OrderModelConfig = field(default_factory=OrderModelConfig)

    def __post_init__(self) -> None:
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if not self.epochs > 0:
            raise ValueError(f"epochs must be > 0, got {self.epochs}")
        if self.batch_size < 1 or self.max_depth < 1:
            raise ValueError(f"batch_size ({self.batch_size}) and max_depth ({self.max_depth}) must be >= 1")
        if self.confidence_weight < 0:
            raise ValueError(f"confidence_weight must be >= 0, got {self.confidence_weight}")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}")


@dataclass(frozen=True)
class Progress:
    step: int
    steps: int
    loss: float  # mean training loss over the last log_every steps
    lr: float
    seconds: float


@dataclass(frozen=True)
class Accuracy:
    """Held-out next-commit top-1 accuracy of one slice of examples."""

    examples: int
    model: float
    heuristic: float  # argmax stale confidence among the node's masked positions


@dataclass(frozen=True)
class Evaluation:
    by_depth: tuple[Accuracy, ...]  # index = depth
    by_temperature: tuple[tuple[float, Accuracy], ...]  # depth 0 only
    loss: float  # mean cross-entropy over every held-out example

    @property
    def depth0(self) -> Accuracy:
        return self.by_depth[0]


@dataclass(frozen=True)
class TrainResult:
    model: OrderModel  # trained, in eval mode, on the CPU
    parameters: int
    steps: int  # optimizer steps taken
    stopped_early: bool  # max_seconds ran out before `steps`
    train_requests: int
    heldout_requests: int
    train_examples: int
    heldout: Evaluation
    curve: tuple[tuple[int, float], ...]  # (step, mean training loss over the last log_every steps)
    seconds: float


def split_by_request(
    blocks: Sequence[RecordedBlock], fraction: float, seed: int
) -> tuple[list[RecordedBlock], list[RecordedBlock]]:
    """(train, held-out) blocks; a seeded `fraction` of the requests (at least one) is held out,
    stratified by temperature: per-request accuracy varies a lot (0.35 to 0.99 on one target), and
    differs between temperatures, so an unlucky temperature mix would move the metric."""
    temperature: dict[int, float] = {}
    for b in blocks:
        temperature[b.request] = min(b.temperature, temperature.get(b.request, b.temperature))
    if len(temperature) < 2:
        raise ValueError(f"a held-out split by request needs >= 2 requests, the trajectories hold {len(temperature)}")
    generator = torch.Generator().manual_seed(seed)
    heldout: set[int] = set()
    for t in sorted(set(temperature.values())):
        requests = sorted(r for r, rt in temperature.items() if rt == t)
        order = torch.randperm(len(requests), generator=generator)
        heldout.update(requests[i] for i in order[: round(fraction * len(requests))].tolist())
    if not heldout:  # too few requests for the fraction: hold out one
        heldout.add(sorted(temperature)[int(torch.randint(len(temperature), (1,), generator=generator))])
    if len(heldout) == len(temperature):
        raise ValueError(f"held-out fraction {fraction} leaves no training request out of {len(temperature)}")
    return [b for b in blocks if b.request not in heldout], [b for b in blocks if b.request in heldout]


def example_triples(blocks: Sequence[RecordedBlock], max_depth: int) -> torch.Tensor:
    """[E, 3] int64 rows (block index, root step s, depth d)."""
    rows = [(i, s, d) for i, block in enumerate(blocks) for s, d in order_example_index(block, max_depth)]
    return torch.tensor(rows, dtype=torch.int64).reshape(-1, 3)


def build_batch(blocks: Sequence[RecordedBlock], triples: torch.Tensor, buckets: int) -> ExampleBatch:
    """The features of `triples` ([B, 3]), grouped by block (so in block order, not row order)."""
    parts = []
    for i in torch.unique(triples[:, 0]).tolist():
        rows = triples[triples[:, 0] == i]
        parts.append(make_examples(blocks[i], [(int(s), int(d)) for _, s, d in rows.tolist()], buckets))
    return ExampleBatch(*(torch.cat([getattr(p, f.name) for p in parts]) for f in fields(ExampleBatch)))


def _check(blocks: Sequence[RecordedBlock], config: OrderModelConfig) -> None:
    shapes = {tuple(b.topk_ids.shape[1:]) for b in blocks}
    if len(shapes) != 1:
        raise ValueError(f"the trajectories mix block lengths / top-k widths {sorted(shapes)}; train one drafter per block length")
    (k, topk), = shapes
    if topk != config.topk or k > config.max_block:
        raise ValueError(
            f"trajectories with block length {k} and top-{topk} do not fit an order model with topk {config.topk} "
            f"and max_block {config.max_block}"
        )


@dataclass(frozen=True)
class Optimized:
    steps: int  # optimizer steps taken
    stopped_early: bool  # max_seconds ran out first
    curve: tuple[tuple[int, float], ...]  # (step, mean logged loss over the last log_every steps)


def optimize(
    model: torch.nn.Module,
    examples: int,
    batch_loss: Callable[[torch.Tensor], tuple[torch.Tensor, float]],
    steps: int,
    config,
    t0: float,
    progress: Callable[[Progress], None] | None = None,
) -> Optimized:
    """AdamW over seeded shuffles of `examples` example indices, `config.batch_size` a step (an epoch's tail
    is dropped), the learning rate by `learning_rate`, gradients clipped; batch_loss(indices [B]) gives the
    loss to minimise and the number to log. config: any training config (the order model's or the set
    model's) with seed, lr, weight_decay, batch_size, grad_clip, max_seconds, log_every and the schedule."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    generator = torch.Generator().manual_seed(config.seed + 1)
    order, cursor = torch.randperm(examples, generator=generator), 0
    curve: list[tuple[int, float]] = []
    window: list[float] = []
    step = 0
    while step < steps:
        if config.max_seconds is not None and time.perf_counter() - t0 > config.max_seconds:
            return Optimized(step, True, tuple(curve))
        if cursor + config.batch_size > len(order):  # a new epoch: reshuffle
            order, cursor = torch.randperm(examples, generator=generator), 0
        index = order[cursor : cursor + config.batch_size]
        cursor += config.batch_size
        lr = learning_rate(step, steps, config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss, logged = batch_loss(index)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        step += 1
        window.append(logged)
        if step % config.log_every == 0 or step == steps:
            curve.append((step, sum(window) / len(window)))
            window = []
            if progress is not None:
                progress(Progress(step, steps, curve[-1][1], lr, time.perf_counter() - t0))
    return Optimized(step, False, tuple(curve))


def learning_rate(step: int, steps: int, config) -> float:
    """Linear warmup, then cosine decay to lr * min_lr_ratio (config: any training config with lr,
    warmup and min_lr_ratio)."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, steps - config.warmup)
    return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def evaluate(model: OrderModel, blocks: Sequence[RecordedBlock], max_depth: int, device: str = "cpu") -> Evaluation:
    """Held-out next-commit top-1 accuracy per depth and at depth 0 per temperature, with the heuristic."""
    model.eval()
    topk = model.config.topk
    hits = torch.zeros(max_depth, 2, dtype=torch.int64)  # [depth, (model, heuristic)]
    counts = torch.zeros(max_depth, dtype=torch.int64)
    by_temperature: dict[float, list[int]] = {}  # temperature -> [examples, model hits, heuristic hits]
    loss_sum = 0.0
    for block in blocks:
        pairs = order_example_index(block, max_depth)
        if not pairs:
            continue
        batch = build_batch([block], torch.tensor([(0, s, d) for s, d in pairs]), model.config.buckets)
        logits = model(batch.feats.to(device), batch.buckets.to(device), batch.candidates.to(device)).cpu()  # [B, K]
        loss_sum += F.cross_entropy(logits, batch.labels, reduction="sum").item()
        confidence = batch.feats[..., topk + SCALARS.index("confidence")]
        right = torch.stack(
            [logits.argmax(-1) == batch.labels, confidence.masked_fill(~batch.candidates, -1.0).argmax(-1) == batch.labels], -1
        ).long()  # [B, 2]
        hits.index_add_(0, batch.depths, right)
        counts += torch.bincount(batch.depths, minlength=max_depth)
        at0 = batch.depths == 0
        slot = by_temperature.setdefault(block.temperature, [0, 0, 0])
        slot[0] += int(at0.sum())
        slot[1] += int(right[at0, 0].sum())
        slot[2] += int(right[at0, 1].sum())

    def accuracy(n: int, model_hits: int, heuristic_hits: int) -> Accuracy:
        return Accuracy(n, model_hits / max(n, 1), heuristic_hits / max(n, 1))

    return Evaluation(
        by_depth=tuple(accuracy(int(counts[d]), int(hits[d, 0]), int(hits[d, 1])) for d in range(max_depth)),
        by_temperature=tuple((t, accuracy(*slot)) for t, slot in sorted(by_temperature.items())),
        loss=loss_sum / max(int(counts.sum()), 1),
    )


def train(
    blocks: Sequence[RecordedBlock], config: TrainConfig = TrainConfig(), progress: Callable[[Progress], None] | None = None
) -> TrainResult:
    """Train an order model on `blocks` (policy `single` trajectories) and evaluate it on held-out requests."""
    t0 = time.perf_counter()
    if not blocks:
        raise ValueError("no recorded blocks to train on")
    _check(blocks, config.model)
    train_blocks, heldout_blocks = split_by_request(blocks, config.heldout_fraction, config.seed)
    triples = example_triples(train_blocks, config.max_depth)  # [E, 3]
    if len(triples) == 0:
        raise ValueError("the training requests yield no examples (every block has < 2 steps)")
    steps = config.steps or math.ceil(config.epochs * len(triples) / config.batch_size)

    with torch.random.fork_rng(devices=[]):  # seeded init without touching the caller's RNG
        torch.manual_seed(config.seed)
        model = OrderModel(config.model)
    model.to(config.device).train()

    def batch_loss(rows: torch.Tensor) -> tuple[torch.Tensor, float]:
        batch = build_batch(train_blocks, rows, config.model.buckets)
        candidates = batch.candidates.to(config.device)
        logits, confidence = model.heads(batch.feats.to(config.device), batch.buckets.to(config.device), candidates)
        order_loss = F.cross_entropy(logits, batch.labels.to(config.device))
        loss = order_loss
        if config.confidence_weight > 0:
            fresh = F.binary_cross_entropy_with_logits(confidence, batch.fresh.to(config.device), reduction="none")  # [B, K]
            loss = order_loss + config.confidence_weight * fresh[candidates].mean()
        return loss, order_loss.item()

    run = optimize(model, len(triples), lambda index: batch_loss(triples[index]), steps, config, t0, progress)
    heldout = evaluate(model, heldout_blocks, config.max_depth, config.device)
    return TrainResult(
        model=model.cpu().eval(),
        parameters=parameter_count(model),
        steps=run.steps,
        stopped_early=run.stopped_early,
        train_requests=len({b.request for b in train_blocks}),
        heldout_requests=len({b.request for b in heldout_blocks}),
        train_examples=len(triples),
        heldout=heldout,
        curve=run.curve,
        seconds=time.perf_counter() - t0,
    )
