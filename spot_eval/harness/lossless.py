"""The losslessness diff: each method's tokens against the draft-free tokens of the same request.

A divergence is a bug until shown to be a numerics tie, so each one carries the index of the first
divergent token and the target's logit margin (top-1 minus top-2) at the step where the draft-free
run committed that position: a margin near 0 is a near-tie that another kernel may flip; a wide
margin is a bug.
"""

from __future__ import annotations

from dataclasses import dataclass

from spot import Generation


@dataclass(frozen=True)
class Divergence:
    index: int  # first output token that differs
    margin: float | None  # top-1 minus top-2 logit at the draft-free step that wrote it (None past its end)


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

    @property
    def label(self) -> str:
        return "draft_free" if self.method == "draft_free" else f"{self.method}@{self.budget}"

    @property
    def lossless(self) -> bool:
        return self.divergence is None

    @classmethod
    def of(cls, method: str, budget: int, got: Generation, reference: Generation, n_prompt: int) -> MethodRecord:
        s = got.stats
        return cls(
            method, budget, got.token_ids, s.forwards, s.steps, s.seconds, s.target_seconds, s.drafter_seconds,
            s.accepted_lengths, diverge(got.token_ids, reference, n_prompt),
        )


def first_difference(a: tuple[int, ...], b: tuple[int, ...]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def diverge(tokens: tuple[int, ...], reference: Generation, n_prompt: int) -> Divergence | None:
    """None when identical; else where, and the margin there (needs reference record_topk >= 2)."""
    index = first_difference(tokens, reference.token_ids)
    if index is None:
        return None
    return Divergence(index=index, margin=_margin(reference, n_prompt + index))


def _margin(reference: Generation, position: int) -> float | None:
    for trace in reference.trajectory or ():
        k = trace.states.shape[1]
        if trace.block != position // k or trace.topk_logprobs is None:
            continue
        column = trace.states[:, position % k]  # [S + 1]
        written = (column[1:] != column[:-1]).nonzero()
        if written.numel() == 0:
            return None
        step = int(written[0])
        top = trace.topk_logprobs[step, position % k]  # [k] log-softmax: differences are logit differences
        return float(top[0] - top[1])
    return None
