"""Losslessness of the speculative engine, proved as an explicit grid plus hypothesis.

Every method must reproduce the draft-free tokens: across temperatures, budgets, drafters,
policies, block lengths, generation lengths that are not a multiple of the block, and EOS in the
middle of a block.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from conftest import EOS_ID, MASK_ID, VOCAB, tiny_target
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spot import DecodeConfig, Sampling, generate
from spot.config import CONFIDENCE_DTYPES, CONFIDENCES, DREAM_EPS, POLICIES, STEPPED, TIE_BREAKS
from spot.drafters import AdversarialDrafter, OracleDrafter, RandomDrafter
from spot.drafters.freedave import FreeDaveDrafter
from spot.drafters.order_model import OrderModel
from spot.drafters.spot import SpotDrafter
from spot.drafters.stale import StaleOrder
from spot.sizing import DraftMode, Sizing, VerifyCost
from spot.targets import block_causal
from spot.targets.base import Verified

TEMPERATURES = [0.0, 0.7, 1.0, 2.0]
BUDGETS = [1, 4, 8, 20]
AUTO = "auto"  # budget=auto at the cap of 20, sized by one of SIZINGS
# Cost curves for budget=auto: a GPU-like flat one (big trees), a CPU-like slope (small ones, or none),
# and one so steep that drafting never pays (the draft-free step every time).
FLAT, SLOPED, STEEP = (VerifyCost((1, 21), (0, 4096), ((1.0, 1.2), (1.0, 1.2))),
                       VerifyCost((1, 2, 21), (0,), ((1.0, 1.3, 6.0),)),
                       VerifyCost((1, 2), (0,), ((1.0, 3.0),)))
# On the slope SPOT's stale mode, free and as likely to be reached, pays more than its model mode.
SIZINGS = [Sizing(FLAT, (DraftMode("model", ((1, 0.1),), (0.9,) * 20),)),
           Sizing(SLOPED, (DraftMode("model", ((1, 0.05), (20, 0.2)), (0.8, 0.5, 0.3)),
                           DraftMode("stale", ((1, 0.0),), (0.8, 0.5, 0.3)))),
           Sizing(STEEP, (DraftMode("model", ((1, 0.5),), (0.5,)),))]


class Reaching:
    """A drafter whose trees carry pseudo-random reach probabilities (any values must stay lossless:
    sizing only chooses which drafted states are verified)."""

    def __init__(self, drafter, seed: int) -> None:
        self.drafter, self.name = drafter, f"{drafter.name}+reach"
        self.generator = torch.Generator().manual_seed(seed)

    def draft(self, ctx):
        tree = self.drafter.draft(ctx)
        return replace(tree, reach=(1.0, *torch.rand(tree.size, generator=self.generator).tolist()))


def run(target, prompt, config, drafter, budget, rotation: int = 0):
    """generate at a fixed budget, or at budget=auto with the rotation's sizing and a reaching drafter."""
    if budget == AUTO:
        return generate(target, prompt, with_budget(config, 20), drafter=Reaching(drafter, rotation),
                        sizing=SIZINGS[rotation % len(SIZINGS)])
    return generate(target, prompt, with_budget(config, budget), drafter=drafter)


def prompt_ids(seed: int, length: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB - 2, (length,), generator=g).tolist()


def with_budget(config: DecodeConfig, budget: int) -> DecodeConfig:
    return replace(config, budget=budget)


def untrained_spot() -> SpotDrafter:
    torch.manual_seed(0)
    return SpotDrafter(OrderModel(), gate=0.9, stale=StaleOrder(0.2))


def drafters(reference):
    return [
        RandomDrafter(VOCAB, seed=1),
        AdversarialDrafter(reference.trajectory, VOCAB),
        OracleDrafter(reference.trajectory),
        untrained_spot(),
        FreeDaveDrafter(),
    ]


def mid_block_token(reference, block_length: int) -> tuple[int, int]:
    """A token whose first occurrence in the reference output is strictly inside a block."""
    ids = list(reference.token_ids)
    for i in range(1, len(ids)):
        if ids[i] not in ids[:i] and 0 < i % block_length < block_length - 1:
            return ids[i], i
    raise AssertionError("the reference output has no token that first appears mid-block")


