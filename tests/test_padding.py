"""The forwards a decode spends after its answer's first EOS, on literal trajectories, and on a real decode."""

from __future__ import annotations

import torch
from conftest import MASK_ID, tiny_target

from spot import DecodeConfig, generate
from spot.engine import BlockTrace, DecodeStats, Generation
from spot_eval.harness.padding import after_eos_forwards

M, E = 9, 7  # mask and EOS of the literal trajectories


def generation(states: list[list[int]], lengths: tuple[int, ...], tokens: tuple[int, ...], finish: str = "eos") -> Generation:
    stats = DecodeStats(len(lengths), sum(lengths), lengths, 0.0, ())
    return Generation(tokens, None, finish, stats, (BlockTrace(0, torch.tensor(states)),))


def test_a_forward_counts_as_padding_only_when_every_step_it_took_wrote_after_the_first_eos():
    # A block of 4, answer [1] then EOS at generated index 1: padding is written at positions 3 and 2 first.
    states = [[M, M, M, M], [M, M, M, E], [M, M, E, E], [1, M, E, E], [1, E, E, E]]
    assert after_eos_forwards(generation(states, (1, 1, 1, 1), (1,)), frozenset({E}), M) == 2  # steps 1, 2
    assert after_eos_forwards(generation(states, (2, 2), (1,)), frozenset({E}), M) == 1  # the first forward took both
    assert after_eos_forwards(generation(states, (1, 2, 1), (1,)), frozenset({E}), M) == 1  # the second mixes
    assert after_eos_forwards(generation(states, (4,), (1,)), frozenset({E}), M) == 0
    assert after_eos_forwards(generation(states, (1, 1, 1, 1), (1,), "length"), frozenset({E}), M) == 0  # no EOS


def test_a_prompt_inside_the_first_block_is_not_counted_as_generated():
    # Positions 0-1 hold the prompt; generated index 0 is position 2, where the EOS lands; position 3 is padding.
    states = [[5, 6, M, M], [5, 6, M, E], [5, 6, E, E]]
    assert after_eos_forwards(generation(states, (1, 1), ()), frozenset({E}), M) == 1


def test_on_a_real_decode_the_padding_forwards_are_at_most_the_forwards():
    target = tiny_target()
    config = DecodeConfig(block_length=16, gen_length=48, stop_at_eos=True)
    got = generate(target, [1, 2, 3, 4, 5], config, record=True)
    n = after_eos_forwards(got, target.eos_ids, MASK_ID)
    assert 0 <= n <= got.stats.forwards  # the trajectory's steps and the accepted lengths line up (no IndexError)
