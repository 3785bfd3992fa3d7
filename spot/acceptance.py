"""Acceptance rules: which state the walk (spot.verify) moves to after the target's own step from a node.

`exact` (the default, `DecodeConfig(acceptance="exact")`) takes the target's own state: the walk goes on only
where that exact state was drafted, so the output is the draft-free decoder's.

`max_commit` is SPOT-Sets' lossy, opt-in rule (`acceptance="max_commit"`). Under the threshold policy the
target's step commits T = every masked position whose confidence clears tau, and the most confident one in
any case. Max-commit [INF: our definition of the issue's sketch; the paper names the rule, not its terms]
also accepts a drafted state one step below the node that commits a non-empty subset S of the positions
masked at the node, where every position of S clears tau under the node's logits with the token the node's
step proposes (the same `Proposal` the target's own step is decided on, so the node step's noise at T > 0).
Such an S lies inside T; among the acceptable states the walk takes the one committing the most positions,
ties to the earliest node. The target's own state, when drafted, commits all of T and so is always the one
taken: the exact case. Otherwise the walk goes on from the subset (whose logits the verify forward
computed) instead of stopping at T, leaving T's other positions masked for a later step: more steps per
forward but fewer positions per step (whether it saves forwards depends on the target: README, SPOT-Sets),
and an output that differs from the draft-free decoder's by design.

Both have the signature `Acceptance`: (tree_states [N + 1, K], node [K], own [K], proposal) -> [K].
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from spot.config import DecodeConfig
from spot.policy import Proposal

Acceptance = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Proposal], torch.Tensor]


def exact(tree_states: torch.Tensor, node: torch.Tensor, own: torch.Tensor, proposal: Proposal) -> torch.Tensor:
    """The target's own state, whatever was drafted: the lossless rule."""
    return own


def max_commit(
    tree_states: torch.Tensor, node: torch.Tensor, target: torch.Tensor, proposal: Proposal, threshold: float, mask_id: int
) -> torch.Tensor:
    """The state the walk steps to from `node` under max-commit: the acceptable drafted state that commits
    the most positions (ties to the earliest row), or `target` when none is (the walk then stops there).

    Args:
        tree_states: [N + 1, K] the verified states (any node may serve: acceptance reads states, not
            parent links, as the exact rule does).
        node: [K] the state whose logits the step was decided on.
        target: [K] the state the target's own step reaches from `node`.
        proposal: [K] tokens and confidences of that step.
    Returns:
        [K] one row of `tree_states`, or `target`.
    """
    masked = node == mask_id  # [K]
    changed = tree_states != node  # [N + 1, K]
    sure = masked & (proposal.confidence.cpu() >= threshold)  # [K]: a position the target would commit anyway
    agrees = tree_states == proposal.tokens.cpu()  # [N + 1, K]
    subset = changed.any(1) & ~(changed & ~(sure & agrees)).any(1)  # [N + 1]
    own = (tree_states == target).all(1)  # [N + 1]: the exact case
    commits = changed.sum(1).masked_fill(~(subset | own), -1)  # [N + 1]
    best = int(torch.argmax(commits))  # the first of the maxima
    return tree_states[best] if commits[best] > 0 else target


def acceptance_of(config: DecodeConfig, mask_id: int) -> Acceptance:
    """The rule `config.acceptance` names, bound to the config's threshold."""
    if config.acceptance == "max_commit":
        return partial(max_commit, threshold=config.threshold, mask_id=mask_id)
    return exact