def assert_lossless(target, prompt, config, rotation: int):
    """Each drafter at one budget, the pairing rotated by grid point: across the grid every
    (drafter, budget) pair is checked, at a quarter of the cost of all pairs at every point."""
    reference = generate(target, prompt, config, record=True)
    for i, drafter in enumerate(drafters(reference)):
        budget = [*BUDGETS, AUTO][(i + rotation) % (len(BUDGETS) + 1)]
        cross = replace(config, cross_block=(i + rotation) % 2 == 1)  # cross-block pieces on for half the pairs
        got = run(target, prompt, cross, drafter, budget, rotation)
        assert got.token_ids == reference.token_ids, (drafter.name, budget)
        assert got.finish_reason == reference.finish_reason
    return reference


# (dtype, exact layout): fp32 in both layouts; bf16 in the exact one (the packed layout's bf16 logits
# move with the piece count, see tests/test_exactness.py).
NUMERICS = [(torch.float32, False), (torch.float32, True), (torch.bfloat16, True)]


@pytest.mark.parametrize("dtype, exact", NUMERICS, ids=["fp32", "fp32-exact", "bf16-exact"])
@pytest.mark.parametrize("block_length, gen_length", [(16, 45), (32, 70)])
@pytest.mark.parametrize("policy", ["single", "threshold"])
@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_every_drafter_and_budget_reproduces_draft_free(block_length, gen_length, policy, temperature, dtype, exact):
    sampling = Sampling(temperature=temperature, top_k=20 if temperature == 0.7 else 0, top_p=0.9 if temperature == 2.0 else 1.0)
    config = DecodeConfig(
        policy=policy, threshold=0.6, block_length=block_length, gen_length=gen_length, sampling=sampling, seed=3
    )
    target = tiny_target(block_length, seed=int(temperature * 10) + block_length, eos_ids=frozenset(), dtype=dtype, exact=exact)
    prompt = prompt_ids(int(temperature * 100) + block_length, 21)
    rotation = TEMPERATURES.index(temperature) + (policy == "threshold") + block_length // 16
    reference = assert_lossless(target, prompt, config, rotation)
    assert reference.finish_reason == "length" and len(reference.token_ids) == gen_length

    # The same grid point with an EOS that the target writes in the middle of a block.
    eos, index = mid_block_token(reference, block_length)
    target.eos_ids = frozenset({eos})
    stopped = assert_lossless(target, prompt, config, rotation + 2)
    assert stopped.finish_reason == "eos" and stopped.token_ids == reference.token_ids[:index]


@pytest.mark.parametrize(
    "policy, steps", [("static", 4), ("static", 16), ("dynamic", 4), ("dynamic", 16)], ids=lambda v: str(v)
)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sdar_schedules_are_lossless_with_every_drafter_and_budget(policy, steps, temperature):
    """SDAR's low_confidence_static (k commits a step) and low_confidence_dynamic (strict threshold with a
    top-k fallback). The drafters propose one commit per edge, so under k > 1 only verification decides."""
    config = DecodeConfig(policy=policy, steps=steps, threshold=0.5, block_length=16, gen_length=45,
                          sampling=Sampling(temperature=temperature), seed=5)
    target = tiny_target(16, seed=steps + int(temperature), eos_ids=frozenset())
    prompt = prompt_ids(steps, 21)
    reference = generate(target, prompt, config, record=True)
    assert reference.stats.steps <= 4 * steps  # four blocks (the prompt fills part of the first), `steps` steps at most each
    for drafter in drafters(reference):
        for budget in (1, 8, 20, AUTO):
            got = run(target, prompt, config, drafter, budget, steps)
            assert got.token_ids == reference.token_ids, (drafter.name, budget)
    oracle = generate(target, prompt, with_budget(config, 8), drafter=OracleDrafter(reference.trajectory))
    assert oracle.stats.forwards < reference.stats.forwards


