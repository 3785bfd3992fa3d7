"""Train SPOT-R's refresh head on recorded draft-free trajectories (pure: returns data, never prints).

An example is one masked position of a recorded block at step t, seen from Δ steps earlier: what a tree node
drafting step t from the distribution behind step t - Δ reads there (spot.drafters.refresh): the stale top-k, the
stale hidden state, and the neighbours committed since step t - Δ. Its target is the target's own distribution
behind step t at that position over those candidates (a candidate outside that step's recorded top-k sits below
its least), learned by soft cross-entropy, and the fresh mass the candidates hold (squared error on its log): so
the head gives fresh log-probabilities, which rank the candidates as the target draws at any temperature once the
step's noise is added, and the confidence of the drawn token, which SPOT's order model reads. Every masked position
is an example, not only the one committed: a node drafts at any of them.

The held-out split is by request (adjacent steps of one block are near duplicates); the held-out report gives, per
Δ, the share of commits whose token the stale top-1 and the head rank first, as the target draws.

Deterministic: the same blocks, config and seed give identical weights on one machine.

Shapes: N examples, k top-k, R hidden components.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F

from spot.drafters.order_examples import RecordedBlock
from spot.drafters.order_model import predict, step_noise_at_topk
from spot.drafters.refresh import RefreshConfig, RefreshHead, RefreshInputs, neighbours
from spot.drafters.stale import StaleFit, fit_order


@dataclass(frozen=True)
class RefreshTrainConfig:
    seed: int = 0
    steps: int = 3000
    batch_size: int = 512
    lr: float = 3e-3
    heldout_fraction: float = 0.25  # of the requests
    head: RefreshConfig = RefreshConfig()

    def __post_init__(self) -> None:
        if min(self.steps, self.batch_size) < 1 or not 0 <= self.heldout_fraction < 1:
            raise ValueError(f"steps ({self.steps}) and batch_size ({self.batch_size}) must be >= 1 and heldout_fraction "
                             f"({self.heldout_fraction}) in [0, 1)")


FIELDS = ("fresh", "mass", "token", "noise", "temperature", "request", "block", "step", "position")  # RefreshExamples' beside its inputs


@dataclass(frozen=True)
class RefreshExamples:
    """N examples: the head's inputs; the fresh log-probabilities of the candidates [N, k] and the log of the fresh
    mass they hold [N] (the targets); the token the step commits there [N] (-1 where it commits elsewhere); the
    step's noise at the candidates [N, k] (zeros at T = 0); per row its temperature, request, block (its index in
    the request), step t and position in the block."""

    inputs: RefreshInputs
    fresh: torch.Tensor
    mass: torch.Tensor
    token: torch.Tensor
    noise: torch.Tensor
    temperature: torch.Tensor
    request: torch.Tensor
    block: torch.Tensor
    step: torch.Tensor
    position: torch.Tensor

    def __len__(self) -> int:
        return len(self.token)

    def take(self, rows: torch.Tensor) -> RefreshExamples:
        x = self.inputs
        inputs = RefreshInputs(x.lp[rows], x.ids[rows], x.hidden[rows], x.near_tokens[rows], x.near_new[rows], x.staleness[rows])
        return RefreshExamples(inputs, *(getattr(self, f)[rows] for f in FIELDS))


def block_examples(block: RecordedBlock, max_staleness: int) -> RefreshExamples | None:
    """Every (step t >= 1, Δ <= min(max_staleness, t), masked position) of one block; None where the block has none
    or no recorded hidden states."""
    if block.hidden is None:
        return None
    parts = []
    for t in range(1, block.states.shape[0] - 1):
        masked = (block.states[t] == block.mask_id).nonzero().flatten()  # [M]
        committed = block.states[t + 1, masked] != block.mask_id  # [M]
        if not committed.any():  # a step that commits nothing (a timestep schedule's): nothing to learn
            continue
        fresh_lp, fresh_ids = block.topk_logprobs[t, masked].float(), block.topk_ids[t, masked].long()  # [M, k]
        token = torch.where(committed, block.states[t + 1, masked], -1).long()
        for delta in range(1, min(max_staleness, t) + 1):
            s = t - delta
            ids = block.topk_ids[s, masked].long()  # [M, k] the candidates
            same = ids[:, :, None] == fresh_ids[:, None, :]  # [M, k, k]
            held = same.any(-1)  # [M, k] the candidates in the fresh top-k
            matched = (same.float() * fresh_lp[:, None, :]).sum(-1)
            fresh = torch.where(held, matched, fresh_lp.min(-1, keepdim=True).values - 1.0)
            mass = matched.masked_fill(~held, -math.inf).logsumexp(-1).clamp_min(fresh_lp.min(-1).values - 1.0)
            noise = (step_noise_at_topk(block.seed, block.request, block.block, t, block.topk_ids[s].long())[masked].float()
                     if block.temperature > 0 else torch.zeros(ids.shape))
            near_tokens, near_new = neighbours(block.states[t][None], block.states[s])  # [1, K, 6]
            m = len(masked)
            parts.append(RefreshExamples(
                RefreshInputs(block.topk_logprobs[s, masked].float(), ids, block.hidden[s, masked].float(),
                              near_tokens[0, masked], near_new[0, masked], torch.full((m,), delta)),
                fresh, mass, token, noise, torch.full((m,), float(block.temperature)),
                *(torch.full((m,), v, dtype=torch.long) for v in (block.request, block.block, t)), masked))
    return concat(parts) if parts else None


def concat(parts: Sequence[RefreshExamples]) -> RefreshExamples:
    cat = lambda name, source=lambda p: p: torch.cat([getattr(source(p), name) for p in parts])  # noqa: E731
    inputs = RefreshInputs(*(cat(f, lambda p: p.inputs) for f in ("lp", "ids", "hidden", "near_tokens", "near_new", "staleness")))
    return RefreshExamples(inputs, *(cat(f) for f in FIELDS))


def drawn(lp: torch.Tensor, examples: RefreshExamples) -> torch.Tensor:
    """[N] the candidate each row's log-probabilities [N, k] rank first as the target draws
    (spot.drafters.order_model.predict, per temperature)."""
    return _drawn(lp, examples)[0]


def _drawn(lp: torch.Tensor, examples: RefreshExamples) -> tuple[torch.Tensor, torch.Tensor]:
    """[N] the candidate each row's log-probabilities rank first as the target draws, and its confidence."""
    tokens, confidence = torch.empty_like(examples.token), torch.empty(len(examples))
    for t in examples.temperature.unique().tolist():
        rows = examples.temperature == t
        ranked, order = lp[rows].sort(dim=-1, descending=True, stable=True)
        ids = examples.inputs.ids[rows].gather(-1, order)
        pred = predict(ranked, ids, t, examples.noise[rows].gather(-1, order) if t > 0 else None)
        tokens[rows], confidence[rows] = pred.tokens[:, 0], pred.probs[:, 0]
    return tokens, confidence


