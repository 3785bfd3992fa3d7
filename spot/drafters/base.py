"""The drafter protocol: propose candidate future block states; know nothing of verification.

A drafter is untrusted input to the engine (it may come from a plugin, spot_eval.plugin): whatever it does, the output
stays the draft-free decoder's. It reads its own copies of what the engine keeps (`DraftContext`), its tree is
checked before anything reads it (`spot.tree.defect`) and copied, and whatever it raises or returns wrongly ends
its decoding with a `DraftError` that names it and the defect, never an error deep in the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from spot.config import DecodeConfig
from spot.tree import DraftTree, defect, unchecked


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
    prefix: [L] int64 on the CPU, the tokens before the block: the prompt and every committed block (what a
        lookup drafter matches against); the block's own prompt positions, if any, are in `state`.

    What the engine hands over is the drafter's to read, never to write: `state`, `stale_state`, `config` and every noise tensor
    `gumbel` returns are the drafter's own copies, and the engine reads neither the logits nor the hidden states
    again once a drafter has them (it keeps its own copies of what it records), so a write reaches nothing but the
    drafter's own later inputs.
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
    prefix: torch.Tensor | None = None


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


class DraftError(RuntimeError):
    """A drafter broke the contract: it raised, returned something that is not a well-formed tree for its context,
    or returned too few trees. `drafter` names it, `defect` says what it did; the decoding it drafted for stops, and
    at batch B > 1 (spot.engine.generations) the batch's other decodings with it."""

    def __init__(self, drafter: str, defect: str) -> None:
        super().__init__(f"drafter {drafter!r} {defect}")
        self.drafter, self.defect = drafter, defect


def name_of(drafter: object) -> str:
    """A drafter's name for messages (its `name`, else its class's)."""
    name = getattr(drafter, "name", None)
    return name if isinstance(name, str) else type(drafter).__name__


def draft_all(drafter: Drafter, ctxs: Sequence[DraftContext]) -> list[object]:
    """What the drafter returns for several requests' contexts: one `draft_batch` call where it has one, else `draft`
    one by one; one item per context, each still to check (`checked`).

    Raises:
        DraftError: the drafter raised (its exception the cause), or `draft_batch` gave another number of items.
    """
    batch = getattr(drafter, "draft_batch", None)
    try:
        trees = batch(ctxs) if batch is not None else [drafter.draft(ctx) for ctx in ctxs]
    except Exception as err:
        raise DraftError(name_of(drafter), f"raised {type(err).__name__}: {err}") from err
    if not isinstance(trees, (list, tuple)) or len(trees) != len(ctxs):
        got = f"{len(trees)} trees" if isinstance(trees, (list, tuple)) else f"a {type(trees).__name__}"
        raise DraftError(name_of(drafter), f"returned {got} from draft_batch for {len(ctxs)} contexts (one tree per context)")
    return list(trees)


def checked(drafter: Drafter, tree: object, root: torch.Tensor, budget: int, vocab_size: int, mask_id: int) -> DraftTree:
    """`tree` as the engine takes it: copied first, onto the CPU as plain tensors and tuples (each field read once,
    so that what is checked is what the engine keeps, and nothing the drafter holds reaches it), then checked to
    be a well-formed tree for the block state `root` [K] under `budget` (spot.tree.defect).

    Raises:
        DraftError: naming the drafter and the tree's first defect.
    """
    found = defect(tree, root, budget, vocab_size, mask_id, shallow=True)  # exact types first: no subclass's reads
    if found is None:
        try:
            copy = unchecked(tree.states.detach().to("cpu", copy=True), tuple(tuple(ps) for ps in tree.parents),
                             None if tree.scores is None else tuple(_number(v) for v in tree.scores),
                             None if tree.reach is None else tuple(_number(v) for v in tree.reach))
        except (TypeError, ValueError, RuntimeError, NotImplementedError) as err:
            raise DraftError(name_of(drafter), f"returned a tree that cannot be read ({type(err).__name__}: {err})") from err
        found = defect(copy, root, budget, vocab_size, mask_id)
    if found is not None:
        raise DraftError(name_of(drafter), f"returned {found}")
    return copy


def _number(value: object) -> float:
    """A score or reach as a float: a Python or numpy number, never a string or a tensor that computes on reading."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"a score or reach value {value!r} is not a number")
    return float(value)
