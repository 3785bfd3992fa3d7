"""Max-commit: the lossy, opt-in acceptance rule of SPOT-Sets (`DecodeConfig(acceptance="max_commit")`).

The exact rule (the default) moves the walk to a drafted node only when it equals the state the target
itself reaches, so the output is the draft-free decoder's. Under the threshold policy the target's step
commits T = every masked position whose confidence clears tau, and the most confident one in any case.
Max-commit [INF: our definition of the issue's sketch; the paper names the rule, not its terms] also
accepts a drafted state one step below the node that commits a non-empty subset S of the positions
masked at the node, where every position of S clears tau under the node's logits with the token the
node's step proposes (the same `Proposal` the target's own step is decided on, so the node step's noise
at T > 0). Such an S lies inside T; among the acceptable states the walk takes the one committing the
most positions, ties to the earliest node. The target's own state, when drafted, commits all of T and
so is always the one taken: the exact case. Otherwise the walk goes on from the subset (whose logits the
verify forward computed) instead of stopping at T, leaving T's other positions masked for a later step:
more steps per forward but fewer positions per step (whether it saves forwards depends on the target:
README, SPOT-Sets), and an output that differs from the draft-free decoder's by design.
"""

from __future__ import annotations

import torch

from spot.policy import Proposal


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
