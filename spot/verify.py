"""Verification: the walk down a verified draft tree, which keeps exactly what the target itself would do.

Every method here (SPOT, SPOT-Sets, Spiffy, the reference drafters) drafts differently and verifies alike.
One target forward scores the current block state x_0 and the drafted states x_1 .. x_N together, giving
the logits l(x_i) of each as if it had been decoded alone. The walk then replays the draft-free decoder on
those logits:

    i, s <- 0, the block's step count
    loop:
        x' <- pi(x_i, l(x_i), g_s)        the target's own step: its policy on node i's logits, with step s's noise
        take x'                           a step of the draft-free trajectory
        stop if x' finishes the block, or no drafted x_j equals x'
        i, s <- min{j : x_j = x'}, s + 1

Why this is lossless: each taken state is computed by the policy pi from logits the target computed at
exactly the state it was taken from, with the noise g_s that the draft-free decoder draws at that step
(`spot.noise`: counter-keyed, so any step's noise can be regenerated). By induction on s the walk takes the
draft-free decoder's states, whatever the drafter proposed: a wrong draft costs verify compute, never
correctness. Parent links are not read; acceptance is state equality alone. The first step comes from the
root's logits, which the target needs anyway, so every forward advances at least one step (the free step),
and at budget 0 (the tree is the root alone) the walk *is* the draft-free decoder.

Glossary:
    node         one row of the tree: x_0 the current state (the root), x_1 .. x_N the drafted ones.
    pi           the step rule, `StepRule`: DecodeConfig's policy (spot.policy.decide) with the step's noise.
    own state    pi(x_i, l(x_i), g_s): where the target itself goes from node i.
    acceptance   which state the walk takes after the own state (spot.acceptance): `exact` takes the own
                 state (the default, lossless); `max_commit` (lossy, opt-in) may take a drafted subset of it.
    path         the steps the walk takes, one `Step` each: >= 1 per forward, the forward's accepted length.
    done         a predicate on a state: the block is finished (spot.engine.finished), so the walk stops.

Shapes (K block length, V vocabulary, N drafted nodes): states [N + 1, K] int64 on the CPU, row 0 the root;
logits [N + 1, K, V] on the target's device; each Step's state [K] on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from spot.acceptance import Acceptance, exact
from spot.config import DecodeConfig
from spot.policy import BLOCK, Proposal, Span, decide


@dataclass(frozen=True)
class StepRule:
    """pi: the target's own step from a state, given its logits, at step `s` of the block.

    noise: s -> the coupled noise of step s ([K, V] float64), or None where the config reads none.
    margins: keep each step's token margins in its proposal (spot.policy.Margins).
    where: names the request and block in an error ("request 3, block 0, ").
    model_dtype: the target's logits dtype (Target.logits_dtype), what confidence_dtype "model" computes in.
    span: s -> where the block lies in the row the reference ranks at step s (tie_break "topk"; Target.ranked_span);
        None: the block alone.
    """

    config: DecodeConfig
    mask_id: int
    noise: Callable[[int], torch.Tensor | None]
    margins: bool = False
    where: str = ""
    model_dtype: torch.dtype | None = None
    span: Callable[[int], Span] | None = None

    def __call__(self, state: torch.Tensor, logits: torch.Tensor, step: int) -> tuple[torch.Tensor, Proposal]:
        """(the own state [K] on the CPU, the proposal it was decided on) from `state` [K] and its `logits` [K, V]."""
        own, proposal = decide(state.to(logits.device), logits, self.noise(step), self.config, self.mask_id, step,
                               margins=self.margins, model_dtype=self.model_dtype,
                               span=BLOCK if self.span is None else self.span(step))
        own = own.cpu()
        # Every policy commits >= 1 position unless its inputs are broken, but a timestep step may commit none.
        if torch.equal(own, state.cpu()) and self.config.policy != "timestep":
            raise RuntimeError(f"{self.where}step {step}: the step committed no position; the policy's confidences "
                               "are not numbers (check the sampling settings and the logits)")
        return own, proposal


@dataclass(frozen=True)
class Step:
    """One step of the path: from node `node` (whose logits decided it) to `state` [K]."""

    node: int
    state: torch.Tensor
    proposal: Proposal


def walk(
    states: torch.Tensor,
    logits: torch.Tensor,
    rule: StepRule,
    step: int,
    done: Callable[[torch.Tensor], bool],
    accept: Acceptance = exact,
) -> tuple[Step, ...]:
    """The steps the target takes through a verified tree (the module docstring), from the root at block step `step`.

    Args:
        states: [N + 1, K] the verified states, row 0 the root.
        logits: [N + 1, K, V] the verify's logits at each of them.
        done: True for a state that finishes the block (the walk stops there).
        accept: the acceptance rule (spot.acceptance); `exact` keeps the output the draft-free decoder's.
    Returns:
        >= 1 steps; the last one's state is where the block goes on from.
    """
    path: list[Step] = []
    node = 0
    while True:
        own, proposal = rule(states[node], logits[node], step + len(path))
        state = accept(states, states[node], own, proposal)
        path.append(Step(node, state, proposal))
        if done(state):
            return tuple(path)
        match = torch.nonzero((states == state).all(dim=1))  # [M, 1]: the drafted nodes equal to it
        if match.numel() == 0:
            return tuple(path)
        node = int(match[0])