def fit_refreshed_order(lp: torch.Tensor, examples: RefreshExamples) -> StaleFit:
    """The temperature at which the confidences of the drawn tokens under the refreshed log-probabilities lp
    [N, k] order each node's positions (spot.drafters.stale.fit_order), what SpotDrafter's mode "stale" reads
    in place of the order model: a node is one (temperature, request, block, step, Δ) of the examples, its
    truth the position the step commits."""
    confidence = _drawn(lp, examples)[1].clamp_min(1e-12).log()
    keys = torch.stack([examples.temperature.double().mul(1e6).round().long(), examples.request, examples.block,
                        examples.step, examples.inputs.staleness], -1)  # [N, 5]
    node, at = keys.unique(dim=0, return_inverse=True)  # at: [N] each row's node
    log_conf = torch.full((len(node), int(examples.position.max()) + 1), -math.inf)  # [S, K]
    log_conf[at, examples.position] = confidence
    committed = examples.token >= 0
    truth = torch.full((len(node),), -1, dtype=torch.long)
    truth[at[committed]] = examples.position[committed]
    fitted = truth >= 0
    if not fitted.any():
        raise ValueError("no committed positions to fit the refreshed order on: pass examples of recorded steps")
    return fit_order(log_conf[fitted], truth[fitted])


