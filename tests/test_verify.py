"""The verification walk (spot.verify) on literal hand-made trees: which steps it takes, from which nodes.

Block of K = 4 positions, vocabulary V = 6, mask M = 5. The logits at each state are literal too: `peaks`
puts one logit per masked position above a flat row, so the single policy commits the highest peak (its
position), with the peak's token. A state the walk meets without a row in `LOGITS` would fail the test.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from spot import DecodeConfig, Sampling
from spot.acceptance import acceptance_of, exact
from spot.policy import next_state
from spot.verify import StepRule, walk

M, K, V = 5, 4, 6


def peaks(*commits: tuple[int, int, float]) -> torch.Tensor:
    """[K, V] logits: for each (position, token, height), that token's logit at that position is `height`, every
    other logit 0. The single policy commits the highest (position, token)."""
    logits = torch.zeros(K, V)
    for position, token, height in commits:
        logits[position, token] = height
    return logits


# What the target does from each state: its logits there (the target's own trajectory is
# [M M M M] -> [M 2 M M] -> [M 2 M 3] -> [1 2 M 3] -> [1 2 4 3]).
LOGITS = {
    (M, M, M, M): peaks((1, 2, 9.0), (3, 3, 7.0), (0, 1, 5.0), (2, 4, 3.0)),
    (M, 2, M, M): peaks((3, 3, 8.0), (0, 1, 6.0), (2, 4, 4.0)),
    (M, 2, M, 3): peaks((0, 1, 8.0), (2, 4, 4.0)),
    (1, 2, M, 3): peaks((2, 4, 6.0)),
    # states off the trajectory (drafted wrongly), with logits of their own
    (M, M, M, 3): peaks((1, 0, 9.0), (0, 1, 2.0), (2, 4, 1.0)),
    (M, 2, 4, M): peaks((3, 3, 9.0), (0, 1, 1.0)),
    (1, M, M, M): peaks((1, 2, 9.0), (2, 4, 1.0), (3, 3, 1.0)),
    (M, 2, 4, 3): peaks((0, 1, 5.0)),
    (1, 2, M, M): peaks((3, 3, 8.0), (2, 4, 2.0)),
}
TRAJECTORY = [(M, M, M, M), (M, 2, M, M), (M, 2, M, 3), (1, 2, M, 3), (1, 2, 4, 3)]


def verify(*nodes: tuple[int, ...], dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """The tree's states [N + 1, K] (the root first) and the verify's logits [N + 1, K, V] at them."""
    states = torch.tensor([TRAJECTORY[0], *nodes])
    return states, torch.stack([LOGITS[tuple(s)] for s in states.tolist()]).to(dtype)


SINGLE = StepRule(DecodeConfig(block_length=K), M, lambda step: None)


def full(state: torch.Tensor) -> bool:
    return M not in state.tolist()


def taken(states, logits, rule=SINGLE, accept=exact, done=full, step=0) -> list[tuple[int, list[int]]]:
    """The walk as (node each step was decided at, the state it reached)."""
    return [(s.node, s.state.tolist()) for s in walk(states, logits, rule, step, done, accept)]


def test_a_chain_of_the_targets_own_states_is_taken_to_the_end_of_the_block():
    states, logits = verify(TRAJECTORY[1], TRAJECTORY[2], TRAJECTORY[3])
    assert taken(states, logits) == [(0, [M, 2, M, M]), (1, [M, 2, M, 3]), (2, [1, 2, M, 3]), (3, [1, 2, 4, 3])]


def test_a_branching_tree_is_followed_down_the_branch_the_target_takes():
    # node 1 is a wrong sibling of node 2; nodes 3 (wrong) and 4 (right) are children of node 2, which the
    # walk reaches; node 5 hangs below the wrong node 1 and is never visited
    states, logits = verify((M, M, M, 3), TRAJECTORY[1], (M, 2, 4, M), TRAJECTORY[2], (1, M, M, M))
    assert taken(states, logits) == [(0, [M, 2, M, M]), (2, [M, 2, M, 3]), (4, [1, 2, M, 3])]


def test_a_miss_at_the_root_still_takes_the_free_step():
    states, logits = verify((M, M, M, 3), (1, M, M, M))
    assert taken(states, logits) == [(0, [M, 2, M, M])]


def test_a_miss_deep_down_keeps_the_steps_above_it():
    states, logits = verify(TRAJECTORY[1], TRAJECTORY[2], (M, 2, 4, 3), (M, 2, 4, M))  # depth 3 drafted as [M 2 4 3]
    assert taken(states, logits) == [(0, [M, 2, M, M]), (1, [M, 2, M, 3]), (2, [1, 2, M, 3])]


def test_a_tree_whose_every_node_is_wrong_advances_one_step_from_the_root():
    wrong = [(M, M, M, 3), (1, M, M, M), (M, 2, 4, M)]
    states, logits = verify(*wrong)
    assert taken(states, logits) == [(0, [M, 2, M, M])]


def test_the_root_alone_is_the_draft_free_step():
    states, logits = verify()
    config = DecodeConfig(block_length=K)
    assert taken(states, logits) == [(0, next_state(states[0], logits[0], None, config, M).tolist())]


def test_the_walk_stops_where_the_block_is_done_even_with_drafted_states_below():
    states, logits = verify(TRAJECTORY[1], TRAJECTORY[2])
    assert taken(states, logits, done=lambda s: s.tolist() == [M, 2, M, M]) == [(0, [M, 2, M, M])]


def test_the_first_equal_node_is_the_one_followed():
    states, logits = verify((M, M, M, 3), TRAJECTORY[1], TRAJECTORY[1])
    assert [node for node, _ in taken(states, logits)] == [0, 2]  # node 2, the earlier of the two equal rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_walk_is_the_same_in_fp32_and_bf16_logits(dtype):
    """The policy computes in float64 from the logits as given; these literal logits are exact in bf16, so the
    path must not move."""
    states, logits = verify(TRAJECTORY[1], TRAJECTORY[2], (M, 2, 4, M), TRAJECTORY[3], dtype=dtype)
    assert logits.dtype == dtype
    assert taken(states, logits) == [(0, [M, 2, M, M]), (1, [M, 2, M, 3]), (2, [1, 2, M, 3]), (4, [1, 2, 4, 3])]


def test_each_step_reads_the_noise_of_its_own_block_step():
    """At T > 0 the step from a node d steps below the root draws with step s + d's noise: the coupling."""
    asked = []

    def noise(step: int) -> torch.Tensor:
        asked.append(step)
        return torch.zeros(K, V, dtype=torch.float64)  # no change to the argmax: the path is the T = 0 one

    rule = StepRule(DecodeConfig(block_length=K, sampling=Sampling(temperature=1.0)), M, noise)
    states, logits = verify(TRAJECTORY[1], TRAJECTORY[2])
    assert [node for node, _ in taken(states, logits, rule, step=7)] == [0, 1, 2]
    assert asked == [7, 8, 9]


