"""The drafter protocol: propose candidate future block states; know nothing of verification."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from spot.config import DecodeConfig
from spot.tree import DraftTree


@dataclass(frozen=True)
class DraftContext:
    """What a drafter may read before the next verify forward.

    state: [K] the current block state (the root of the tree to propose).
    stale_logits: [K, V] the target's logits from the previous forward, at the state whose step
        produced `state` (None at a block's first step, when no logits of this block exist yet).
    stale_state: [K] that state (None with stale_logits None); where it is masked and `state` is
        not, the last step committed.
    prior_logits: [K, V] the logits behind the step before that one (None at a block's first two
        steps): what changed between them shows which positions are sharpening.
    request, block, step: the noise key of the root's step; a node d commits-steps deep
        is scored by the verifier with `gumbel(step + d)`.
    gumbel: the coupled noise of a step of this block ([K, V] float64, None at T = 0).
    mode: how to draft, one of the drafter's `modes` (budget=auto picks it, spot.sizing); None: the
        drafter's own default.
    stale_hidden: [K, d] the target's last hidden states (LM-head inputs) behind `stale_logits`, on
        the target's device and in its dtype (None with stale_logits None).
    model_dtype: the target's logits dtype (Target.logits_dtype), what a drafter that replays the policy passes
        to spot.policy.decide (confidence_dtype "model" computes in it); None: the logits' own.
    """

    state: torch.Tensor
    stale_logits: torch.Tensor | None
    stale_state: torch.Tensor | None
    prior_logits: torch.Tensor | None
    config: DecodeConfig
    mask_id: int
    request: int
    block: int
    step: int
    budget: int
    gumbel: Callable[[int], torch.Tensor | None]
    mode: str | None = None
    stale_hidden: torch.Tensor | None = None
    model_dtype: torch.dtype | None = None


@runtime_checkable
class Drafter(Protocol):
    name: str

    def draft(self, ctx: DraftContext) -> DraftTree:
        """A tree rooted at `ctx.state` with at most `ctx.budget` nodes beyond the root."""


# A drafter that budget=auto can size also has `modes: dict[str, tuple[float, ...]]`: each calibrated
# way it can draft (DraftContext.mode), with its mean reach by best-first rank; and its trees carry
# `reach` (spot.tree.DraftTree). A drafter with a network to run may also have
# `draft_batch(ctxs) -> list[DraftTree]`: several requests' trees, each the one `draft` gives it, with the
# network's calls shared (what batched decoding runs, spot.engine.generations).


def draft_all(drafter: Drafter, ctxs: Sequence[DraftContext]) -> list[DraftTree]:
    """The trees of several requests' contexts: in one `draft_batch` where the drafter has it, else one by one."""
    batch = getattr(drafter, "draft_batch", None)
    return batch(ctxs) if batch is not None else [drafter.draft(ctx) for ctx in ctxs]
