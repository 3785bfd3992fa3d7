"""Train SPOT-Sets' set model on recorded threshold trajectories (pure: returns data, never prints).

An example is a (block, root step s >= 1, depth d) triple, as for the order model
(spot.drafters.order_examples): the stale distribution and hidden states are those behind step s - 1,
the node is the true state of step s + d, scored under that step's noise, and the labels are what
step s + d did [INF: the losses are this project's design]:
    inclusion: the set it committed, a binary cross-entropy over the node's masked positions;
    tokens: at every masked position, the fresh distribution the step was decided on, restricted to the
        stale top-k slots (a slot whose token left the fresh top-k counts at the fresh k-th
        log-probability, an upper bound), a soft cross-entropy against the token scores.
The held-out split is by request (order_training.split_by_request). The held-out report gives per
depth the exact-set rate and per-position F1 of the model's most probable non-empty set (a node's
first child), the rate at which that child is the target's next state exactly (set and tokens: the
first child accepted), and the same for the heuristic baseline ({c >= tau} and the most confident
position, with the stale draws); and the token accuracy at the committed positions, model and stale.

Deterministic: the same blocks, config and seed give identical weights on one machine.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields

import torch
import torch.nn.functional as F

from spot.drafters.order_examples import RecordedBlock, example_index
from spot.drafters.order_model import parameter_count, predict, step_noise_at_topk
from spot.drafters.order_training import Progress, optimize, split_by_request
from spot.drafters.set_model import SetInputs, SetModel, SetModelConfig, draw_tokens, set_inputs
from spot.drafters.sets import leader


@dataclass(frozen=True)
class SetTrainConfig:
    threshold: float = 0.9
    seed: int = 0
    steps: int | None = None  # optimizer steps; None: `epochs` passes over the training examples
    epochs: float = 1.0
    batch_size: int = 128
    lr: float = 5e-4
    min_lr_ratio: float = 0.05  # cosine decay after warmup ends at lr * min_lr_ratio
    warmup: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    token_weight: float = 1.0  # weight of the token loss beside the inclusion loss
    # weight of a softmax cross-entropy over the masked positions' inclusion logits on the steps that commit one
    # position: the order model's loss, which ranks the logits (the product rule's best singleton is their argmax);
    # on by default, as the shipped model was trained (0 turns it off)
    position_weight: float = 1.0
    max_depth: int = 4  # examples at depths 0 .. max_depth - 1 (a sets tree scores every level with the model)
    heldout_fraction: float = 0.1  # of the requests
    max_seconds: float | None = None  # safety cap: stop early (SetTrainResult.stopped_early) after this long
    device: str = "cpu"
    log_every: int = 20
    model: SetModelConfig = field(default_factory=SetModelConfig)

    def __post_init__(self) -> None:
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if not self.epochs > 0 or self.batch_size < 1 or self.max_depth < 1:
            raise ValueError(f"epochs ({self.epochs}) must be > 0, batch_size ({self.batch_size}) and max_depth ({self.max_depth}) >= 1")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.position_weight < 0:
            raise ValueError(f"position_weight must be >= 0, got {self.position_weight}")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}")


@dataclass(frozen=True)
class SetBatch:
    """inputs (SetInputs); lp [B, K, k] the stale top-k; masked, chosen [B, K] bool (the node's masked
    positions, the set its step committed); fresh [B, K, k] the soft token targets; committed [B, K] the
    token each committed position got (-1 elsewhere); stale_tokens [B, K] the stale draws; noise
    [B, K, k] (None at T = 0); temperature [B]; depths [B]; conf [B, K] the stale draws' confidences."""

    inputs: SetInputs
    lp: torch.Tensor
    ids: torch.Tensor
    masked: torch.Tensor
    chosen: torch.Tensor
    fresh: torch.Tensor
    committed: torch.Tensor
    stale_tokens: torch.Tensor
    noise: torch.Tensor
    temperature: torch.Tensor
    depths: torch.Tensor
    conf: torch.Tensor


