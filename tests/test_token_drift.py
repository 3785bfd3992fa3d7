"""bench/token_drift.py on literal blocks: where each committed token ranks under the distributions recorded
before its step, and the chain bound those shares give."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from spot.drafters.order_examples import RecordedBlock
from spot.drafters.order_model import step_noise_at_topk

SPEC = importlib.util.spec_from_file_location("token_drift", Path(__file__).parent.parent / "bench" / "token_drift.py")
DRIFT = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(DRIFT)

M = 9  # the mask id


def block(temperature: float = 0.0) -> RecordedBlock:
    """K = 4, one commit a step: position 0 <- 5, then 1 <- 6, then 3 <- 7, then 2 <- 8. The top-2 behind each
    step (ids best first at T = 0): step 0's puts every final token first; step 1's has 7 second at position 3;
    step 2's puts 4 first at position 2, so 8 is second there; step 3's is right everywhere."""
    states = torch.tensor([[M, M, M, M], [5, M, M, M], [5, 6, M, M], [5, 6, M, 7], [5, 6, 8, 7]])
    first = [[5, 1], [6, 1], [8, 1], [7, 1]]
    ids = torch.tensor([first, [[5, 1], [6, 1], [8, 1], [2, 7]], [[5, 1], [6, 1], [4, 8], [7, 1]], first])  # [S, K, 2]
    lp = torch.log(torch.tensor([0.6, 0.3])).expand(4, 4, 2).clone()
    return RecordedBlock(states, lp, ids, M, seed=0, request=0, block=0, temperature=temperature)


def test_each_commit_is_ranked_under_each_earlier_distribution():
    b = block()
    assert DRIFT.committed_ranks(b, 1, 1) == [(1, 0)]  # 6 first at position 1 behind step 0
    assert DRIFT.committed_ranks(b, 2, 1) == [(3, 1)]  # 7 second at position 3 behind step 1
    assert DRIFT.committed_ranks(b, 2, 2) == [(3, 0)]
    assert DRIFT.committed_ranks(b, 3, 1) == [(2, 1)]  # 8 second at position 2 behind step 2
    assert DRIFT.committed_ranks(b, 3, 3) == [(2, 0)]


def test_the_shares_and_the_chain_bound():
    rows = {r["staleness"]: r for r in DRIFT.drift([block()], 3)}
    # Δ = 1: steps 1, 2, 3 ranked behind steps 0, 1, 2: first, second, second.
    assert rows[1]["commits"] == 3 and rows[1]["top1"] == pytest.approx(1 / 3) and rows[1]["top2"] == 1.0
    # Δ = 2: steps 2, 3 behind steps 0, 1: first, first. Δ = 3: step 3 behind step 0: first.
    assert rows[2]["commits"] == 2 and rows[2]["top1"] == 1.0 and rows[3]["top1"] == 1.0
    assert rows[3]["chain_bound"] == pytest.approx(1 + 1 / 3 + 1 / 3 + 1 / 3)
    # Beside the last commit: steps 1 (position 1 after 0; first) and 3 (position 2 after 3; second); away from
    # it: step 2 (position 3 after 1; second).
    assert rows[1]["top1_adjacent"] == pytest.approx(1 / 2) and rows[1]["top1_far"] == 0.0


def test_the_intervals_hold_the_share_and_a_single_block_has_none_wider():
    rows = DRIFT.drift([block(), block()], 2, resamples=50)
    assert all(r["top1_low"] <= r["top1"] <= r["top1_high"] for r in rows)
    assert rows[0]["top1_low"] == rows[0]["top1_high"] == pytest.approx(1 / 3)  # identical blocks: every resample agrees


def test_at_t1_the_ranking_is_the_steps_coupled_draw():
    b = block(temperature=1.0)
    noise = step_noise_at_topk(0, 0, 0, 2, b.topk_ids[1].long())  # step 2's draw at the ids recorded behind step 1
    scores = b.topk_logprobs[1].double() + noise
    expected = 0 if int(b.topk_ids[1, 3][scores[3].argmax()]) == 7 else 1
    assert DRIFT.committed_ranks(b, 2, 1) == [(3, expected)]


REPLAY_SPEC = importlib.util.spec_from_file_location("drafter_replay", Path(__file__).parent.parent / "bench" / "drafter_replay.py")
REPLAY = importlib.util.module_from_spec(REPLAY_SPEC)
REPLAY_SPEC.loader.exec_module(REPLAY)


def test_the_perfect_order_tree_branches_where_the_calibrated_ranks_say():
    b = block()
    assert REPLAY.true_ranks(b, 1, 3) == [0, 0]  # steps 1 and 2 behind step 0 (the block's last step is never drafted)
    assert REPLAY.true_ranks(b, 2, 3) == [1]
    # Depth 0 holds rank 0 and rank 1 once each, so a 2-node tree takes both first tokens and no second depth:
    # from root 1 it accepts one drafted state (2 commits), then the last step goes alone: 4 commits in 3 forwards.
    assert REPLAY.order_oracle_tree([b], 2) == pytest.approx(4 / 3)
    assert REPLAY.order_oracle_top1([b], 2) == pytest.approx(4 / 2)  # the top-1 chain takes both steps from root 1
