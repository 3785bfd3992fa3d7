"""Max-commit (spot.acceptance): the child it picks on literal inputs, its config check, and the engine under it
(lossy by design: more steps per forward than exact, outputs that may differ; exact and budget 0 unchanged)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import tiny_target

from spot import DecodeConfig, generate
from spot.acceptance import max_commit
from spot.drafters.sets import SetsDrafter, StaleSets
from spot.policy import Proposal

MASK = 9
NODE = [MASK, MASK, MASK, 4, MASK]
# The node's step proposes tokens 1, 2, 3, -, 5 with confidences 0.95, 0.92, 0.5, -, 0.97 (tau 0.9): the target
# commits {0, 1, 4}, the three that clear tau.
PROPOSAL = Proposal(torch.tensor([1, 2, 3, 4, 5]), torch.tensor([0.95, 0.92, 0.5, 1.0, 0.97], dtype=torch.float64))
TARGET = [1, 2, MASK, 4, 5]


def pick(*rows: list[int], proposal: Proposal = PROPOSAL, target: list[int] = TARGET) -> list[int]:
    return max_commit(torch.tensor([NODE, *rows]), torch.tensor(NODE), torch.tensor(target), proposal, 0.9, MASK).tolist()


def test_max_commit_takes_the_largest_drafted_subset_that_clears_tau_with_the_proposed_tokens():
    assert pick([1, MASK, MASK, 4, MASK],  # {0}: acceptable, one position
                [1, 2, 3, 4, MASK],  # {0, 1, 2}: position 2 is below tau
                [7, 2, MASK, 4, 5],  # {0, 1, 4} with another token at 0
                [1, MASK, MASK, 8, MASK],  # rewrites a committed position
                [1, 2, MASK, 4, MASK],  # {0, 1}: acceptable, two positions
                [MASK, 2, MASK, 4, 5],  # {1, 4}: as many, later
                ) == [1, 2, MASK, 4, MASK]


def test_the_targets_own_step_wins_when_drafted_and_stands_when_nothing_is_acceptable():
    assert pick([1, MASK, MASK, 4, MASK], TARGET) == TARGET  # the exact case: it commits every acceptable position
    assert pick([1, 2, 3, 4, MASK], [7, MASK, MASK, 4, MASK]) == TARGET  # nothing acceptable: the walk stops at the target's step
    assert pick() == TARGET  # the root alone (budget 0): the draft-free step
    # Nothing clears tau: the step commits the most confident position alone, and only that state is acceptable.
    unsure = Proposal(PROPOSAL.tokens, torch.tensor([0.6, 0.5, 0.5, 1.0, 0.4], dtype=torch.float64))
    leader = [1, MASK, MASK, 4, MASK]
    assert pick(leader, proposal=unsure, target=leader) == leader
    assert pick([MASK, 2, MASK, 4, MASK], proposal=unsure, target=leader) == leader


def test_max_commit_is_opt_in_and_needs_the_threshold_policy():
    assert DecodeConfig().acceptance == "exact"
    assert DecodeConfig(policy="threshold", acceptance="max_commit").acceptance == "max_commit"
    with pytest.raises(ValueError, match="max_commit accepts a drafted step whose every position clears the threshold, "
                                         "which the 'single' policy has no use of; use policy 'threshold' .the harness's unmasking=threshold, "
                                         "--unmasking threshold. or acceptance 'exact'"):
        DecodeConfig(acceptance="max_commit")
    with pytest.raises(ValueError, match="unknown acceptance 'greedy'; choose exact .lossless, the default. or max_commit"):
        DecodeConfig(policy="threshold", acceptance="greedy")


def test_max_commit_takes_more_steps_per_forward_and_may_change_the_output():
    """tau 0.5 on the tiny target, where threshold steps often commit several positions (on the embedded target at
    tau 0.9 every step commits one, and max-commit has no subset to take: README, SPOT-Sets)."""
    target = tiny_target(16)
    config = DecodeConfig(policy="threshold", threshold=0.5, block_length=16, gen_length=48, seed=2)
    drafter = SetsDrafter(StaleSets(((5.0, 0.0, 0.0),)))
    differ, forwards = 0, {"exact": 0, "max_commit": 0}
    for request, prompt in enumerate((list(range(1, 12)), list(range(20, 40)), list(range(5, 9)), list(range(30, 45)))):
        reference = generate(target, prompt, config, request=request)
        assert generate(target, prompt, replace(config, acceptance="max_commit"), request=request).token_ids == reference.token_ids
        got = {}
        for acceptance in forwards:
            got[acceptance] = generate(target, prompt, replace(config, budget=8, acceptance=acceptance), drafter=drafter, request=request)
            forwards[acceptance] += got[acceptance].stats.forwards
        assert got["exact"].token_ids == reference.token_ids
        exact, lossy = got["exact"].stats, got["max_commit"].stats
        assert lossy.steps / lossy.forwards >= exact.steps / exact.forwards
        differ += got["max_commit"].token_ids != reference.token_ids
    assert differ > 0 and forwards["max_commit"] <= forwards["exact"]