def make_set_examples(block: RecordedBlock, pairs: list[tuple[int, int]], config: SetModelConfig,
                      token_coords: torch.Tensor) -> SetBatch:
    if block.hidden is None:
        raise ValueError("these trajectories hold no hidden states: collect them with --hidden-dims R for a set model")
    s = torch.tensor([p[0] for p in pairs])
    d = torch.tensor([p[1] for p in pairs])
    lp, ids = block.topk_logprobs[s - 1].float(), block.topk_ids[s - 1].long()  # [B, K, k]
    # the node step's noise at the stale ids, zero at T = 0 (where the ranking ignores it)
    noise = (step_noise_at_topk(block.seed, block.request, block.block, (s + d).tolist(), ids) if block.temperature > 0
             else torch.zeros(ids.shape, dtype=torch.float64))
    prediction = predict(lp, ids, block.temperature, noise if block.temperature > 0 else None)
    states = block.states
    root_masked = states[s] == block.mask_id
    node, after = states[s + d], states[s + d + 1]  # [B, K]
    masked = node == block.mask_id
    chosen = masked & (after != block.mask_id)
    last = (states[s + d - 1] == block.mask_id) & ~masked
    inputs = set_inputs(config, lp, ids, prediction, masked, root_masked & ~masked, last, block.prior(s), token_coords,
                        block.hidden[s - 1].float())
    fresh_lp, fresh_ids = block.topk_logprobs[s + d].float(), block.topk_ids[s + d].long()  # [B, K, k]
    match = ids[..., :, None] == fresh_ids[..., None, :]  # [B, K, k (stale), k (fresh)]
    at_slots = torch.where(match.any(-1), (fresh_lp[..., None, :] * match).sum(-1), fresh_lp[..., -1:])  # [B, K, k]
    return SetBatch(
        inputs=inputs, lp=lp, ids=ids, masked=masked, chosen=chosen, fresh=torch.softmax(at_slots, -1),
        committed=torch.where(chosen, after, -1), stale_tokens=prediction.tokens[..., 0], noise=noise,
        temperature=torch.full((len(pairs),), block.temperature), depths=d, conf=prediction.probs[..., 0].double(),
    )


def build_set_batch(blocks: Sequence[RecordedBlock], triples: torch.Tensor, config: SetModelConfig,
                    token_coords: torch.Tensor) -> SetBatch:
    """The examples of `triples` ([B, 3] rows (block index, s, d)), grouped by block."""
    parts = []
    for i in torch.unique(triples[:, 0]).tolist():
        rows = triples[triples[:, 0] == i]
        parts.append(make_set_examples(blocks[i], [(int(s), int(d)) for _, s, d in rows.tolist()], config, token_coords))
    cat = {f.name: torch.cat([getattr(p, f.name) for p in parts]) for f in fields(SetBatch) if f.name != "inputs"}
    inputs = SetInputs(torch.cat([p.inputs.feats for p in parts]), torch.cat([p.inputs.buckets for p in parts]))
    return SetBatch(inputs=inputs, **cat)


def model_tokens(scores: torch.Tensor, batch: SetBatch) -> torch.Tensor:
    """[B, K] the tokens the model's scores draw: Gumbel-max under the node step's noise (T > 0) or argmax."""
    return draw_tokens(scores, batch.ids.to(scores.device), batch.temperature.to(scores.device)[:, None, None],
                       batch.noise.to(scores.device))