@pytest.mark.parametrize("steps", [2, 4])
@pytest.mark.parametrize(("dtype", "confidence_dtype"), [(torch.float32, "float64"), (torch.bfloat16, "model")], ids=["fp32", "bf16-model"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_capped_threshold_is_lossless_with_every_drafter_and_budget(steps, dtype, confidence_dtype, temperature):
    """Fast-dLLM's full-canvas Dream rule (at most block_length / steps a step, the unused cap carried, steps added
    at the end), with confidences in float64 and in bf16 as the model computes them: the drafters propose
    commits the cap may refuse, and only verification decides. The EOS is made unlikely so blocks run to the end."""
    config = DecodeConfig(policy="threshold", threshold=0.3, capped=True, steps=steps, block_length=16, gen_length=40,
                          sampling=Sampling(temperature=temperature), seed=steps, confidence_dtype=confidence_dtype)
    target = tiny_target(16, seed=steps + int(temperature), eos_ids=frozenset(), dtype=dtype, exact=dtype == torch.bfloat16)
    prompt = prompt_ids(steps, 21)
    reference = generate(target, prompt, config, record=True)
    uncapped = generate(target, prompt, replace(config, capped=False, steps=None))
    assert reference.token_ids != uncapped.token_ids or reference.stats.steps > uncapped.stats.steps  # the cap binds
    for i, drafter in enumerate(drafters(reference)):
        budget = [*BUDGETS, AUTO][(i + steps + int(temperature)) % (len(BUDGETS) + 1)]
        got = run(target, prompt, replace(config, cross_block=i % 2 == 1), drafter, budget, steps)
        assert got.token_ids == reference.token_ids, (drafter.name, budget)
    oracle = generate(target, prompt, with_budget(config, 8), drafter=OracleDrafter(reference.trajectory))
    assert oracle.token_ids == reference.token_ids and oracle.stats.forwards < reference.stats.forwards


@settings(max_examples=18, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    prompt_length=st.integers(1, 40),
    gen_length=st.integers(1, 50),
    temperature=st.sampled_from(TEMPERATURES),
    policy=st.sampled_from(list(POLICIES)),
    budget=st.sampled_from([*BUDGETS, AUTO]),
    numerics=st.sampled_from(NUMERICS),
    cross_block=st.booleans(),
    rule=st.fixed_dictionaries({"confidence": st.sampled_from(CONFIDENCES), "stop_at_eos": st.booleans(),
                                "mask_in_softmax": st.booleans(), "first_token_commit": st.booleans(),
                                "confidence_dtype": st.sampled_from(CONFIDENCE_DTYPES),
                                "tie_break": st.sampled_from(TIE_BREAKS)}),
    capped=st.booleans(),
    eps=st.sampled_from([DREAM_EPS, 0.0, 0.3]),
)
def test_random_prompts_and_lengths_are_lossless(seed, prompt_length, gen_length, temperature, policy, budget, numerics, cross_block,
                                                 rule, capped, eps):
    """Any policy and reference rule; `capped` applies to threshold and `eps` to timestep (else left unset)."""
    dtype, exact = numerics
    target = tiny_target(16, seed=seed % 3, dtype=dtype, exact=exact)
    capped = capped and policy == "threshold"
    steps = (4, 8, 16)[seed % 3] if policy in STEPPED or capped else None
    config = DecodeConfig(policy=policy, threshold=0.5, steps=steps, block_length=16, gen_length=gen_length,
                          sampling=Sampling(temperature=temperature), seed=seed, capped=capped,
                          eps=eps if policy == "timestep" else DREAM_EPS, **rule)
    prompt = prompt_ids(seed, prompt_length)
    reference = generate(target, prompt, config, record=True)
    assert len(reference.token_ids) <= gen_length
    for drafter in drafters(reference):
        assert run(target, prompt, replace(config, cross_block=cross_block), drafter, budget, seed).token_ids == reference.token_ids


@pytest.mark.parametrize("policy", ["single", "threshold"])
def test_cross_block_lets_the_forward_that_finishes_a_block_take_the_next_blocks_first_step(policy):
    """With the oracle at budget 1 a tree holds the state one step ahead, so the forward whose tree holds
    a block's finished state also verifies the next block's first state behind it: that step needs no
    forward of its own. The steps and states are the draft-free decoder's, step for step. (Under `single`
    every block here takes an even number of steps, two a forward, so the finished state is always the
    free step's and never drafted: nothing to save.)"""
    target = tiny_target(16, seed=2, eos_ids=frozenset())
    config = DecodeConfig(block_length=16, gen_length=64, policy=policy, threshold=0.5, sampling=Sampling(1.0), seed=4)
    prompt = prompt_ids(2, 10)
    reference = generate(target, prompt, config, record=True)
    oracle = OracleDrafter(reference.trajectory)
    plain = generate(target, prompt, with_budget(config, 1), drafter=oracle)
    cross = generate(target, prompt, replace(config, budget=1, cross_block=True), drafter=oracle, record=True)
    assert cross.token_ids == reference.token_ids and plain.token_ids == reference.token_ids
    assert all(torch.equal(a.states, b.states) for a, b in zip(cross.trajectory, reference.trajectory, strict=True))
    assert sum(cross.stats.accepted_lengths) == reference.stats.steps
    blocks = len(reference.trajectory)
    saved = plain.stats.forwards - cross.stats.forwards
    assert 0 < saved <= blocks - 1 if policy == "threshold" else saved == 0


@pytest.mark.parametrize("budget", BUDGETS)
def test_oracle_reaches_the_bound_of_budget_plus_one_steps_per_forward(budget):
    target = tiny_target(32, seed=5)
    config = DecodeConfig(block_length=32, gen_length=96)
    prompt = prompt_ids(5, 32)  # whole prompt blocks: every generated block has 32 steps
    reference = generate(target, prompt, config, record=True)
    steps = [trace.states.shape[0] - 1 for trace in reference.trajectory]
    assert steps == [32, 32, 32] and reference.stats.forwards == 96
    got = generate(target, prompt, with_budget(config, budget), drafter=OracleDrafter(reference.trajectory))
    assert got.stats.forwards == sum(math.ceil(s / (budget + 1)) for s in steps)
    assert max(got.stats.accepted_lengths) == min(budget + 1, 32)


def test_adversarial_drafts_are_never_accepted():
    target = tiny_target(16, seed=2)
    config = DecodeConfig(block_length=16, gen_length=40, policy="threshold", threshold=0.5)
    reference = generate(target, prompt_ids(2, 10), config, record=True)
    got = generate(target, prompt_ids(2, 10), with_budget(config, 8), drafter=AdversarialDrafter(reference.trajectory, VOCAB))
    assert set(got.stats.accepted_lengths) == {1}
    assert got.stats.forwards == reference.stats.forwards


def test_forward_counter_agrees_with_a_hook_on_the_model():
    target = tiny_target(16, seed=1)
    calls = []
    target.model.model.register_forward_hook(lambda *args: calls.append(1))
    config = DecodeConfig(block_length=16, gen_length=40, budget=4)
    reference = generate(target, prompt_ids(1, 20), DecodeConfig(block_length=16, gen_length=40), record=True)
    got = generate(target, prompt_ids(1, 20), config, drafter=OracleDrafter(reference.trajectory))
    assert len(calls) == reference.stats.forwards + got.stats.forwards
    assert got.stats.steps == reference.stats.steps == sum(got.stats.accepted_lengths)


def test_stats_split_the_wall_time():
    target = tiny_target(16)
    reference = generate(target, prompt_ids(0, 5), DecodeConfig(block_length=16, gen_length=20), record=True)
    got = generate(target, prompt_ids(0, 5), DecodeConfig(block_length=16, gen_length=20, budget=4), drafter=RandomDrafter(VOCAB))
    for stats in (reference.stats, got.stats):
        assert stats.seconds > 0 and 0 < stats.target_seconds <= stats.seconds
        assert stats.other_seconds >= 0
    assert reference.stats.drafter_seconds == 0 and got.stats.drafter_seconds > 0
    assert got.stats.draft_nodes > 0


def test_partial_prompt_block_is_never_masked():
    target = tiny_target(16)
    prompt = prompt_ids(4, 21)  # 16 + 5: the first decode block starts with 5 prompt tokens
    reference = generate(target, prompt, DecodeConfig(block_length=16, gen_length=30), record=True)
    first = reference.trajectory[0]
    assert first.block == 1
    assert (first.states[:, :5] == torch.tensor(prompt[16:21])).all()
    assert reference.stats.steps == 11 + 16 + 16  # only masked positions take steps


class CharDecode:
    """A stand-in tokenizer: token t decodes to chr(ord('a') + t % 26)."""

    def __call__(self, ids):
        return "".join(chr(ord("a") + t % 26) for t in ids)


def test_stop_strings_cut_text_and_tokens_alike_for_every_method():
    target = tiny_target(16, seed=6, eos_ids=frozenset())
    base = DecodeConfig(block_length=16, gen_length=60)
    full = generate(target, prompt_ids(6, 8), base, decode=CharDecode(), record=True)
    stop = full.text[20:22]
    assert len(full.text) == 60 and len(stop) == 2
    config = DecodeConfig(block_length=16, gen_length=60, stop_strings=(stop,))
    reference = generate(target, prompt_ids(6, 8), config, decode=CharDecode(), record=True)
    cut = full.text.find(stop)
    assert reference.text == full.text[:cut] and reference.finish_reason == "stop"
    assert CharDecode()(list(reference.token_ids)) == reference.text
    got = generate(target, prompt_ids(6, 8), with_budget(config, 8), drafter=OracleDrafter(reference.trajectory), decode=CharDecode())
    assert (got.token_ids, got.text) == (reference.token_ids, reference.text)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"budget": -1}, "budget must be >= 0"),
        ({"policy": "greedy"}, "unknown unmasking policy 'greedy'"),
        ({"gen_length": 0}, "gen_length must be >= 1"),
        ({"threshold": 1.5}, "threshold must be in"),
        ({"threshold": float("nan")}, "threshold must be a finite number, got nan"),
        ({"block_length": 16.5}, "block_length must be a whole number, got 16.5"),
        ({"gen_length": 64.0}, "gen_length must be a whole number, got 64.0"),
        ({"seed": 2**32}, r"seed must be in \[0, 2\*\*32\), got 4294967296"),
        ({"seed": -1}, r"seed must be in \[0, 2\*\*32\)"),
        ({"budget": True}, "budget must be a whole number, got True"),
    ],
)
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DecodeConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -0.5}, "temperature must be >= 0"),
        ({"temperature": float("inf")}, "temperature must be a finite number, got inf"),
        ({"top_k": 2.5}, "top_k must be a whole number, got 2.5"),
        ({"top_p": float("nan")}, "top_p must be a finite number"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ],
)
def test_bad_sampling_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Sampling(**kwargs)