def test_noise_that_changes_a_draw_sends_the_walk_off_the_drafted_chain():
    """At step 1 the noise makes position 3 draw token 0 instead of 3, a token of low probability, so position 0
    is the most confident: [1 2 M M] is not drafted, and the walk stops there (where the draft-free decoder,
    drawing with the same noise, goes too)."""
    def noise(step: int) -> torch.Tensor:
        g = torch.zeros(K, V, dtype=torch.float64)
        if step == 1:
            g[3, 0] = 20.0
        return g

    rule = StepRule(DecodeConfig(block_length=K, sampling=Sampling(temperature=1.0)), M, noise)
    states, logits = verify(TRAJECTORY[1], TRAJECTORY[2])
    assert taken(states, logits, rule) == [(0, [M, 2, M, M]), (1, [1, 2, M, M])]


def test_max_commit_moves_to_a_drafted_subset_of_the_threshold_step():
    """Threshold policy, tau 0.9: from the root the target commits positions 1 and 3 (both clear tau). Exact
    acceptance stops at that state, which is not drafted; max-commit takes the drafted subset [M 2 M M] and
    goes on from its logits. Softmax over 6 tokens: a logit of 9 gives p = 0.996, one of 3 gives 0.80."""
    config = DecodeConfig(policy="threshold", block_length=K, threshold=0.9)
    rule = StepRule(config, M, lambda step: None)
    states, logits = verify(TRAJECTORY[1], (1, 2, M, M))
    logits[0] = peaks((1, 2, 9.0), (3, 3, 8.0), (0, 1, 3.0))
    assert taken(states, logits, rule) == [(0, [M, 2, M, 3])]
    # From node 1 the target commits positions 0, 2 and 3; max-commit takes the drafted subset {0} again
    # (node 2), whose step then commits position 3 alone, which is not drafted: the walk stops.
    assert taken(states, logits, rule, accept=acceptance_of(replace(config, acceptance="max_commit"), M)) == [
        (0, [M, 2, M, M]), (1, [1, 2, M, M]), (2, [1, 2, M, 3])]


def test_a_timestep_step_may_commit_nothing_and_the_next_step_reads_the_same_node():
    """Dream's schedule: int(n (1 - s/t)) of n masked positions, 0 at an early step of a long schedule."""
    config = DecodeConfig(policy="timestep", block_length=K, steps=K)
    rule = StepRule(config, M, lambda step: None)
    assert config.commit_count(0, K) == 0
    states, logits = verify(TRAJECTORY[1])
    path = taken(states, logits, rule)
    assert path[0] == (0, [M, M, M, M])  # step 0 commits nothing: the same state, the same node
    assert [node for node, _ in path[:2]] == [0, 0]


def test_a_step_that_commits_nothing_under_another_policy_is_an_error_naming_where(monkeypatch):
    """Only a bug or broken numbers can make a policy step commit nothing: the walk would loop on the root."""
    import spot.verify

    real = spot.verify.decide
    monkeypatch.setattr(spot.verify, "decide", lambda state, *args, **kwargs: (state, real(state, *args, **kwargs)[1]))
    rule = StepRule(DecodeConfig(block_length=K), M, lambda step: None, where="request 3, block 2, ")
    with pytest.raises(RuntimeError, match="request 3, block 2, step 4: the step committed no position"):
        walk(*verify(), rule, 4, full)
