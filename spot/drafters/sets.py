"""SPOT-Sets' tree: draft the *sets* a threshold decoder commits, several steps ahead [INF: our design].

A threshold step commits every masked position whose confidence clears tau, and at least the most
confident one (spot.policy.select). A set predictor gives, per masked position p of a node,
pi_p = P(p is in the node's next committed set); taking the positions as independent, a candidate set S
scores by the product rule (the paper's `--sets-accept product`):

    log P(S) = sum_{p in S} log pi_p + sum_{p masked, not in S} log(1 - pi_p),

and its tokens are a draw under the node's step noise (the coupled draw, as in SPOT) from the stale
top-k, ranked by the stale distribution or by the predictor's own scores. A node's children are its `best_sets` (k-best enumeration, so the tree is not limited to the
single most likely set), grown best-first under the budget (spot.tree.grow_best_first). Every depth
reads the root's stale distribution: no new forward exists below the root.

A set predictor (`SetPredictor`) gives each node's pi and tokens: the learned set model
(spot.drafters.set_model.LearnedSets, which reads the target's hidden states too and re-ranks the stale
top-k tokens), or `StaleSets`, which reads the stale confidences alone:

    logit pi_p = a_d (log c_p - log tau) + b_d + e_d [p is the node's most confident masked position],

c_p the stale probability of the token the node's step would draw at p, d the node's depth (the last
depth's coefficients serve every deeper one), fitted by likelihood on recorded threshold trajectories
(`fit_stale_sets`). It is the heuristic baseline of SPOT-Sets, and its drafting costs no network call.
The learned model scores every node of the tree by default (each level's nodes in one batched call);
with `model_depth` m only the first m levels, and a deeper node reuses its parent's pi over the positions
still masked (as SPOT's model_depth reuses its order logits) with the stale draw of its own step's noise
for tokens.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from spot.drafters.base import DraftContext
from spot.drafters.order_examples import RecordedBlock
from spot.drafters.order_model import Prediction, Prior, depth_noise, predictions_under
from spot.policy import topk_logprobs
from spot.tree import DraftTree, Frontier, SetEdge, grow_best_first

TOPK = 2  # the stale tokens a node's step ranks: its draw and the runner-up
_CLAMP = 1e-6  # probabilities are kept in [1e-6, 1 - 1e-6], so that every set has a finite score


def leader(score: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """[..., K] bool: the masked position of the highest score (a confidence, or anything ordered as it), ties
    to the leftmost, as spot.policy.ranked."""
    score = score.double().masked_fill(~masked, -math.inf)
    return torch.nn.functional.one_hot(score.argmax(-1), masked.shape[-1]).bool() & masked


def best_sets(probs: Sequence[float], n: int) -> list[tuple[tuple[int, ...], float]]:
    """The n most probable non-empty subsets of independent events, best first.

    The most probable subset holds every event with p > 1/2; any other subset flips some events away
    from it, each flip costing |log p - log(1 - p)|. Flip sets come out in increasing total cost from a
    heap over the costs sorted ascending, where a flip set whose largest flip is the i-th either adds
    the (i + 1)-th or moves its i-th to the (i + 1)-th: each flip set is reached exactly once.

    Args:
        probs: [M] inclusion probabilities.
    Returns:
        up to n pairs (the subset's indices ascending, its log-probability), in decreasing probability
        (ties in the order the enumeration meets them).
    """
    p = [min(max(float(x), _CLAMP), 1.0 - _CLAMP) for x in probs]
    if not p or n < 1:
        return []
    base = {i for i, x in enumerate(p) if x > 0.5}
    best = sum(math.log(max(x, 1.0 - x)) for x in p)
    cost = sorted((abs(math.log(x) - math.log1p(-x)), i) for i, x in enumerate(p))  # ascending flip costs
    out: list[tuple[tuple[int, ...], float]] = []
    heap: list[tuple[float, tuple[int, ...]]] = [(0.0, ())]  # (total flip cost, flipped ranks ascending)
    while heap and len(out) < n:
        total, flips = heapq.heappop(heap)
        chosen = base.symmetric_difference(cost[r][1] for r in flips)
        if chosen:
            out.append((tuple(sorted(chosen)), best - total))
        last = flips[-1] if flips else -1
        if last + 1 < len(cost):
            heapq.heappush(heap, (total + cost[last + 1][0], (*flips, last + 1)))
            if flips:
                heapq.heappush(heap, (total - cost[last][0] + cost[last + 1][0], (*flips[:-1], last + 1)))
    return out


@dataclass(frozen=True)
class StaleSets:
    """The stale-confidence set predictor: per depth d, coefficients (a_d, b_d, e_d) of the module
    docstring's logistic rule; the last depth's serve every deeper one."""

    coefficients: tuple[tuple[float, float, float], ...]

    def __post_init__(self) -> None:
        if not self.coefficients or any(len(c) != 3 for c in self.coefficients):
            raise ValueError(f"StaleSets needs one (a, b, e) triple per depth, got {self.coefficients!r}")

    topk = TOPK
    device = torch.device("cpu")

    def node_sets(self, groups: Sequence[Nodes]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """SetPredictor: the inclusion probabilities of the module docstring's rule and the stale draws."""
        out = []
        for g in groups:
            predictions = [g.stale.prediction(d) for d in g.depths]
            probs = [self.probs(p.probs[:, 0], m, d, g.stale.threshold) for p, m, d in zip(predictions, g.masked, g.depths, strict=True)]
            out.append((torch.stack(probs), torch.stack([p.tokens[:, 0] for p in predictions])))
        return out

    def probs(self, confidence: torch.Tensor, masked: torch.Tensor, depth: int, threshold: float) -> torch.Tensor:
        """[K] inclusion probabilities (0 where not masked) from the node's confidences [K]."""
        a, b, e = self.coefficients[min(depth, len(self.coefficients) - 1)]
        return torch.sigmoid(self.logits(confidence, masked, threshold, a, b, e)).masked_fill(~masked, 0.0)

    @staticmethod
    def logits(confidence, masked, threshold: float, a, b, e) -> torch.Tensor:
        """logit pi over the last dim ([..., K] inputs; a, b, e floats or broadcastable tensors)."""
        log_c = confidence.double().clamp_min(1e-12).log()
        return a * (log_c - math.log(threshold)) + b + e * leader(confidence, masked).double()

    def to_dict(self) -> dict:
        return {"coefficients": [list(c) for c in self.coefficients]}

    @staticmethod
    def from_dict(raw: dict) -> StaleSets:
        return StaleSets(tuple(tuple(float(v) for v in c) for c in raw["coefficients"]))


@dataclass(frozen=True)
class SetsReport:
    """Per depth, over `examples` (root step, depth) pairs of recorded blocks: the mean log-likelihood per
    masked position, the exact-set match rate and per-position F1 of the predictor's most probable
    non-empty set (a node's first child), and the same two for the baseline set (confidence >= tau, and
    the most confident position)."""

    log_likelihood: tuple[float, ...]
    exact_set: tuple[float, ...]
    f1: tuple[float, ...]
    baseline_exact_set: tuple[float, ...]
    baseline_f1: tuple[float, ...]
    examples: tuple[int, ...]


def set_examples(blocks: Sequence[RecordedBlock], depth: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every (root step s >= 1, depth d) of the blocks: the confidence the node's step draws with under
    the stale distribution of step s - 1, the node's masked positions (the true state of step s + d) and
    the set step s + d committed. Returns ([B, K] float64, [B, K] bool, [B, K] bool)."""
    conf, masked, chosen = [], [], []
    for block in blocks:
        n_steps = block.states.shape[0] - 1
        for s in range(1, n_steps - depth):
            conf.append(block.drawn_confidence(s - 1, s + depth))
            node, after = block.states[s + depth], block.states[s + depth + 1]
            masked.append(node == block.mask_id)
            chosen.append((node == block.mask_id) & (after != block.mask_id))
    if not conf:
        return torch.empty(0, 0, dtype=torch.float64), torch.empty(0, 0, dtype=torch.bool), torch.empty(0, 0, dtype=torch.bool)
    return torch.stack(conf), torch.stack(masked), torch.stack(chosen)


Examples = Callable[[Sequence[RecordedBlock], int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # as set_examples


def fit_stale_sets(blocks: Sequence[RecordedBlock], threshold: float, depths: int = 4, iterations: int = 100,
                   examples: Examples = set_examples) -> StaleSets:
    """(a, b, e) per depth by maximum likelihood (L-BFGS on the per-position cross-entropy over every
    masked position of every example), from (1, 0, 0); a depth without examples takes the previous depth's.
    `examples`: the confidences the rule reads (set_examples: the stale ones)."""
    coefficients: list[tuple[float, float, float]] = []
    for d in range(depths):
        conf, masked, chosen = examples(blocks, d)
        if conf.shape[0]:
            coefficients.append(_fit_depth(conf, masked, chosen, threshold, iterations))
        elif coefficients:
            coefficients.append(coefficients[-1])
        else:
            raise ValueError("no steps to fit the set predictor on: pass threshold trajectories of two or more steps")
    return StaleSets(tuple(coefficients))


def evaluate_sets(predictor: StaleSets, blocks: Sequence[RecordedBlock], threshold: float, depths: int = 4,
                  examples: Examples = set_examples) -> SetsReport:
    """The predictor's SetsReport on the blocks (depths without examples report nan), reading `examples`' confidences."""
    metrics: dict[str, list[float]] = {k: [] for k in ("log_likelihood", "exact_set", "f1", "baseline_exact_set", "baseline_f1")}
    counts = []
    for d in range(depths):
        conf, masked, chosen = examples(blocks, d)
        counts.append(int(conf.shape[0]))
        if not counts[-1]:
            for values in metrics.values():
                values.append(math.nan)
            continue
        z = StaleSets.logits(conf, masked, threshold, *predictor.coefficients[min(d, len(predictor.coefficients) - 1)])
        loss = torch.nn.functional.binary_cross_entropy_with_logits(z[masked], chosen[masked].double())
        metrics["log_likelihood"].append(-float(loss))
        best = masked & (z > 0)  # the most probable set; where it is empty, the likeliest single position (never empty)
        best |= ~best.any(-1, keepdim=True) & leader(z, masked)
        for name, guess in (("", best), ("baseline_", masked & ((conf >= threshold) | leader(conf, masked)))):
            metrics[name + "exact_set"].append(float(guess.eq(chosen).all(-1).double().mean()))
            hits = float((guess & chosen).sum())
            metrics[name + "f1"].append(2 * hits / max(float(guess.sum() + chosen.sum()), 1.0))
    return SetsReport(**{k: tuple(v) for k, v in metrics.items()}, examples=tuple(counts))


def _fit_depth(conf: torch.Tensor, masked: torch.Tensor, chosen: torch.Tensor, threshold: float, iterations: int):
    """(a, b, e) maximising the likelihood of `chosen` over the masked positions ([B, K] each)."""
    params = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([params], max_iter=iterations, line_search_fn="strong_wolfe")

    def loss() -> torch.Tensor:
        optimizer.zero_grad()
        z = StaleSets.logits(conf, masked, threshold, *params)
        value = torch.nn.functional.binary_cross_entropy_with_logits(z[masked], chosen[masked].double())
        value.backward()
        return value

    optimizer.step(loss)
    return tuple(float(v) for v in params.detach())


@dataclass(frozen=True)
class Stale:
    """What every node of one draft reads, on the predictor's device.

    lp, ids: [K, k] the stale top-k log-probabilities and ids; noise: [D, K, k] the verifier's noise at
    those ids for depths 0..D-1 (None at T = 0); predictions: the stale draw per depth (one at T = 0);
    prior: the top-1 of the forward before the stale one (None at a block's second step); hidden: [K, d]
    the stale hidden states; root_masked: [K]; temperature and threshold: the decoder's; before: [K] the
    stale state's masked positions (what the root's parent had masked); stale_state: [K] that state itself.
    """

    lp: torch.Tensor
    ids: torch.Tensor
    noise: torch.Tensor | None
    predictions: list[Prediction]
    prior: Prior | None
    hidden: torch.Tensor | None
    root_masked: torch.Tensor
    temperature: float
    threshold: float
    before: torch.Tensor
    stale_state: torch.Tensor

    def prediction(self, depth: int) -> Prediction:
        return self.predictions[min(depth, len(self.predictions) - 1)]


@dataclass(frozen=True)
class Nodes:
    """F nodes of one draft for a set predictor to score: states [F, K], masked [F, K] their masked positions,
    their depths, last [F, K] what the step into each committed; stale what the draft reads."""

    stale: Stale
    states: torch.Tensor
    masked: torch.Tensor
    depths: Sequence[int]
    last: torch.Tensor


@runtime_checkable
class SetPredictor(Protocol):
    """Scores tree nodes for SetsDrafter: StaleSets, the learned spot.drafters.set_model.LearnedSets, or SPOT-RS's
    spot.drafters.refreshed_sets.RefreshedSets."""

    topk: int  # the stale top-k width it reads
    device: torch.device

    def node_sets(self, groups: Sequence[Nodes]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per group of F nodes (one draft's: a level of its tree, or the root of each of several requests'
        drafts), (inclusion probabilities [F, K] float64, 0 where not masked; tokens [F, K] int64); a group's
        outputs do not depend on the other groups."""


class SetsDrafter:
    """SPOT-Sets' drafter over a set predictor (the module docstring)."""

    def __init__(self, predictor: SetPredictor, name: str = "sets", model_depth: int | None = None) -> None:
        """model_depth: tree levels the predictor scores (None: every level; see the module docstring)."""
        if model_depth is not None and model_depth < 1:
            raise ValueError(f"model_depth must be >= 1 (the root needs the predictor) or None, got {model_depth}")
        self.predictor = predictor
        self.name = name
        self.model_depth = model_depth

    def draft(self, ctx: DraftContext) -> DraftTree:
        return self.draft_batch([ctx])[0]

    @torch.inference_mode()
    def draft_batch(self, ctxs: Sequence[DraftContext]) -> list[DraftTree]:
        """The trees of several requests' contexts, each the tree `draft` grows for it alone: the predictor
        scores every root in one call (a group per request, spot.drafters.sets.SetPredictor.node_sets)."""
        stales = [None if ctx.stale_logits is None else self._stale(ctx) for ctx in ctxs]
        roots = [Nodes(s, ctx.state[None].to(self.predictor.device), s.root_masked[None], (0,), (s.before & ~s.root_masked)[None])
                 for ctx, s in zip(ctxs, stales, strict=True) if s is not None]
        scored = iter(self.predictor.node_sets(roots))
        # a block's first step has no distribution of this block yet: the root alone
        return [DraftTree.root_only(ctx.state) if s is None else self._grow(ctx, s, next(scored)) for ctx, s in zip(ctxs, stales, strict=True)]

    def _stale(self, ctx: DraftContext) -> Stale:
        device, temperature = self.predictor.device, ctx.config.sampling.temperature
        lp, ids = (t.to(device) for t in topk_logprobs(ctx.stale_logits, self.predictor.topk, ctx.mask_id))
        noise = depth_noise(ids, ctx, temperature)
        prior = None
        if ctx.prior_logits is not None:
            prior_lp, prior_ids = topk_logprobs(ctx.prior_logits, 1, ctx.mask_id)
            prior = Prior(prior_lp[:, 0].to(device), prior_ids[:, 0].to(device), torch.tensor(True, device=device))
        hidden = None if ctx.stale_hidden is None else ctx.stale_hidden.to(device)
        root_masked = (ctx.state == ctx.mask_id).to(device)
        stale_state = (ctx.state if ctx.stale_state is None else ctx.stale_state).to(device)
        before = stale_state == ctx.mask_id
        return Stale(lp, ids, noise, predictions_under(lp, ids, noise, temperature), prior, hidden, root_masked, temperature,
                     ctx.config.threshold, before, stale_state)

    def _grow(self, ctx: DraftContext, stale: Stale, root: tuple[torch.Tensor, torch.Tensor]) -> DraftTree:
        """Best-first growth of ctx's tree, the root scored by `root` (its pi and tokens, [1, K] each)."""
        device = self.predictor.device
        # node id -> [K] its masked positions; the root's parent (-1) is the state of the stale logits, so
        # what the step into a node committed is where its parent was masked and it is not
        masked_at = {-1: stale.before}
        scored: dict[int, torch.Tensor] = {}  # node id -> [K] the pi it reads: its own, or a scored ancestor's
        root_tokens = root[1][0]

        def expand(frontier: Frontier) -> list[list[SetEdge]]:
            masked = frontier.states.to(device) == ctx.mask_id  # [B, K]
            masked_at.update(zip(frontier.nodes, masked, strict=True))
            # the predictor scores the node (the root's scores came with the call)
            scored_here = [self.model_depth is None or d < self.model_depth for d in frontier.depths]
            fresh = [i for i, own in enumerate(scored_here) if own and frontier.nodes[i] != 0]
            probs = torch.empty(masked.shape, dtype=torch.float64, device=device)  # [B, K]
            tokens = torch.empty(masked.shape, dtype=torch.long, device=device)  # [B, K]
            if fresh:
                last = torch.stack([masked_at[frontier.parents[i]] for i in fresh]) & ~masked[fresh]  # [F, K]
                nodes = Nodes(stale, frontier.states.to(device)[fresh], masked[fresh], [frontier.depths[i] for i in fresh], last)
                probs[fresh], tokens[fresh] = self.predictor.node_sets([nodes])[0]
            for i, (node, parent, depth) in enumerate(zip(frontier.nodes, frontier.parents, frontier.depths, strict=True)):
                if node == 0:
                    probs[i], tokens[i] = root[0][0], root_tokens
                if scored_here[i]:
                    scored[node] = probs[i]
                else:  # the parent's pi where the node is still masked, and the stale draw of the node's own step
                    scored[node] = scored[parent]
                    probs[i] = scored[parent].masked_fill(~masked[i], 0.0)
                    tokens[i] = stale.prediction(depth).tokens[:, 0]
            out = []
            for node_masked, node_probs, node_tokens in zip(masked, probs, tokens, strict=True):
                where = torch.nonzero(node_masked)[:, 0].tolist()
                chosen_tokens = node_tokens.tolist()
                out.append([
                    SetEdge(tuple(where[j] for j in chosen), tuple(chosen_tokens[where[j]] for j in chosen), logp)
                    for chosen, logp in best_sets(node_probs[where].tolist(), ctx.budget)
                ])
            return out

        return grow_best_first(ctx.state, ctx.budget, expand)