def losses(model: SetModel, batch: SetBatch, device: str, position_weight: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(inclusion loss, token loss, inclusion logits [B, K], token scores [B, K, k]); the inclusion loss adds
    `position_weight` times the position cross-entropy of SetTrainConfig.position_weight."""
    inputs = SetInputs(batch.inputs.feats.to(device), batch.inputs.buckets.to(device))
    inclusion, scores = model(inputs, batch.lp.to(device))
    masked, chosen = batch.masked.to(device), batch.chosen.to(device)
    set_loss = F.binary_cross_entropy_with_logits(inclusion[masked], chosen[masked].float())
    single = chosen.sum(-1) == 1  # [B]
    if position_weight and bool(single.any()):
        logits = inclusion[single].masked_fill(~masked[single], float("-inf"))  # [S, K]
        set_loss = set_loss + position_weight * F.cross_entropy(logits, chosen[single].float().argmax(-1))
    token_loss = -(batch.fresh.to(device) * torch.log_softmax(scores, -1)).sum(-1)[masked].mean()
    return set_loss, token_loss, inclusion, scores


@dataclass(frozen=True)
class SetAccuracy:
    """Held-out rates of one depth over `examples` nodes (see the module docstring); `baseline_*` for
    the heuristic."""

    examples: int
    exact_set: float
    f1: float
    exact_step: float
    token: float
    baseline_exact_set: float
    baseline_f1: float
    baseline_exact_step: float
    baseline_token: float


@dataclass(frozen=True)
class SetEvaluation:
    by_depth: tuple[SetAccuracy, ...]
    set_loss: float
    token_loss: float


@dataclass(frozen=True)
class SetTrainResult:
    model: SetModel  # trained, in eval mode, on the CPU
    parameters: int
    steps: int
    stopped_early: bool
    train_requests: int
    heldout_requests: int
    train_examples: int
    heldout: SetEvaluation
    curve: tuple[tuple[int, float], ...]  # (step, mean training loss over the last log_every steps)
    seconds: float


def _triples(blocks: Sequence[RecordedBlock], max_depth: int) -> torch.Tensor:
    """[E, 3] rows (block index, s, d) whose node has a next step (s + d < S)."""
    rows = [(i, s, d) for i, block in enumerate(blocks) for s, d in example_index(block, max_depth)]
    return torch.tensor(rows, dtype=torch.int64).reshape(-1, 3)


@torch.no_grad()
def evaluate_set_model(model: SetModel, blocks: Sequence[RecordedBlock], token_coords: torch.Tensor, threshold: float,
                       max_depth: int, device: str = "cpu") -> SetEvaluation:
    model.eval()
    # per depth and guesser (model, baseline): examples, exact sets, exact steps, hits, guessed and chosen positions,
    # right tokens at the committed positions
    counts = torch.zeros(max_depth, 2, 7, dtype=torch.float64)
    loss_sums = [0.0, 0.0, 0]
    for block in blocks:
        pairs = example_index(block, max_depth)
        if not pairs:
            continue
        batch = build_set_batch([block], torch.tensor([(0, s, d) for s, d in pairs]), model.config, token_coords)
        set_loss, token_loss, z, scores = losses(model, batch, device)
        loss_sums[0] += float(set_loss) * len(pairs)
        loss_sums[1] += float(token_loss) * len(pairs)
        loss_sums[2] += len(pairs)
        z, tokens = z.cpu(), model_tokens(scores, batch).cpu()
        masked, chosen = batch.masked, batch.chosen
        guess = masked & (z > 0)  # the most probable set; where empty, the likeliest position alone
        guess |= ~guess.any(-1, keepdim=True) & leader(z, masked)
        base = masked & ((batch.conf >= threshold) | leader(batch.conf, masked))
        for column, (g, t) in enumerate(((guess, tokens), (base, batch.stale_tokens))):
            exact_set = g.eq(chosen).all(-1)
            right = (t == batch.committed) & chosen  # [B, K]
            row = torch.stack([torch.ones(len(pairs)), exact_set, exact_set & (right == chosen).all(-1), (g & chosen).sum(-1),
                               g.sum(-1), chosen.sum(-1), right.sum(-1)], -1).double()  # [B, 7]
            counts[:, column].index_add_(0, batch.depths, row)
    by_depth = []
    for d in range(max_depth):
        rates = []
        for c in counts[d].tolist():
            n = c[0] or math.nan
            rates.append((c[1] / n, 2 * c[3] / ((c[4] + c[5]) or math.nan), c[2] / n, c[6] / (c[5] or math.nan)))
        (m_set, m_f1, m_step, m_token), (b_set, b_f1, b_step, b_token) = rates
        by_depth.append(SetAccuracy(int(counts[d, 0, 0]), m_set, m_f1, m_step, m_token, b_set, b_f1, b_step, b_token))
    total = max(loss_sums[2], 1)
    return SetEvaluation(tuple(by_depth), loss_sums[0] / total, loss_sums[1] / total)


def train_set_model(
    blocks: Sequence[RecordedBlock],
    token_coords: torch.Tensor,
    config: SetTrainConfig = SetTrainConfig(),
    init: SetModel | None = None,
    progress: Callable[[Progress], None] | None = None,
) -> SetTrainResult:
    """Train a set model on threshold-trajectory `blocks` (recorded with hidden states) and evaluate it on
    held-out requests. token_coords: [V, R_e] the projected token embeddings of the blocks' target. With
    `init` (calibrating a model trained for another target), training continues from its weights."""
    t0 = time.perf_counter()
    if not blocks:
        raise ValueError("no recorded blocks to train on")
    model_config = init.config if init is not None else config.model
    widths = {(b.topk_ids.shape[-1], None if b.hidden is None else b.hidden.shape[-1]) for b in blocks}
    if widths != {(model_config.topk, model_config.hidden_dims)}:
        raise ValueError(f"the trajectories hold (top-k, hidden components) {sorted(widths, key=str)}, the set model reads "
                         f"({model_config.topk}, {model_config.hidden_dims}): collect with --topk {model_config.topk} "
                         f"--hidden-dims {model_config.hidden_dims}")
    if token_coords.shape[-1] != model_config.embedding_dims:
        raise ValueError(f"the token projection has {token_coords.shape[-1]} components, the set model reads {model_config.embedding_dims}")
    train_blocks, heldout_blocks = split_by_request(blocks, config.heldout_fraction, config.seed)
    triples = _triples(train_blocks, config.max_depth)
    if len(triples) == 0:
        raise ValueError("the training requests yield no examples (every block has < 2 steps)")
    steps = config.steps or math.ceil(config.epochs * len(triples) / config.batch_size)
    with torch.random.fork_rng(devices=[]):  # seeded init without touching the caller's RNG
        torch.manual_seed(config.seed)
        model = SetModel(model_config)
    if init is not None:
        model.load_state_dict(init.state_dict())
    model.to(config.device).train()

    def batch_loss(rows: torch.Tensor) -> tuple[torch.Tensor, float]:
        set_loss, token_loss, _, _ = losses(model, build_set_batch(train_blocks, rows, model_config, token_coords), config.device,
                                            config.position_weight)
        loss = set_loss + config.token_weight * token_loss
        return loss, loss.item()

    run = optimize(model, len(triples), lambda index: batch_loss(triples[index]), steps, config, t0, progress)
    heldout = evaluate_set_model(model, heldout_blocks, token_coords, config.threshold, config.max_depth, config.device)
    return SetTrainResult(
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
