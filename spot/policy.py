"""Draft-free commit policies as pure functions: (state, logits, noise) -> next state.

Vocabulary used across the library:
    masked     a block position that still holds the mask token.
    committed  a position that holds a real token (prompt tokens in the first block included).
    step       one application of the policy: it commits >= 1 masked positions.
    state      a block's tokens [K], masks included.

Both the draft-free decoder and the verifier call `next_state`; that shared seam is what makes
speculation lossless by construction. Shapes: K = block length, V = vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from spot.config import DecodeConfig, Sampling

DREAM_ENTROPY_EPS = 1e-10  # Dream's sample_tokens: log(p + 1e-10), so that a filtered-out token's 0 * log 0 is 0


@dataclass(frozen=True)
class Proposal:
    """What the target would write at every position of a state, and how sure it is.

    tokens: [K] int64, the sampled (or argmax) token per position.
    confidence: [K] its confidence (`confidence_of`): float64, or with confidence_dtype "model" the model's dtype
        (the probability and margin rules; the entropy rule is float64 in the order of the model dtype's values,
        the random rule always float64).
    token_margin: [K] float64, the token's lead over the runner-up in the ranking score, in logit
        units (logits + T * noise, or logits at T = 0); inf where one token survives the filters.
        Computed only on request (`propose(..., margins=True)`); None otherwise.
    """

    tokens: torch.Tensor
    confidence: torch.Tensor
    token_margin: torch.Tensor | None = None


def filtered_logits(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Temperature, then top-k, then top-p (SDAR's order); the top token always survives.

    Args:
        logits: [K, V] float64 (or the model's dtype), with disallowed tokens already at -inf.
    Returns:
        [K, V] log-weights in the same dtype; removed tokens are -inf.
    """
    z = logits / sampling.temperature if sampling.temperature > 0 else logits
    if 0 < sampling.top_k < z.shape[-1]:
        kth = torch.topk(z, sampling.top_k, dim=-1).values[:, -1:]  # [K, 1]
        z = z.masked_fill(z < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_z, order = torch.sort(z, dim=-1, descending=True)  # [K, V]
        probs = torch.softmax(sorted_z, dim=-1)
        # Drop a token when the mass strictly before it already reaches top_p.
        drop_sorted = (torch.cumsum(probs, dim=-1) - probs) >= sampling.top_p
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        z = z.masked_fill(drop, float("-inf"))
    return z


def propose(
    logits: torch.Tensor,
    gumbel: torch.Tensor | None,
    sampling: Sampling,
    mask_id: int,
    margins: bool = False,
    confidence: str = "probability",
    mask_in_softmax: bool = False,
    dtype: torch.dtype = torch.float64,
) -> Proposal:
    """The token and confidence at every position of one state.

    Args:
        logits: [K, V] target logits for the state (any float dtype).
        gumbel: [K, V] float64 noise of this step; None at temperature 0 unless the confidence is "random".
        mask_id: never sampled, so a committed position can never look masked.
        margins: also return each token's lead over the runner-up (`Proposal.token_margin`).
        confidence: the rule that ranks positions (DecodeConfig.confidence; `confidence_of`).
        mask_in_softmax: the mask token keeps its share of the softmax (and of top-k / top-p), as SDAR, LLaDA
            and Dream compute confidences; it is never drawn either way.
        dtype: what the filters and the softmax compute in: float64, or the model's dtype, op for op as the
            references do (DecodeConfig.confidence_dtype "model"; the float32 logits a target hands over came
            from that dtype, so they convert back exactly). At T = 0 the token is the same either way (the
            argmax of the same values); at T > 0 the draw adds the float64 noise to the filtered logits.
    """
    # A copy in the working dtype: the mask's column is overwritten below, and `to` returns the caller's
    # tensor itself when the dtype already matches.
    z = logits.to(dtype, copy=True)
    if not mask_in_softmax:
        z[:, mask_id] = float("-inf")
    z = filtered_logits(z, sampling)
    score = z + gumbel if sampling.temperature > 0 else z  # [K, V]
    if mask_in_softmax:  # the mask keeps its share of the softmax, but is never drawn
        score = score.index_fill(-1, torch.tensor([mask_id], device=score.device), float("-inf"))
    tokens = torch.argmax(score, dim=-1)  # [K]
    probs = torch.softmax(z, dim=-1)  # [K, V]
    conf = confidence_of(confidence, probs, tokens, gumbel, mask_id)
    if not margins:
        return Proposal(tokens=tokens, confidence=conf)
    score = score.to(torch.float64)  # the lead in float64 whatever the confidences are ranked in
    best = score.gather(-1, tokens[:, None])[:, 0]  # [K]
    runner_up = score.scatter(-1, tokens[:, None], float("-inf")).max(dim=-1).values  # [K]
    scale = sampling.temperature if sampling.temperature > 0 else 1.0  # score units are logits / T
    return Proposal(tokens=tokens, confidence=conf, token_margin=(best - runner_up) * scale)


def confidence_of(rule: str, probs: torch.Tensor, tokens: torch.Tensor, gumbel: torch.Tensor | None, mask_id: int) -> torch.Tensor:
    """[K] in [0, 1], higher commits first, from probs [K, V] (filtered, temperature-scaled, the mask token at 0;
    float64, or the model's dtype under confidence_dtype "model") and the drawn tokens [K]:

        probability  p(drawn token): LLaDA's low_confidence, SDAR's and Dream's maskgit_plus
        margin       p(top-1) - p(top-2): Dream's topk_margin
        entropy      exp(sum p log p) = exp(-H), the order of Dream's negative entropy, kept in (0, 1]; in a
                     model dtype the negative entropy is Dream's own, sum p log(p + 1e-10) in that dtype, and
                     only its exp is taken in float64 (exp in bf16 would merge values Dream ranks apart)
        random       the uniform behind the step's noise at the mask token, an entry no draw uses: one
                     counter-keyed draw per position, so that every tree node of a step sees the same order

    probability and margin come in the dtype of `probs`; entropy and random in float64.
    """
    if rule == "probability":
        return probs.gather(-1, tokens[:, None])[:, 0]
    if rule == "margin":
        top = torch.topk(probs, min(2, probs.shape[-1]), dim=-1).values  # [K, 2]
        return top[:, 0] - top[:, 1] if top.shape[-1] > 1 else top[:, 0]
    if rule == "entropy":
        if probs.dtype != torch.float64:  # the model's dtype: Dream's sample_tokens(neg_entropy=True), op for op
            return torch.exp((probs * torch.log(probs + DREAM_ENTROPY_EPS)).sum(dim=-1).to(torch.float64))
        return torch.exp(torch.special.xlogy(probs, probs).sum(dim=-1))
    if rule == "random":
        if gumbel is None:
            raise ValueError("confidence 'random' ranks positions by the step's noise; pass it at every temperature")
        return torch.exp(-torch.exp(-gumbel[:, mask_id]))  # Gumbel's CDF: the uniform it was drawn from
    raise ValueError(f"unknown confidence {rule!r}")


@dataclass(frozen=True)
class Span:
    """Where a block's K positions lie in the tensor a reference generator ranks a step's positions in: `before`
    positions before them and `after` after them, all at -inf (the rest of the canvas it holds at that step)."""

    before: int = 0
    after: int = 0


BLOCK = Span()  # the block alone (SDAR's and LLaDA2.0's generators, Fast-dLLM's dual cache after a block's first step)


def ranked(masked: torch.Tensor, confidence: torch.Tensor) -> torch.Tensor:
    """The masked positions, most confident first ([M] int64); ties go to the leftmost position."""
    score = confidence.masked_fill(~masked, float("-inf"))
    return torch.sort(score, descending=True, stable=True).indices[: int(masked.sum())]


def topk_ranked(masked: torch.Tensor, confidence: torch.Tensor, k: int, span: Span) -> torch.Tensor:
    """The `k` most confident masked positions ([k] int64) as the references pick them: torch.topk(row, k) on the
    row they hold, the block's confidences with -inf at committed positions and `span`'s -inf around them, in the
    confidences' dtype and on their device. Among exact ties torch's order depends on the row's length and the
    kernel (a partial sort on the CPU), so the row is theirs to the last padding position."""
    score = confidence.masked_fill(~masked, float("-inf"))
    row = torch.nn.functional.pad(score, (span.before, span.after), value=float("-inf"))  # [before + K + after]
    return torch.topk(row, k).indices - span.before


def ranked_picks(config: DecodeConfig, step: int, masked_left: int, committed: int) -> int:
    """How many of the ranking's top positions decided step `step` that committed `committed` of `masked_left`:
    its commit count (at least one: a timestep step may commit none), or the cap where the cap may have bound."""
    if config.cap(step, masked_left) == committed:
        return committed
    return max(config.commit_count(step, masked_left), 1)


def select(masked: torch.Tensor, confidence: torch.Tensor, config: DecodeConfig, step: int = 0, span: Span = BLOCK) -> torch.Tensor:
    """Which masked positions step `step` of a block commits (DecodeConfig.policy says how).

    Args:
        masked: [K] bool, True where the state still holds the mask token (at least one).
        confidence: [K] float64, or the model's dtype (DecodeConfig.confidence_dtype), the threshold met in it.
        span: with tie_break "topk", where the block lies in the row the reference ranks at this step.
    Returns:
        [K] bool, the positions to commit (always >= 1, always a subset of `masked`).
    """
    if config.first_token_commit and step == 0:  # Fast-dLLM's Dream: the block's first position, alone
        chosen = torch.zeros_like(masked)
        chosen[int(torch.nonzero(masked)[0])] = True
        return chosen
    if config.policy == "timestep" and config.confidence == "random":  # Dream's origin: each revealed with p = 1 - s/t
        fraction = config.transfer_fraction(step)
        return masked.clone() if fraction is None else masked & (confidence < float(fraction))
    left = int(masked.sum())
    count, cap = config.commit_count(step, left), config.cap(step, left)
    if config.tie_break == "leftmost":
        order = ranked(masked, confidence)
    else:  # the references' top-k call: every masked position for the threshold rule, or its cap; else the count
        reach = (left if cap is None else cap) if config.policy == "threshold" else count
        order = topk_ranked(masked, confidence, min(reach, left), span)
    chosen = torch.zeros_like(masked)
    chosen[order[:count]] = True
    if config.policy == "threshold":
        # In a model dtype `>=` rounds tau to it, as the references compare (0.9 is 0.8984375 in bf16).
        clears = masked & (confidence >= config.threshold)
        if cap is not None:  # Fast-dLLM's Dream: only the `cap` most confident may commit; the rest wait
            allowed = torch.zeros_like(masked)
            allowed[order[:cap]] = True
            clears &= allowed
        chosen |= clears
    elif config.policy == "dynamic":
        confident = masked & (confidence > config.threshold)  # strictly, as SDAR writes it
        if int(confident.sum()) >= config.commit_count(step):
            chosen = confident
    return chosen


def next_state(
    state: torch.Tensor,
    logits: torch.Tensor,
    gumbel: torch.Tensor | None,
    config: DecodeConfig,
    mask_id: int,
    step: int = 0,
) -> torch.Tensor:
    """One draft-free step: the state the target moves to from `state`.

    Args:
        state: [K] int64 with at least one mask.
        logits: [K, V] the target's logits at `state`.
        gumbel: [K, V] the noise of this step (None at T = 0).
        step: the step's index within its block (the static and dynamic schedules depend on it).
    Returns:
        [K] int64, `state` with the chosen positions committed.
    """
    return decide(state, logits, gumbel, config, mask_id, step)[0]


def decide(
    state: torch.Tensor,
    logits: torch.Tensor,
    gumbel: torch.Tensor | None,
    config: DecodeConfig,
    mask_id: int,
    step: int = 0,
    margins: bool = False,
    model_dtype: torch.dtype | None = None,
    span: Span = BLOCK,
) -> tuple[torch.Tensor, Proposal]:
    """`next_state`, and the proposal it was decided on (with token margins on request).

    model_dtype: the dtype the target computes its logits in (Target.logits_dtype), which confidence_dtype
    "model" computes the confidences in; None: the logits' own. span: `select`'s, for tie_break "topk"."""
    dtype = torch.float64 if config.confidence_dtype == "float64" else model_dtype or logits.dtype
    proposal = propose(logits, gumbel, config.sampling, mask_id, margins, config.confidence, config.mask_in_softmax, dtype)
    rank_by = proposal.confidence
    if config.alg_temp > 0:  # Dream's alg_temp: sampling positions from softmax(confidence / alg_temp) is Gumbel-top-k
        rank_by = proposal.confidence.to(torch.float64) / config.alg_temp + gumbel[:, mask_id].to(rank_by.device)
    chosen = select(state == mask_id, rank_by, config, step, span)
    return torch.where(chosen, proposal.tokens, state), proposal


@dataclass(frozen=True)
class Margins:
    """How near one draft-free step came to another outcome; each >= 0, and a small one is a near-tie.

    position: log c(k-th) - log c(k+1-th) over the masked positions, k the step's commit count
        (None when no position is left beside them): which positions the ranked part of the rule
        commits (the top-1 of single and threshold, the top-k_s of static and dynamic).
    threshold: min |log c - log tau| over the masked positions, the top-1 aside for `threshold`
        (None for the policies without a threshold): whether a position clears tau.
    token: min of the token's lead over the runner-up, in logit units (logits + T * noise), over the
        committed positions at T = 0 and over every masked position at T > 0: which token a position
        gets, and at T > 0 with it the confidence it is ranked by (the drawn token's probability jumps
        when another token is drawn; at T = 0 the top probability moves smoothly).

    If every logit can be off by at most `delta` (another kernel, another layout), a log-confidence
    moves by at most 2 delta / T' (T' = T, or 1 at T = 0) and a token's lead by at most 2 delta, so
    the step can come out otherwise only if one margin is within its `bounds`. (Not covered: a token
    crossing the edge of the top-k / top-p set, which also moves the renormalised confidences.)
    """

    position: float | None
    threshold: float | None
    token: float

    @classmethod
    def of(
        cls, before: torch.Tensor, after: torch.Tensor, proposal: Proposal, config: DecodeConfig, mask_id: int, step: int = 0
    ) -> Margins:
        """The margins of step `step` (of its block), before -> after ([K] states), decided on `proposal`
        (with token margins)."""
        masked = before == mask_id
        committed = masked & (after != mask_id)
        log_c = proposal.confidence.to(before.device, torch.float64).log()  # [K]
        order = ranked(masked, log_c)  # [M]
        k = ranked_picks(config, step, len(order), int(committed.sum()))
        position = float(log_c[order[k - 1]] - log_c[order[k]]) if len(order) > k else None
        threshold = None
        if config.policy in ("threshold", "dynamic"):
            tested = masked.clone()
            if config.policy == "threshold":
                tested[order[0]] = False  # committed whatever its confidence
            if bool(tested.any()):
                tau = threshold_as_met(config.threshold, proposal.confidence.dtype)
                threshold = float((log_c[tested] - math.log(tau)).abs().min())
        decides_token = masked if config.sampling.temperature > 0 else committed
        return cls(position, threshold, float(proposal.token_margin.to(before.device)[decides_token].min()))

    def bounds(self, delta: float, temperature: float) -> Margins:
        """The largest margin of each kind that a logit error of at most `delta` can overturn."""
        scale = temperature if temperature > 0 else 1.0
        return Margins(position=4 * delta / scale, threshold=2 * delta / scale, token=2 * delta)

    def within(self, delta: float, temperature: float) -> bool:
        """True if a logit error of at most `delta` could have changed this step: a numerics tie."""
        bound = self.bounds(delta, temperature)
        pairs = [(self.position, bound.position), (self.threshold, bound.threshold), (self.token, bound.token)]
        return any(margin is not None and margin <= limit for margin, limit in pairs)


def threshold_as_met(threshold: float, dtype: torch.dtype) -> float:
    """tau as confidences of `dtype` are compared with it: rounded to that dtype, as torch compares a tensor with a
    Python number (0.9 meets a bf16 confidence as 0.8984375, in `select` as in the references)."""
    return float(torch.tensor(threshold, dtype=dtype))


def topk_logprobs(logits: torch.Tensor, k: int, mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-k of log-softmax over the vocabulary without the mask token: ([K, k], [K, k]) on CPU."""
    z = logits.float().clone()  # [K, V]
    z[:, mask_id] = float("-inf")
    top = torch.topk(torch.log_softmax(z, dim=-1), k, dim=-1)
    return top.values.cpu(), top.indices.cpu()
