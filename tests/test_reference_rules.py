"""The reference generators' decoding rules (LLaDA's generate.py, Dream's diffusion_generate, Fast-dLLM): each
confidence rule with literal inputs, writing every block to gen_length, blocks from the prompt's end on the
dual-cache targets; and every rule lossless under every drafter (SPOT, Spiffy, SPOT-Sets' stale sets, random,
adversarial, oracle), at both temperatures, in fp32 and bf16, on both kinds of target."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from conftest import EOS_ID, MASK_ID, VOCAB, tiny_target
from test_dual_cache import EOS, MASK, TARGETS
from test_engine import AUTO, drafters, mid_block_token, prompt_ids, run
from test_spiffy import calibrated

from spot import DecodeConfig, Sampling, generate
from spot.config import CONFIDENCES
from spot.drafters import OracleDrafter
from spot.drafters.sets import SetsDrafter, StaleSets
from spot.drafters.spiffy import SpiffyDrafter
from spot.noise import gumbel
from spot.policy import confidence_of, propose, select
from spot.targets import DualCacheTarget

# -- the rules, with literal inputs --------------------------------------------------------------

PROBS = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.9, 0.05, 0.05, 0.0], [0.4, 0.4, 0.2, 0.0]], dtype=torch.float64)  # [K=3, V=4]
DRAWN = torch.tensor([1, 0, 0])  # the tokens drawn (at T > 0 not always the top one)


def test_probability_is_the_drawn_tokens():
    assert confidence_of("probability", PROBS, DRAWN, None, 3).tolist() == [0.3, 0.9, 0.4]


def test_margin_is_top_one_minus_top_two_whatever_was_drawn():
    assert confidence_of("margin", PROBS, DRAWN, None, 3).tolist() == pytest.approx([0.2, 0.85, 0.0])


def test_entropy_ranks_by_negative_entropy():
    def h(*p):
        return -sum(x * math.log(x) for x in p if x > 0)

    expected = [math.exp(-h(0.5, 0.3, 0.2)), math.exp(-h(0.9, 0.05, 0.05)), math.exp(-h(0.4, 0.4, 0.2))]
    got = confidence_of("entropy", PROBS, DRAWN, None, 3)
    assert got.tolist() == pytest.approx(expected, rel=1e-12)
    assert torch.argsort(got, descending=True).tolist() == [1, 0, 2]  # the peaked position first


def test_random_is_the_uniform_behind_the_noise_at_the_mask_token():
    noise = torch.zeros(3, 4, dtype=torch.float64)
    noise[:, 3] = torch.tensor([0.0, 2.0, -1.0])  # Gumbel values at the mask token's entry
    got = confidence_of("random", PROBS, DRAWN, noise, 3)
    assert got.tolist() == pytest.approx([math.exp(-1.0), math.exp(-math.exp(-2.0)), math.exp(-math.e)])
    with pytest.raises(ValueError, match="confidence 'random' ranks positions by the step's noise"):
        confidence_of("random", PROBS, DRAWN, None, 3)


def test_ties_go_to_the_leftmost_position_under_every_rule():
    logits = torch.zeros(4, VOCAB)
    logits[:, 5] = 3.0  # four identical positions
    noise = gumbel(7, 4, VOCAB)
    noise[:, MASK_ID] = 0.0  # equal draws at the mask entry: a tie under "random" too
    masked = torch.ones(4, dtype=torch.bool)
    for rule in CONFIDENCES:
        confidence = propose(logits, noise, Sampling(), MASK_ID, confidence=rule).confidence
        assert select(masked, confidence, DecodeConfig()).tolist() == [True, False, False, False], rule


def test_bad_rules_are_named():
    with pytest.raises(ValueError, match="unknown confidence 'low'; choose one of probability, margin, entropy, random"):
        DecodeConfig(confidence="low")
    with pytest.raises(ValueError, match="stop_at_eos must be True or False, got 'no'"):
        DecodeConfig(stop_at_eos="no")


# -- writing every block -------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_without_stop_at_eos_every_block_is_written_and_the_answer_is_the_same(temperature):
    target = tiny_target(16, seed=3, eos_ids=frozenset())
    prompt, config = prompt_ids(3, 21), DecodeConfig(block_length=16, gen_length=70, sampling=Sampling(temperature), seed=1)
    free = generate(target, prompt, config)
    eos, index = mid_block_token(free, 16)
    target.eos_ids = frozenset({eos})
    stopped = generate(target, prompt, config, decode=str)
    written = generate(target, prompt, replace(config, stop_at_eos=False), decode=str)
    assert stopped.finish_reason == written.finish_reason == "eos"
    assert len(written.token_ids) == 70 and written.token_ids[index] == eos  # the padding after the EOS is kept
    assert written.token_ids[:index] == stopped.token_ids and written.text == stopped.text == str(list(stopped.token_ids))
    assert written.stats.forwards > stopped.stats.forwards  # the blocks after the EOS cost forwards, as in the references
    assert eos not in free.token_ids[:index]


# -- blocks from the prompt's end ----------------------------------------------------------------


class Starts:
    """A target that notes where each verify's block starts."""

    def __init__(self, target) -> None:
        self.target, self.starts = target, []

    def __getattr__(self, name):
        return getattr(self.target, name)

    def verify(self, pieces, start, *ahead):
        self.starts.append(start)
        return self.target.verify(pieces, start, *ahead)