class BrokenTarget:
    """A target whose logits are NaN from its second forward on."""

    def __init__(self, target) -> None:
        self.target = target

    def __getattr__(self, name):
        return getattr(self.target, name)

    def verify_batch(self, calls):
        out = self.target.verify_batch(calls)
        if self.target.forwards > 1:
            out = [Verified(v.logits.clone().index_fill_(-1, torch.tensor([5]), float("nan")), v.hidden) for v in out]
        return out


def test_non_finite_logits_end_the_decode_naming_the_forward():
    with pytest.raises(RuntimeError, match=r"forward 2 \(request 7, block 0, step 1\) returned non-finite logits"):
        generate(BrokenTarget(tiny_target(16)), [1, 2, 3], DecodeConfig(block_length=16, gen_length=20), request=7)

def test_a_step_that_commits_nothing_stops_with_the_request_named(monkeypatch):
    """Only a bug or broken numbers can make a policy step commit nothing; the decoder stops instead of looping."""
    import spot.verify

    real = spot.verify.decide
    monkeypatch.setattr(spot.verify, "decide", lambda state, *args, **kwargs: (state, real(state, *args, **kwargs)[1]))
    with pytest.raises(RuntimeError, match="request 3, block 0, step 0: the step committed no position"):
        generate(tiny_target(16), [1, 2, 3], DecodeConfig(block_length=16, gen_length=20), request=3)


