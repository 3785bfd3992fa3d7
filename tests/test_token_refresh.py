"""bench/token_refresh.py on a literal block: the perfect-order walk that turns right tokens into commits per forward
(the head and its examples: tests/test_refresh.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from test_token_drift import block

SPEC = importlib.util.spec_from_file_location("token_refresh", Path(__file__).parent.parent / "bench" / "token_refresh.py")
REFRESH = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(REFRESH)


def test_the_walk_accepts_a_node_only_below_right_ones():
    b = block()  # four steps
    everything = {(0, t, d): True for t in range(4) for d in range(1, 9)}
    assert REFRESH.replay([b], everything, budget=8).tolist() == [[4.0, 2.0]]  # step 0 free, then steps 1-3 at once
    assert REFRESH.replay([b], {}, budget=8).tolist() == [[4.0, 4.0]]  # nothing drafted right: one step a forward
    assert REFRESH.replay([b], everything, budget=1).tolist() == [[4.0, 3.0]]  # steps 0, 1+2, 3
    wrong_at_depth_two = {**everything, (0, 2, 2): False}
    assert REFRESH.replay([b], wrong_at_depth_two, budget=8).tolist() == [[4.0, 3.0]]  # root 1 takes two steps, not three