@torch.no_grad()
def _head_lp(head: RefreshHead, examples: RefreshExamples, chunk: int = 65536) -> torch.Tensor:
    """[N, k] the head's log-probabilities, `chunk` rows at a time (a row's candidates' embeddings are [k, E])."""
    return torch.cat([head(examples.take(torch.arange(i, min(i + chunk, len(examples)))).inputs)
                      for i in range(0, len(examples), chunk)])


def heldout_split(requests: torch.Tensor, fraction: float, seed: int) -> torch.Tensor:
    """[N] bool: the rows of a seeded `fraction` of the requests."""
    unique = requests.unique()
    g = torch.Generator().manual_seed(seed)
    held = unique[torch.randperm(len(unique), generator=g)[: int(len(unique) * fraction)]]
    return torch.isin(requests, held)


def train_refresh(examples: RefreshExamples, token_coords: torch.Tensor, config: RefreshTrainConfig,
                  progress: Callable[[int, float], None] | None = None) -> tuple[RefreshHead, dict]:
    """The trained head (eval mode) and the held-out report: {"examples", "heldout", "heldout_requests", "top1": {Δ: {"stale",
    "refreshed"}}, "order", "seconds"}: the share of held-out commits whose token each ranks first, as the target
    draws, and the refreshed order's fit (fit_refreshed_order, a StaleFit's fields)."""
    started = time.perf_counter()
    torch.manual_seed(config.seed)
    held = heldout_split(examples.request, config.heldout_fraction, config.seed)
    train, test = examples.take((~held).nonzero().flatten()), examples.take(held.nonzero().flatten())
    widths = {"topk": examples.inputs.ids.shape[1], "hidden_dims": examples.inputs.hidden.shape[1],
              "embedding_dims": token_coords.shape[1]}  # the recorded data's
    head = RefreshHead(replace(config.head, **widths), token_coords)
    optimizer = torch.optim.Adam(head.parameters(), lr=config.lr)
    g = torch.Generator().manual_seed(config.seed)
    for step in range(config.steps):
        batch = train.take(torch.randint(len(train), (config.batch_size,), generator=g))
        lp = head(batch.inputs)  # [B, k]
        mass = lp.logsumexp(-1)
        loss = F.cross_entropy(lp - mass[:, None], batch.fresh.softmax(-1)) + F.mse_loss(mass, batch.mass)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if progress is not None:
            progress(step + 1, loss.item())
    head.eval()
    report = {"examples": len(examples), "heldout": len(test), "heldout_requests": test.request.unique().tolist(),
              "top1": {}, "seconds": 0.0}
    fitted_on = test if len(test) else train  # the order's temperature, on the held-out requests where there are some
    lp = _head_lp(head, fitted_on)
    report["order"] = asdict(fit_refreshed_order(lp, fitted_on))
    committed = test.token >= 0
    if committed.any():
        stale, refreshed = drawn(test.inputs.lp, test) == test.token, drawn(lp, test) == test.token
        for delta in sorted(test.inputs.staleness[committed].unique().tolist()):
            at = committed & (test.inputs.staleness == delta)
            report["top1"][int(delta)] = {"stale": float(stale[at].float().mean()), "refreshed": float(refreshed[at].float().mean())}
    report["seconds"] = round(time.perf_counter() - started, 1)
    return head, report