def test_a_prompt_longer_than_the_model_positions_is_refused():
    target = tiny_target(16)
    with pytest.raises(ValueError, match="needs 528 positions .* the model has 512"):
        generate(target, [1] * 500, DecodeConfig(block_length=16, gen_length=20))


def test_a_budget_without_a_drafter_and_a_mismatched_block_are_refused():
    target = tiny_target(16)
    with pytest.raises(ValueError, match="needs a drafter"):
        generate(target, [1, 2], DecodeConfig(block_length=16, gen_length=20, budget=2))
    with pytest.raises(ValueError, match="block_length 32 differs from the target's block length 16"):
        generate(target, [1, 2], DecodeConfig(block_length=32, gen_length=20))


def test_mask_and_eos_ids_are_the_targets():
    target = tiny_target(16)
    assert target.mask_id == MASK_ID and target.eos_ids == {EOS_ID}


def test_a_budget_beyond_the_free_memory_is_refused_with_a_budget_that_fits(monkeypatch):
    target = tiny_target(16)
    per_piece = target.block_length * (VOCAB * 8 + 4 * (48 + 16) * 4 + 4 * 64 * 4 + 2 * 2 * 2 * 8 * 4)
    assert target.max_pieces(48) > 1000  # the real free memory holds far more than any budget here
    monkeypatch.setattr(block_causal, "free_bytes", lambda device: 2 * 5 * per_piece)  # room for exactly 5 pieces (half the free memory)
    assert target.max_pieces(48) == 5
    drafter = RandomDrafter(VOCAB)
    generate(target, [1, 2], DecodeConfig(block_length=16, gen_length=20, budget=4), drafter=drafter)
    with pytest.raises(ValueError, match="budget 5 needs 6 pieces .* holds about 5 now. Use a budget of at most 4"):
        generate(target, [1, 2], DecodeConfig(block_length=16, gen_length=20, budget=5), drafter=drafter)
