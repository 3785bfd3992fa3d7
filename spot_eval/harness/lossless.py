"""The losslessness diff: each method's tokens against the draft-free tokens of the same request.

A divergence is a bug until shown to be a numerics tie. So each one names the first step whose
outcome differs (both runs took it from the same state, with the same noise), which of that step's
decisions went the other way (the token at a committed position, the position the rule picks, or a
position crossing tau), and how near that decision was in the draft-free run (`spot.policy.Margins`).
A layout whose logits are off by at most delta can only flip a decision within `Margins.bounds`
(README, "Exactness"); a divergence beyond them is a bug.

A lossy method (spot_eval.families.Family.lossy: max-commit) differs from draft-free by design: the
same diff runs and its divergences are reported as rates, never as bugs (`MethodRecord.lossy`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from spot import DecodeConfig, Generation
from spot.policy import Margins, Proposal, ranked, ranked_picks, threshold_as_met
from spot_eval.harness.padding import after_eos_forwards


@dataclass(frozen=True)
class Divergence:
    index: int  # first output token that differs
    block: int | None  # the first step whose outcome differs: its block, and the step within the block
    step: int | None
    flipped: str | None  # "token" | "position" | "threshold": the decision of that step that went otherwise
    margin: float | None  # how near that decision was in the draft-free run (`flip`)
    margins: Margins | None  # the step's margins in the draft-free run: `margins.within(delta, T)` says tie


@dataclass(frozen=True)
class MethodRecord:
    method: str
    budget: int
    token_ids: tuple[int, ...]
    forwards: int
    steps: int
    seconds: float
    target_seconds: float
    drafter_seconds: float
    accepted_lengths: tuple[int, ...]
    divergence: Divergence | None
    draft_nodes: int = 0  # draft nodes verified, over all forwards
    auto: bool = False  # budget=auto, `budget` its cap
    lossy: bool = False  # differs from draft-free by design (max-commit): a divergence is measured, not a failure
    token_divergence: float = 0.0  # the fraction of output positions whose token differs from draft-free's
    text: str | None = None  # a lossy method's own output text, which lm-eval does not score (spot_eval.harness.rescore)
    after_eos_forwards: int = 0  # forwards that only wrote positions after the answer's first EOS (spot_eval.harness.padding)

    @property
    def label(self) -> str:
        if self.method == "draft_free":
            return "draft_free"
        return f"{self.method}@auto" if self.auto else f"{self.method}@{self.budget}"

    @property
    def mean_tree_size(self) -> float:
        """Draft nodes per verify forward."""
        return self.draft_nodes / max(len(self.accepted_lengths), 1)

    @property
    def lossless(self) -> bool:
        """The tokens equal draft-free's (for a lossy method: this request happened not to differ)."""
        return self.divergence is None

    @property
    def failed(self) -> bool:
        """A divergence of a method that must be lossless."""
        return self.divergence is not None and not self.lossy

    @classmethod
    def of(
        cls, method: str, budget: int, got: Generation, reference: Generation, config: DecodeConfig, mask_id: int,
        auto: bool = False, lossy: bool = False, eos_ids: frozenset[int] = frozenset(),
    ) -> MethodRecord:
        """`got` and `reference` with their trajectories (record=True; the reference with record_margins=True);
        `eos_ids`, the target's, tell the forwards spent after the answer's first EOS."""
        s = got.stats
        return cls(
            method, budget, got.token_ids, s.forwards, s.steps, s.seconds, s.target_seconds, s.drafter_seconds,
            s.accepted_lengths, diverge(got, reference, config, mask_id), s.draft_nodes, auto, lossy,
            token_divergence(got.token_ids, reference.token_ids), got.text if lossy else None,
            after_eos_forwards(got, eos_ids, mask_id),
        )


def token_divergence(a: tuple[int, ...], b: tuple[int, ...]) -> float:
    """The fraction of output positions (of the longer output) whose tokens differ; a position only one
    output reaches differs. Block diffusion writes each position in place, so positions are compared, not
    an alignment."""
    n = max(len(a), len(b))
    return sum(x != y for x, y in zip(a, b, strict=False)) / n + (n - min(len(a), len(b))) / n if n else 0.0


def first_difference(a: tuple[int, ...], b: tuple[int, ...]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def diverge(got: Generation, reference: Generation, config: DecodeConfig, mask_id: int) -> Divergence | None:
    """None when the tokens are identical; else where they part, and the decision that parted them.

    Both runs carry their trajectories (record=True), the reference its proposals (record_margins=True)."""
    index = first_difference(got.token_ids, reference.token_ids)
    if index is None:
        return None
    for ref, mine in zip(reference.trajectory or (), got.trajectory or (), strict=False):
        for s in range(1, min(len(ref.states), len(mine.states))):
            if not torch.equal(ref.states[s], mine.states[s]):
                before, after, other = ref.states[s - 1], ref.states[s], mine.states[s]
                if ref.proposals is None:
                    return Divergence(index, ref.block, s - 1, None, None, None)
                proposal = ref.proposals[s - 1]
                kind, margin = flip(before, after, other, proposal, config, mask_id, s - 1)
                margins = Margins.of(before, after, proposal, config, mask_id, s - 1)
                return Divergence(index, ref.block, s - 1, kind, margin, margins)
    return Divergence(index, None, None, None, None, None)


def flip(
    before: torch.Tensor,
    after: torch.Tensor,
    other: torch.Tensor,
    proposal: Proposal,
    config: DecodeConfig,
    mask_id: int,
    step: int = 0,
) -> tuple[str, float]:
    """Which decision took `before` ([K]) to `other` instead of the draft-free `after`, and its margin
    in the draft-free run (`proposal`, what `after` was decided on):

    "token": `other` wrote a token the draft-free step did not propose there; margin: that token's
        lead (the smallest, if several).
    "threshold" (threshold and dynamic policies, one committed set inside the other): a position
        crossed tau; margin: |log c - log tau| of the nearest such position.
    "position": other positions came out on top; margin: log c of the draft-free run's least confident
        ranked pick (the k-th of the step, `DecodeConfig.commit_count`, or `DecodeConfig.cap` where that bound)
        - log c of the other run's best position outside the draft-free set.
    """
    masked = before == mask_id
    ours, theirs = masked & (after != mask_id), masked & (other != mask_id)
    retoken = theirs & (other != proposal.tokens)
    if bool(retoken.any()):
        return "token", float(proposal.token_margin[retoken].min())
    log_c = proposal.confidence.to(torch.float64).log()
    crossed = ours ^ theirs
    nested = not bool((ours & ~theirs).any()) or not bool((theirs & ~ours).any())
    if config.policy in ("threshold", "dynamic") and nested:
        tau = threshold_as_met(config.threshold, proposal.confidence.dtype)
        return "threshold", float((log_c[crossed] - math.log(tau)).abs().min())
    order = ranked(masked, log_c)
    k = ranked_picks(config, step, len(order), int(ours.sum()))
    last_pick = order[min(k, len(order)) - 1]
    return "position", float(log_c[last_pick] - log_c[theirs & ~ours].max())