@pytest.mark.parametrize("name", list(TARGETS))
def test_dual_cache_blocks_start_at_the_prompts_end_and_block_causal_ones_on_the_grid(name):
    build, _, shift = TARGETS[name]
    config = DecodeConfig(block_length=8, gen_length=16, stop_at_eos=False)
    prompt = list(range(1, 12))  # 11 tokens
    dual = Starts(DualCacheTarget(build(seed=1), MASK, frozenset({EOS}), 8, shift=shift))
    assert dual.blocks_at_prompt_end and len(generate(dual, prompt, config).token_ids) == 16
    assert sorted(set(dual.starts)) == [11, 19]  # LLaDA's generate.py: prompt_len + b * block_length
    grid = Starts(DualCacheTarget(build(seed=1), MASK, frozenset({EOS}), 8, shift=shift, blocks_at_prompt_end=False))
    generate(grid, prompt, config)
    assert sorted(set(grid.starts)) == [8, 16, 24]
    causal = Starts(tiny_target(8))
    generate(causal, prompt, config)
    assert not causal.blocks_at_prompt_end and sorted(set(causal.starts)) == [8, 16, 24]


# -- every rule lossless -------------------------------------------------------------------------


def every_drafter(reference, target, config):
    """test_engine's four (random, adversarial, oracle, untrained SPOT), stale sets, and under single and threshold
    (the policies Spiffy's graphs are made for) Spiffy calibrated on this target: all drafting for a rule they were
    not made for."""
    sets = SetsDrafter(StaleSets(((1.0, 0.0, 0.0), (0.8, 0.1, -0.5))))
    if config.policy not in ("single", "threshold"):
        return [*drafters(reference), sets]
    return [*drafters(reference), sets, SpiffyDrafter(calibrated(target, config.block_length, config.policy), prune_to=3)]


GRID = [(confidence, policy, stop) for confidence in CONFIDENCES for policy, stop in
        (("single", True), ("threshold", False), ("static", True), ("dynamic", False))]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize(("confidence", "policy", "stop_at_eos"), GRID, ids=[f"{c}-{p}-{'stop' if s else 'write'}" for c, p, s in GRID])
def test_every_rule_is_lossless_on_a_block_causal_target(confidence, policy, stop_at_eos, temperature):
    i = GRID.index((confidence, policy, stop_at_eos))
    dtype = torch.bfloat16 if i % 3 == 2 else torch.float32  # bf16 in the exact layout for a third of the grid
    target = tiny_target(16, seed=i % 3, eos_ids=frozenset({EOS_ID}), dtype=dtype, exact=dtype == torch.bfloat16)
    config = DecodeConfig(policy=policy, threshold=0.3, steps=8 if policy in ("static", "dynamic") else None, block_length=16,
                          gen_length=45, sampling=Sampling(temperature), seed=i, confidence=confidence, stop_at_eos=stop_at_eos)
    prompt = prompt_ids(i, 13)
    reference = generate(target, prompt, config, record=True)
    for j, drafter in enumerate(every_drafter(reference, target, config)):
        budget = [1, 4, 8, 20, AUTO][(i + j) % 5]
        got = run(target, prompt, replace(config, cross_block=(i + j) % 2 == 1), drafter, budget, i + j)
        assert got.token_ids == reference.token_ids, (drafter.name, budget)
        assert got.finish_reason == reference.finish_reason
    oracle = generate(target, prompt, replace(config, budget=8), drafter=OracleDrafter(reference.trajectory))
    assert oracle.stats.forwards < reference.stats.forwards


@pytest.mark.parametrize("name", list(TARGETS))
@pytest.mark.parametrize("confidence", CONFIDENCES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_rule_is_lossless_on_the_dual_cache_targets(name, confidence, temperature):
    build, _, shift = TARGETS[name]
    target = DualCacheTarget(build(seed=4), MASK, frozenset({EOS}), 16, shift=shift)
    config = DecodeConfig(policy="threshold" if confidence in ("margin", "random") else "single", threshold=0.3,
                          block_length=16, gen_length=32, sampling=Sampling(temperature), seed=2, confidence=confidence,
                          stop_at_eos=confidence in ("probability", "entropy"))
    prompt = list(range(1, 12))
    reference = generate(target, prompt, config, record=True)
    for j, drafter in enumerate(every_drafter(reference, target, config)):
        got = generate(target, prompt, replace(config, budget=(1, 8)[j % 2]), drafter=drafter)
        assert got.token_ids == reference.token_ids, (drafter.name, config)


def test_the_random_order_follows_the_seed():
    target = tiny_target(16, seed=1, eos_ids=frozenset())
    config = DecodeConfig(block_length=16, gen_length=32, confidence="random", seed=5)
    prompt = list(range(1, 12))
    first = generate(target, prompt, config, record=True)
    assert generate(target, prompt, config).token_ids == first.token_ids
    other = generate(target, prompt, replace(config, seed=6), record=True)
    by_probability = generate(target, prompt, replace(config, confidence="probability"), record=True)

    def order(g):  # the position each step of the first generated block commits
        states = g.trajectory[0].states
        return [int(torch.nonzero(states[s] != states[s + 1])[0]) for s in range(len(states) - 1)]

    assert order(first) != order(other) and order(first) != order(by_probability)
    assert len(set(order(first))) == len(order(first))  # one position per step, each once
