"""bench/token_refresh.py on literal blocks: the rows the head reads, the stale baseline it is set beside, and the
perfect-order walk that turns right tokens into commits per forward."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import torch
from test_token_drift import M, block

SPEC = importlib.util.spec_from_file_location("token_refresh", Path(__file__).parent.parent / "bench" / "token_refresh.py")
REFRESH = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(REFRESH)


def with_hidden(b):
    return dataclasses.replace(b, hidden=torch.arange(4 * 4 * 3, dtype=torch.float32).reshape(4, 4, 3))  # [S, K, R]


def test_each_row_reads_the_stale_candidates_and_the_neighbours_new_tokens():
    rows = REFRESH.examples([with_hidden(block())], max_staleness=2)
    # steps 1..3 commit one position each, at Δ = 1 and (from step 2) Δ = 2: 1 + 2 + 2 rows
    assert rows["step"].tolist() == [1, 2, 2, 3, 3] and rows["delta"].tolist() == [1, 1, 2, 1, 2]
    assert rows["label"].tolist() == [6, 7, 7, 8, 8]
    # step 2 commits position 3 with 7; Δ = 1 reads step 1's candidates there (2 first, 7 second) and the one
    # neighbour committed since: position 1's 6, two to the left
    assert rows["ids"][1].tolist() == [2, 7]
    offsets = list(REFRESH.OFFSETS)
    assert rows["nb_new"][1].sum() == 1 and rows["nb_tok"][1, offsets.index(-2)] == 6
    # Δ = 2 reads step 0's distribution: since then positions 0 and 1 took 5 and 6
    assert rows["nb_new"][2].sum() == 2 and rows["nb_tok"][2, offsets.index(-3)] == 5
    # the fresh distribution behind step 2 at position 3 ranks 7 first, so the soft target puts 7 above 2
    assert rows["fresh"][1, 1] > rows["fresh"][1, 0]
    assert rows["hidden"][1].tolist() == with_hidden(block()).hidden[1, 3].tolist()
    stale = REFRESH.drawn(rows["lp"], rows)
    assert (stale == rows["label"]).tolist() == [True, False, True, False, True]
    assert int(M) not in rows["label"].tolist()


def test_the_walk_accepts_a_node_only_below_right_ones():
    b = block()  # four steps
    everything = {(0, t, d): True for t in range(4) for d in range(1, 9)}
    assert REFRESH.replay([b], everything, budget=8).tolist() == [[4.0, 2.0]]  # step 0 free, then steps 1-3 at once
    assert REFRESH.replay([b], {}, budget=8).tolist() == [[4.0, 4.0]]  # nothing drafted right: one step a forward
    assert REFRESH.replay([b], everything, budget=1).tolist() == [[4.0, 3.0]]  # steps 0, 1+2, 3
    wrong_at_depth_two = {**everything, (0, 2, 2): False}
    assert REFRESH.replay([b], wrong_at_depth_two, budget=8).tolist() == [[4.0, 3.0]]  # root 1 takes two steps, not three
