"""The reference generators' decoding rules (LLaDA's generate.py, Dream's diffusion_generate, Fast-dLLM): each
confidence rule with literal inputs, writing every block to gen_length, blocks from the prompt's end on the
dual-cache targets, Fast-dLLM's capped threshold step for step, each generator's decodes in fp32 and, with the
confidences in the model's dtype, in bf16; and every rule lossless under every drafter (SPOT, Spiffy, SPOT-Sets'
stale sets, random, adversarial, oracle), at both temperatures, in fp32 and bf16, on both kinds of target."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest
import torch
from conftest import EOS_ID, MASK_ID, VOCAB, tiny_target
from test_dual_cache import EOS, MASK, TARGETS
from test_dual_cache import VOCAB as VOCAB_DUAL
from test_engine import AUTO, drafters, mid_block_token, prompt_ids, run
from test_spiffy import calibrated
from transformers import DynamicCache

from spot import DecodeConfig, Sampling, generate
from spot.config import CONFIDENCE_DTYPES, CONFIDENCES, DREAM_EPS, STEPPED
from spot.drafters import OracleDrafter
from spot.drafters.sets import SetsDrafter, StaleSets
from spot.drafters.spiffy import SpiffyDrafter
from spot.noise import gumbel
from spot.policy import Span, confidence_of, propose, select
from spot.targets import DualCacheTarget
from spot_eval.harness.lossless import diverge

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

    def verify_batch(self, calls):
        self.starts += [call.start for call in calls]
        return self.target.verify_batch(calls)


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
        return [*drafters(reference), sets]  # Spiffy's graphs serve single and threshold
    return [*drafters(reference), sets, SpiffyDrafter(calibrated(target, config.block_length, config.policy), prune_to=3)]


GRID = [(confidence, policy, stop) for confidence in CONFIDENCES for policy, stop in
        (("single", True), ("threshold", False), ("static", True), ("dynamic", False), ("timestep", confidence != "random"))]


@pytest.mark.parametrize(("confidence", "policy", "stop_at_eos"), GRID, ids=[f"{c}-{p}-{'stop' if s else 'write'}" for c, p, s in GRID])
def test_every_rule_is_lossless_on_a_block_causal_target(confidence, policy, stop_at_eos):
    """Each rule under each policy, at T = 0 and 1 alternately (so each rule meets both), with bf16 in the exact
    layout, the mask in the softmax, the first-token commit, the capped threshold and confidences in the model's
    dtype on a share of the grid."""
    i = GRID.index((confidence, policy, stop_at_eos))
    temperature = float((i % 5 + i // 5) % 2)  # each policy at both temperatures across the confidences
    dtype = torch.bfloat16 if i % 3 == 2 else torch.float32  # bf16 in the exact layout for a third of the grid
    target = tiny_target(16, seed=i % 3, eos_ids=frozenset({EOS_ID}), dtype=dtype, exact=dtype == torch.bfloat16)
    capped = policy == "threshold" and confidence != "random"  # three of the four threshold rows, at T = 0 and 1
    config = DecodeConfig(policy=policy, threshold=0.3, steps=8 if policy in STEPPED or capped else None, block_length=16,
                          gen_length=45, sampling=Sampling(temperature), seed=i, confidence=confidence, stop_at_eos=stop_at_eos,
                          alg_temp=0.5 if policy == "timestep" and confidence in ("probability", "entropy") else 0.0,
                          mask_in_softmax=i % 2 == 0, first_token_commit=i % 3 == 1, capped=capped,
                          confidence_dtype="model" if i % 4 < 2 else "float64")  # in bf16 and fp32 both
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
    policy = {"probability": "single", "margin": "threshold", "entropy": "timestep", "random": "timestep"}[confidence]
    capped = policy == "threshold" and temperature > 0
    config = DecodeConfig(policy=policy, threshold=0.3, steps=8 if policy == "timestep" or capped else None, block_length=16,
                          gen_length=32, sampling=Sampling(temperature), seed=2, confidence=confidence,
                          stop_at_eos=confidence in ("probability", "entropy"), mask_in_softmax=confidence == "margin",
                          first_token_commit=confidence in ("entropy", "random"), capped=capped,
                          confidence_dtype="model" if temperature == 0 else "float64",
                          tie_break="topk" if confidence in ("probability", "entropy") else "leftmost")
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


# -- Dream's schedule ----------------------------------------------------------------------------


def test_the_timestep_schedule_is_dreams_in_float32():
    """linspace(1, 1e-3, 5) = [1, 0.75025, 0.5005, 0.25075, 0.001]: of 16 masks, int(16 * 0.24975) = 3 (not 4),
    then int(13 * 0.33289) = 4, int(9 * 0.49900) = 4, and the last step the remaining 5."""
    config = DecodeConfig(policy="timestep", steps=4, block_length=16)
    masked, counts = 16, []
    for step in range(4):
        counts.append(config.commit_count(step, masked))
        masked -= counts[-1]
    assert counts == [3, 4, 4, 5] and masked == 0
    # With as many steps as positions, the first step's count is int(16 * 0.0624375) = 0.
    assert DecodeConfig(policy="timestep", steps=16, block_length=16).commit_count(0, 16) == 0
    with pytest.raises(ValueError, match="steps applies to the static, dynamic, timestep policies"):
        DecodeConfig(policy="single", steps=4)
    with pytest.raises(ValueError, match="alg_temp applies to the timestep policy"):
        DecodeConfig(alg_temp=0.5)


def test_a_step_that_commits_nothing_costs_no_forward():
    """Dream runs a forward for a step whose count is 0; its state, so its logits, are the next step's too:
    the engine takes that step from the same logits, with the same tokens as the reference."""
    target = tiny_target(16, seed=2, eos_ids=frozenset())
    config = DecodeConfig(policy="timestep", steps=16, block_length=16, gen_length=32)
    g = generate(target, list(range(1, 17)), config, record=True)
    states = g.trajectory[0].states
    assert torch.equal(states[0], states[1])  # step 0 committed nothing
    assert g.stats.steps == 32 and g.stats.forwards < 32 and len(g.token_ids) == 32


def full_forward(model, x: torch.Tensor) -> torch.Tensor:
    """[L, V] logits, in the model's dtype as the generators get them, of one bidirectional forward over the canvas
    x [L] (an all-true mask: no causality)."""
    mask = torch.ones(1, 1, len(x), len(x), dtype=torch.bool)
    hidden = model.model(input_ids=x[None], position_ids=torch.arange(len(x))[None], attention_mask=mask).last_hidden_state[0]
    return model.lm_head(hidden)


def top(confidence: torch.Tensor, k: int) -> torch.Tensor:
    """The references' torch.topk(confidence, k).indices, ties to the leftmost position (one amendment): torch
    leaves the order of ties unspecified (on the CPU it is libstdc++'s nth_element's), so a reference can commit
    either of two positions whose confidences are equal, which in bf16 happens; spot commits the leftmost
    (tie_break=leftmost, the default)."""
    return torch.sort(confidence, descending=True, stable=True).indices[:k]


def torch_topk(confidence: torch.Tensor, k: int) -> torch.Tensor:
    """The references' own call, unamended: what tie_break=topk reproduces."""
    return torch.topk(confidence, k).indices


def dream_sample_tokens(logits: torch.Tensor, alg: str, top_k: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Dream's sample_tokens at T = 0 on logits [M, V] in the model's dtype, op for op: top-k (fill with the
    dtype's min), the softmax in that dtype, the token the most probable (the mask never: the one amendment),
    and (confidence [M], token [M]) with the confidence of `alg`: maskgit_plus its probability, topk_margin top-1
    minus top-2, entropy sum p log(p + 1e-10)."""
    if top_k is not None:
        logits = logits.masked_fill(logits < torch.topk(logits, top_k).values[:, -1:], torch.finfo(logits.dtype).min)
    probs = torch.softmax(logits, dim=-1)
    confidence, x0 = probs.index_fill(-1, torch.tensor([MASK]), -1.0).max(dim=-1)
    if alg == "topk_margin":
        ordered = probs.sort(dim=-1, descending=True).values
        confidence = ordered[:, 0] - ordered[:, 1]
    elif alg == "entropy":
        confidence = (probs * torch.log(probs + 1e-10)).sum(dim=-1)
    return confidence, x0


def dream_generate(model, prompt: list[int], gen_length: int, steps: int, alg: str, top_k: int | None = None,
                   eps: float = 1e-3, pick=top) -> list[int]:
    """Dream's diffusion_generate at T = 0 (alg maskgit_plus, topk_margin or entropy), written from its rules
    (shared/research/method.md 2.4): the whole canvas each step, logits shifted right by one, `sample_tokens` in
    the model's dtype over the whole vocabulary (mask included), int(n * (1 - s/t)) positions a step on
    linspace(1, eps, steps + 1), the last step all; the mask token never drawn and ties leftmost (`top`)."""
    x = torch.tensor(prompt + [MASK] * gen_length)
    timesteps = torch.linspace(1, eps, steps + 1)
    with torch.no_grad():
        for i in range(steps):
            mask_index = x == MASK
            logits = full_forward(model, x)
            logits = torch.cat([logits[:1], logits[:-1]])  # Dream's shift
            confidence, x0 = dream_sample_tokens(logits[mask_index], alg, top_k)
            t, s = timesteps[i], timesteps[i + 1]
            n = mask_index.sum() / 1  # Dream: mask_index.sum() / batch size, a float32 tensor
            k = int(n * (1 - s / t)) if i < steps - 1 else int(n)
            full = torch.full(x.shape, float("-inf"), dtype=confidence.dtype)
            full[mask_index] = confidence
            proposed = x.clone()
            proposed[mask_index] = x0
            if k > 0:
                chosen = pick(full, k)
                x[chosen] = proposed[chosen]
    return x[len(prompt):].tolist()


DREAM_TOP_K = 50  # the top_k Dream's generator inherits from the legacy generation defaults of transformers 4.46


@pytest.mark.parametrize("confidence_dtype", CONFIDENCE_DTYPES)
@pytest.mark.parametrize(("alg", "confidence"), [("maskgit_plus", "probability"), ("topk_margin", "margin"), ("entropy", "entropy")])
def test_dream_decodes_as_diffusion_generate_for_each_alg(alg, confidence, confidence_dtype):
    """In fp32, with its top_k of 50 (the docs' reference line) and without, confidences in either dtype."""
    build, _, shift = TARGETS["dream"]
    model = build(seed=6)
    for prompt, steps, top_k in ((list(range(1, 12)), 10, DREAM_TOP_K), (list(range(3, 9)), 24, None)):  # 24 steps: some commit nothing
        gen = 24
        target = DualCacheTarget(model, MASK, frozenset({EOS}), gen, cache="none", shift=shift)  # one block: the whole generation
        config = DecodeConfig(policy="timestep", steps=steps, block_length=gen, gen_length=gen, confidence=confidence,
                              mask_in_softmax=True, stop_at_eos=False, confidence_dtype=confidence_dtype,
                              sampling=Sampling(top_k=top_k or 0))
        got = generate(target, prompt, config)
        assert list(got.token_ids) == dream_generate(model, prompt, gen, steps, alg, top_k), (alg, len(prompt), steps)
        assert got.stats.forwards <= steps


def test_dreams_eps_is_settable():
    """Dream's schedule linspace(1, eps, steps + 1) with a caller's eps: 24 masks in 8 steps commit 2, 3, 3, 3, 3,
    3, 3, 4 at its default 1e-3 and 1, 1, 1, 1, 1, 1, 1, 17 at eps = 0.5 (its timesteps end at 0.5, so each step
    but the last reveals int(n * (1 - s/t)) of a slowly falling t); the decode is Dream's with that eps."""
    def counts(config):
        masked, out = 24, []
        for step in range(8):
            out.append(config.commit_count(step, masked))
            masked -= out[-1]
        return out

    schedule = DecodeConfig(policy="timestep", steps=8, block_length=24, eps=0.5)
    assert counts(replace(schedule, eps=DREAM_EPS)) == [2, 3, 3, 3, 3, 3, 3, 4]
    assert counts(schedule) == [1, 1, 1, 1, 1, 1, 1, 17]
    build, _, shift = TARGETS["dream"]
    model = build(seed=6)
    prompt, gen = list(range(1, 12)), 24
    target = DualCacheTarget(model, MASK, frozenset({EOS}), gen, cache="none", shift=shift)
    config = replace(schedule, gen_length=gen, mask_in_softmax=True, stop_at_eos=False)
    got = generate(target, prompt, config, record=True)
    assert list(got.token_ids) == dream_generate(model, prompt, gen, 8, "maskgit_plus", eps=0.5)
    states = got.trajectory[0].states
    assert [int((states[s] == MASK).sum() - (states[s + 1] == MASK).sum()) for s in range(8)] == counts(schedule)
    with pytest.raises(ValueError, match="eps sets the timestep policy's schedule .* not policy 'single''s; drop eps"):
        DecodeConfig(eps=0.5)
    with pytest.raises(ValueError, match=r"eps must be in \[0, 1\)"):
        DecodeConfig(policy="timestep", eps=1.0)


def llada_generate(model, prompt: list[int], gen_length: int, block_length: int, steps: int, pick=top) -> list[int]:
    """LLaDA's generate.py at T = 0 with low_confidence remasking, written from its rules (method.md): blocks
    from the prompt's end, `steps` split evenly over the blocks and each block's masks split over its steps
    (the remainder to the first ones), the whole canvas each step, confidence p(x0) from a softmax over the
    whole vocabulary in the model's dtype, positions past the block at -inf; the mask token is never drawn and
    ties go to the leftmost position (`top`)."""
    x = torch.tensor(prompt + [MASK] * gen_length)
    n, per_block = len(prompt), steps // (gen_length // block_length)
    with torch.no_grad():
        for b in range(gen_length // block_length):
            lo, hi = n + b * block_length, n + (b + 1) * block_length
            masks = int((x[lo:hi] == MASK).sum())
            counts = [masks // per_block + (i < masks % per_block) for i in range(per_block)]
            for k in counts:
                mask_index = x == MASK
                logits = full_forward(model, x)
                p = torch.softmax(logits, dim=-1)
                logits[:, MASK] = float("-inf")
                x0 = logits.argmax(dim=-1)
                confidence = torch.where(mask_index, p.gather(-1, x0[:, None])[:, 0], float("-inf"))
                confidence[hi:] = float("-inf")
                chosen = pick(confidence, k)
                x[chosen] = x0[chosen]
    return x[n:].tolist()


@pytest.mark.parametrize("confidence_dtype", CONFIDENCE_DTYPES)
def test_llada_decodes_as_generate_py_on_prompts_of_any_length(confidence_dtype):
    build, _, _ = TARGETS["llada"]
    model = build(seed=7)
    for prompt in (list(range(1, 12)), list(range(1, 17)), list(range(4, 9))):  # 11, 16 and 5 tokens; blocks of 8
        target = DualCacheTarget(model, MASK, frozenset({EOS}), 8, cache="none")
        config = DecodeConfig(policy="static", steps=4, block_length=8, gen_length=24, mask_in_softmax=True, stop_at_eos=False,
                              confidence_dtype=confidence_dtype)
        assert list(generate(target, prompt, config).token_ids) == llada_generate(model, prompt, 24, 8, 12), len(prompt)


# -- Fast-dLLM's Dream generator -----------------------------------------------------------------


def fast_dllm_dream(model, prompt: list[int], gen_length: int, block_length: int, steps: int, alg: str,
                    threshold: float = 0.9, pick=top) -> list[int]:
    """Fast-dLLM's Dream `_sample` with its prefix cache at T = 0 (dream/model/generation_utils_block.py), written
    from its rules: per block, a full forward whose shifted logits commit the block's first position alone and
    whose keys and values before the block are kept; then forwards of [block | suffix] on that prefix, logits
    shifted within them, until the block has no mask: alg "confidence_threshold" commits the most confident
    masked position and every other one at >= threshold (no cap: the blocked generator has none); otherwise
    Dream's schedule with steps // blocks steps a block, counted from 1, and the negative entropy as confidence.
    Dream's `sample_tokens` in the model's dtype (`dream_sample_tokens`); ties leftmost (`top`)."""
    x = torch.tensor(prompt + [MASK] * gen_length)
    n, blocks = len(prompt), gen_length // block_length
    per_block = steps // blocks
    timesteps = torch.linspace(1, 1e-3, per_block + 1)

    def forward(ids, positions, past):
        mask = torch.ones(1, 1, len(ids), len(ids) + past.get_seq_length(), dtype=torch.bool)
        hidden = model.model(input_ids=ids[None], position_ids=positions[None], attention_mask=mask, cache=past,
                             use_cache=True).last_hidden_state[0]
        logits = model.lm_head(hidden)
        return torch.cat([logits[:1], logits[:-1]])  # Dream's shift, within the rows fed

    with torch.no_grad():
        for b in range(blocks):
            start = n + b * block_length
            full = DynamicCache(config=model.config)
            _, x0 = dream_sample_tokens(forward(x, torch.arange(len(x)), full), "maskgit_plus")
            x[start] = x0[start]
            prefix = DynamicCache(config=model.config)
            for i, layer in enumerate(full.layers):
                prefix.update(layer.keys[:, :, :start], layer.values[:, :, :start], i)
            i = 1
            while bool((x[start : start + block_length] == MASK).any()):
                logits = forward(x[start:], torch.arange(start, len(x)), copy.deepcopy(prefix))
                mask_index = x[start:] == MASK
                mask_index[block_length:] = False
                if alg == "confidence_threshold":
                    confidence, x0 = dream_sample_tokens(logits[mask_index], "maskgit_plus")
                    k = int(mask_index.sum())
                else:
                    confidence, x0 = dream_sample_tokens(logits[mask_index], "entropy")
                    t, s = timesteps[i], timesteps[i + 1]
                    masked = mask_index.sum() / 1
                    k = int(masked * (1 - s / t)) if i < per_block - 1 else int(masked)
                full_confidence = torch.full(mask_index.shape, float("-inf"), dtype=confidence.dtype)
                full_confidence[mask_index] = confidence
                proposed = x[start:].clone()
                proposed[mask_index] = x0
                if k > 0:
                    chosen = pick(full_confidence, k)
                    if alg == "confidence_threshold":
                        chosen = chosen[(full_confidence[chosen] >= threshold) | (torch.arange(k) == 0)]
                    x[start + chosen] = proposed[chosen]
                i += 1
    return x[n:].tolist()


def fast_dllm_llada(model, prompt: list[int], gen_length: int, block_length: int, threshold: float) -> list[int]:
    """Fast-dLLM's LLaDA `generate_with_dual_cache` at T = 0 with its threshold rule, written from its rules: per
    block a full forward whose logits already commit, keys and values kept for every position outside the block;
    then forwards of the block alone on them; each step commits the most confident masked position of the block
    and every other one at >= threshold, confidence from a float64 softmax over the whole vocabulary (the mask
    token never drawn: the one amendment)."""
    x = torch.tensor(prompt + [MASK] * gen_length)
    n = len(prompt)

    def forward(ids, positions, past):
        mask = torch.ones(1, 1, len(ids), len(ids) + past.get_seq_length(), dtype=torch.bool)
        hidden = model.model(input_ids=ids[None], position_ids=positions[None], attention_mask=mask, cache=past,
                             use_cache=True).last_hidden_state[0]
        return model.lm_head(hidden).float()

    def commit(logits, offset):  # logits of positions offset.., the block at [start, end)
        p = torch.softmax(logits.double(), dim=-1)
        x0 = torch.where(torch.arange(p.shape[-1]) == MASK, -1.0, p).argmax(dim=-1)
        rows = torch.arange(start, end) - offset
        block = x[start:end]
        confidence = torch.where(block == MASK, p[rows].gather(-1, x0[rows][:, None])[:, 0], float("-inf"))
        values, chosen = torch.topk(confidence, int((block == MASK).sum()))
        chosen = chosen[(values >= threshold) | (torch.arange(len(values)) == 0)]
        x[start + chosen] = x0[rows][chosen]

    with torch.no_grad():
        for b in range(gen_length // block_length):
            start, end = n + b * block_length, n + (b + 1) * block_length
            full = DynamicCache(config=model.config)
            commit(forward(x, torch.arange(len(x)), full), 0)
            kept = torch.ones(len(x), dtype=torch.bool)
            kept[start:end] = False
            frozen = DynamicCache(config=model.config)
            for i, layer in enumerate(full.layers):
                frozen.update(layer.keys[:, :, kept], layer.values[:, :, kept], i)
            while bool((x[start:end] == MASK).any()):
                commit(forward(x[start:end], torch.arange(start, end), copy.deepcopy(frozen)), start)
    return x[n:].tolist()


def test_llada_decodes_as_fast_dllms_dual_cache_generator():
    build, _, _ = TARGETS["llada"]
    model = build(seed=11)
    for prompt in (list(range(1, 12)), list(range(2, 10))):
        target = DualCacheTarget(model, MASK, frozenset({EOS}), 8, cache="dual")
        config = DecodeConfig(policy="threshold", threshold=0.2, block_length=8, gen_length=24, mask_in_softmax=True,
                              stop_at_eos=False)
        assert list(generate(target, prompt, config).token_ids) == fast_dllm_llada(model, prompt, 24, 8, 0.2), len(prompt)


@pytest.mark.parametrize(("dtype", "confidence_dtype"), [(torch.float32, "float64"), (torch.float32, "model"),
                                                        (torch.bfloat16, "model")], ids=["fp32", "fp32-model", "bf16-model"])
@pytest.mark.parametrize("alg", ["confidence_threshold", "entropy"])
def test_dream_decodes_as_fast_dllms_generator(alg, dtype, confidence_dtype):
    build, _, shift = TARGETS["dream"]
    model = build(seed=9, dtype=dtype)
    for prompt in (list(range(1, 12)), list(range(2, 7))):
        target = DualCacheTarget(model, MASK, frozenset({EOS}), 8, cache="prefix", shift=shift)
        policy = dict(policy="threshold", threshold=0.3) if alg == "confidence_threshold" else dict(policy="timestep", steps=4)
        config = DecodeConfig(**policy, block_length=8, gen_length=24, confidence="probability" if alg != "entropy" else "entropy",
                              mask_in_softmax=True, stop_at_eos=False, first_token_commit=True, confidence_dtype=confidence_dtype)
        expected = fast_dllm_dream(model, prompt, 24, 8, 12, alg, threshold=0.3)
        assert list(generate(target, prompt, config).token_ids) == expected, (alg, len(prompt))
        assert list(generate(target, prompt, replace(config, first_token_commit=False)).token_ids) != expected or alg == "entropy"


# -- Fast-dLLM's full-canvas Dream threshold: the capped threshold -------------------------------


def test_the_cap_is_the_masks_left_beyond_the_later_steps_shares():
    config = DecodeConfig(policy="threshold", capped=True, steps=3, block_length=24)
    assert config.cap(0, 24) == 8  # n / steps
    assert config.cap(1, 21) == 13  # step 0 committed 3 of its 8: 8 and the 5 it left unused
    assert config.cap(1, 16) == 8  # step 0 used its whole cap
    assert config.cap(2, 10) == 10 and config.cap(5, 3) == 3  # the last step and the steps added after it: every mask
    assert config.cap(0, 5) == 1  # a block that starts with fewer masks than its shares: the most confident alone
    assert DecodeConfig(policy="threshold", capped=True, steps=3, block_length=10).cap(0, 10) == 4  # SDAR's split: 4, 3, 3
    assert DecodeConfig(policy="threshold").cap(0, 24) is None


def test_bad_capped_settings_are_named():
    with pytest.raises(ValueError, match="capped needs steps: a step commits at most block_length / steps"):
        DecodeConfig(policy="threshold", capped=True)
    with pytest.raises(ValueError, match="capped caps the threshold policy's steps .* not policy 'dynamic'"):
        DecodeConfig(policy="dynamic", capped=True, steps=4)
    with pytest.raises(ValueError, match="steps applies to the static, dynamic, timestep policies and to threshold with capped"):
        DecodeConfig(policy="threshold", steps=4)
    with pytest.raises(ValueError, match="acceptance max_commit may accept more positions .* than capped lets a step commit"):
        DecodeConfig(policy="threshold", capped=True, steps=4, acceptance="max_commit")
    with pytest.raises(ValueError, match="unknown confidence_dtype 'bf16'; choose one of float64, model"):
        DecodeConfig(confidence_dtype="bf16")


def fast_dllm_capped_steps(table: torch.Tensor, threshold: float, steps: int) -> list[list[int]]:
    """The positions each step of Fast-dLLM's Dream `confidence_threshold` commits (dream/model/generation_utils.py,
    `_sample`, transcribed with its names) on a canvas whose masked positions' confidences at step i are table[i]
    ([S, L]; committed positions at -inf): number_transfer_tokens = n // steps (it asserts n divisible by steps);
    each step takes the top number_transfer_tokens + left_tokens_last_step (`top`), commits the first and each
    other at >= threshold, and counts each other into the next step's left_tokens_last_step; at the last step
    such a position adds a step and zeroes the share, so the added step's cap is what is left."""
    masked = torch.ones(table.shape[1], dtype=torch.bool)
    cap, out = FastDllmCap(int(masked.sum()) // steps, steps), []
    while cap.i < cap.steps:
        transfer_index = cap.transfer(torch.where(masked, table[cap.i], float("-inf")), threshold)
        out.append(torch.nonzero(transfer_index)[:, 0].tolist())
        masked &= ~transfer_index
    return out


class FastDllmCap:
    """The counters of Fast-dLLM's Dream capped threshold across the steps of `_sample`, with its names."""

    def __init__(self, number_transfer_tokens: int, steps: int, pick=top) -> None:
        self.number_transfer_tokens, self.left_tokens_last_step, self.steps, self.i = number_transfer_tokens, 0, steps, 0
        self.pick = pick

    def transfer(self, full_confidence: torch.Tensor, threshold: float) -> torch.Tensor:
        """Step i's transfer_index over the canvas (masked positions' confidences; committed ones at -inf)."""
        current_transfer_tokens = self.number_transfer_tokens + self.left_tokens_last_step
        self.left_tokens_last_step = 0
        select_index = self.pick(full_confidence, current_transfer_tokens)
        transfer_index = torch.zeros(full_confidence.shape, dtype=torch.bool)
        transfer_index[select_index] = True
        for k in range(1, current_transfer_tokens):
            if full_confidence[select_index[k]] < threshold:
                if self.i == self.steps - 1:  # the last step leaves one under the threshold: a step more
                    self.number_transfer_tokens = 0
                    self.steps += 1
                self.left_tokens_last_step += 1
                transfer_index[select_index[k]] = False
        self.i += 1
        return transfer_index


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_the_capped_threshold_commits_as_fast_dllms_dream_step_for_step(dtype):
    """On random confidences (in bf16 many of them equal, so ties and tau's rounding count), every step of every
    block as the transcription above: the carry of an unused cap, the steps added at the end, ties leftmost."""
    g = torch.Generator().manual_seed(0)
    length, added = 24, 0
    for case in range(300):
        steps = (1, 2, 3, 4, 6, 8, 12, 24)[case % 8]
        threshold = (0.3, 0.6, 0.9, 0.97)[case // 8 % 4]
        table = torch.rand(length, length, generator=g, dtype=torch.float64).to(dtype)  # [steps taken, L]
        expected = fast_dllm_capped_steps(table, threshold, steps)
        config = DecodeConfig(policy="threshold", threshold=threshold, capped=True, steps=steps, block_length=length)
        masked, got = torch.ones(length, dtype=torch.bool), []
        while bool(masked.any()):
            chosen = select(masked, table[len(got)], config, len(got))
            got.append(torch.nonzero(chosen)[:, 0].tolist())
            masked &= ~chosen
        assert got == expected, (case, steps, threshold)
        added += len(got) > steps
    assert added > 50  # the last step left positions under the threshold often: steps were added


def fast_dllm_dream_full_canvas(model, prompt: list[int], gen_length: int, steps: int, threshold: float, pick=top) -> list[int]:
    """Fast-dLLM's Dream `_sample` with alg confidence_threshold at T = 0 (dream/model/generation_utils.py, what its
    eval.py runs without use_cache): the whole canvas each forward, logits shifted right by one, `sample_tokens` in
    the model's dtype (`dream_sample_tokens`), and the capped commit of `fast_dllm_capped_steps` on the masked
    positions' confidences; the mask never drawn and ties leftmost (`top`)."""
    x = torch.tensor(prompt + [MASK] * gen_length)
    mask_index = x == MASK
    assert int(mask_index.sum()) % steps == 0  # its own assertion
    cap = FastDllmCap(int(mask_index.sum()) // steps, steps, pick)
    with torch.no_grad():
        while cap.i < cap.steps:
            mask_index = x == MASK
            logits = full_forward(model, x)
            logits = torch.cat([logits[:1], logits[:-1]])  # Dream's shift
            confidence, x0 = dream_sample_tokens(logits[mask_index], "maskgit_plus")
            x_ = torch.full_like(x, MASK)
            x_[mask_index] = x0
            full_confidence = torch.full(x.shape, float("-inf"), dtype=logits.dtype)
            full_confidence[mask_index] = confidence
            transfer_index = cap.transfer(full_confidence, threshold)
            x[transfer_index] = x_[transfer_index]
    return x[len(prompt):].tolist()


# (seed, prompt, gen_length, steps, threshold): shares of 8, 4, 6 and 12 a step.
FULL_CANVAS = [(0, list(range(2, 7)), 32, 4, 0.3), (0, list(range(5, 30)), 24, 6, 0.2), (2, list(range(1, 12)), 24, 4, 0.5),
               (1, list(range(1, 12)), 24, 2, 0.5)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dream_decodes_as_fast_dllms_full_canvas_threshold_generator(dtype):
    """The docs' line for it (cache=none, block_length = gen_length, unmasking=threshold, capped=true, steps=,
    mask_in_softmax, stop_at_eos=false, confidence_dtype=model) decodes as the generator does, in fp32 and bf16;
    without the cap it does not (the cap binds), and in bf16 float64 confidences part from it at exact ties."""
    build, _, shift = TARGETS["dream"]
    uncapped = f64 = 0
    for seed, prompt, gen, steps, threshold in FULL_CANVAS:
        model = build(seed=seed, dtype=dtype)
        target = DualCacheTarget(model, MASK, frozenset({EOS}), gen, cache="none", shift=shift)
        config = DecodeConfig(policy="threshold", threshold=threshold, capped=True, steps=steps, block_length=gen,
                              gen_length=gen, mask_in_softmax=True, stop_at_eos=False, confidence_dtype="model")
        expected = fast_dllm_dream_full_canvas(model, prompt, gen, steps, threshold)
        got = generate(target, prompt, config, record=True, record_margins=True)
        assert list(got.token_ids) == expected, (seed, len(prompt))
        uncapped += list(generate(target, prompt, replace(config, capped=False, steps=None)).token_ids) != expected
        in_f64 = generate(target, prompt, replace(config, confidence_dtype="float64"), record=True)
        if dtype == torch.float32:
            assert list(in_f64.token_ids) == expected, (seed, len(prompt))
        elif list(in_f64.token_ids) != expected:
            f64 += 1
            assert_an_exact_tie(in_f64, got, config)
    assert uncapped == len(FULL_CANVAS)  # the cap bound in every case
    assert f64 >= 1 or dtype == torch.float32


def assert_an_exact_tie(other, model_dtype, config: DecodeConfig) -> None:
    """Where `other` (float64 confidences) first parts from the `model_dtype` decode (record_margins), that step's
    decision was an exact tie in the model dtype's confidences: two positions equal at the cut, or one equal to
    tau as the dtype rounds it."""
    divergence = diverge(other, model_dtype, config, MASK)
    assert divergence.flipped in ("position", "threshold") and divergence.margin == 0.0, divergence


# -- bf16: confidences in the model's dtype -------------------------------------------------------


def test_model_dtype_confidences_are_the_references_to_the_bit():
    """Dream's sample_tokens on bf16 logits (its top-k of 50 included): confidence_dtype "model" computes the same
    probabilities and margins bit for bit and the same order of negative entropies; and meets tau as bf16 rounds
    it, as a reference comparing a bf16 confidence with 0.9 does (0.8984375 clears it), where float64 does not."""
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(16, VOCAB_DUAL, generator=g) * 3).to(torch.bfloat16)
    for alg, rule in (("maskgit_plus", "probability"), ("topk_margin", "margin"), ("entropy", "entropy")):
        for top_k in (None, DREAM_TOP_K):
            expected, x0 = dream_sample_tokens(logits, alg, top_k)
            got = propose(logits.float(), None, Sampling(top_k=top_k or 0), MASK, confidence=rule, mask_in_softmax=True,
                          dtype=torch.bfloat16)  # a target hands its logits over in float32
            assert torch.equal(got.tokens, x0), (alg, top_k)
            assert torch.equal(got.confidence, torch.exp(expected.double()) if rule == "entropy" else expected), (alg, top_k)
    bf16 = torch.tensor([0.95, 0.8984375, 0.5], dtype=torch.bfloat16)  # 0.8984375: 0.9 rounded to bf16
    masked, config = torch.ones(3, dtype=torch.bool), DecodeConfig(policy="threshold", threshold=0.9)
    assert select(masked, bf16, config).tolist() == [True, True, False]
    assert select(masked, bf16.double(), config).tolist() == [True, False, False]


FLAT = 0.25  # a head a quarter as sharp: confidences spread thin, so that bf16 rounds some of them to one value

# (reference, alg) -> its cases (seed, flat head, prompt, steps): bf16 decodes where float64 confidences part
# from the reference. Which decodes part depends on the CPU's bf16 kernels (they sum a matmul's products in
# orders of their own), so each rule has two cases and one parting suffices: the entropy case of seed 0 parts on
# the CPU it was found on, not on an AVX2-only AMD EPYC, where seed 1's does (2026-12-08).
BF16_TIES = {
    ("llada", "low_confidence"): [(0, True, list(range(1, 17)), 12), (1, True, list(range(1, 17)), 12)],
    ("dream", "maskgit_plus"): [(1, True, list(range(1, 12)), 10), (2, True, list(range(3, 9)), 10)],
    ("dream", "topk_margin"): [(3, True, list(range(1, 12)), 10), (2, True, list(range(1, 12)), 10)],
    ("dream", "entropy"): [(0, False, list(range(3, 9)), 24), (1, False, list(range(1, 12)), 10)],
}


@pytest.mark.parametrize(("name", "alg"), BF16_TIES, ids=[f"{n}-{a}" for n, a in BF16_TIES])
def test_bf16_ties_decode_as_the_references_do_in_the_models_dtype(name, alg):
    """LLaDA's generate.py and Dream's diffusion_generate (top_k 50) in bf16, on decodes where bf16 confidences
    order positions otherwise than exact ones: the docs' line with confidence_dtype=model decodes as the reference
    every time; with float64 confidences a decode parts from it. A probability is rounded once, so there the
    parting step is an exact bf16 tie; a margin (a difference of two rounded probabilities) or a negative entropy
    (a bf16 sum) can also rank two positions the other way outright."""
    build, _, shift = TARGETS[name]
    gen, parted = 24, 0
    for seed, flat, prompt, steps in BF16_TIES[name, alg]:
        model = build(seed=seed, dtype=torch.bfloat16)
        if flat:
            with torch.no_grad():
                model.lm_head.weight.mul_(FLAT)
        if name == "llada":
            target = DualCacheTarget(model, MASK, frozenset({EOS}), 8, cache="none")
            config = DecodeConfig(policy="static", steps=4, block_length=8, gen_length=gen, mask_in_softmax=True,
                                  stop_at_eos=False, confidence_dtype="model")
            expected = llada_generate(model, prompt, gen, 8, steps)
        else:
            target = DualCacheTarget(model, MASK, frozenset({EOS}), gen, cache="none", shift=shift)
            confidence = {"maskgit_plus": "probability", "topk_margin": "margin", "entropy": "entropy"}[alg]
            config = DecodeConfig(policy="timestep", steps=steps, block_length=gen, gen_length=gen, confidence=confidence,
                                  mask_in_softmax=True, stop_at_eos=False, confidence_dtype="model",
                                  sampling=Sampling(top_k=DREAM_TOP_K))
            expected = dream_generate(model, prompt, gen, steps, alg, DREAM_TOP_K)
        assert target.logits_dtype == torch.bfloat16  # what confidence_dtype=model computes in
        got = generate(target, prompt, config, record=True, record_margins=True)
        assert list(got.token_ids) == expected, seed
        in_f64 = generate(target, prompt, replace(config, confidence_dtype="float64"), record=True)
        if list(in_f64.token_ids) == expected:
            continue
        parted += 1
        if alg in ("low_confidence", "maskgit_plus"):
            assert_an_exact_tie(in_f64, got, config)
        else:
            assert diverge(in_f64, got, config, MASK).flipped == "position"
    assert parted, "no case parts in float64 on this machine's bf16 kernels: add one that does"


# -- bf16 ties as the references break them: tie_break=topk ----------------------------------------


def test_topk_ties_follow_torch_topk_on_the_references_row_not_the_leftmost_position():
    """Four equal confidences: leftmost commits position 0; topk commits what torch.topk picks on the row the
    reference holds (here the block behind 40 committed positions and before 16 masked ones, all at -inf), which
    the padding changes; under the threshold rule the top-1 among ties comes from the same call with every masked
    position's k."""
    confidence = torch.tensor([0.5, 0.5, 0.5, 0.5, 0.25], dtype=torch.bfloat16)
    masked = torch.ones(5, dtype=torch.bool)
    for policy, count, k in (("single", 1, 1), ("static", 2, 2), ("threshold", 1, 5)):
        config = DecodeConfig(policy=policy, block_length=5, **({"steps": 3} if policy == "static" else {}))  # static: 2, 2, 1
        assert config.commit_count(0, 5) == count
        leftmost = select(masked, confidence, config)
        assert torch.nonzero(leftmost)[:, 0].tolist() == list(range(count))
        for span in (Span(), Span(40, 16), Span(3, 0)):
            row = torch.nn.functional.pad(confidence, (span.before, span.after), value=float("-inf"))
            expected = torch.zeros(5, dtype=torch.bool)
            expected[torch.topk(row, k).indices[:count] - span.before] = True
            assert torch.equal(select(masked, confidence, replace(config, tie_break="topk"), span=span), expected), (policy, span)
            assert not torch.equal(expected, leftmost)  # torch's order among these ties is not the leftmost
    with pytest.raises(ValueError, match="unknown tie_break 'rightmost'; choose one of leftmost, topk"):
        DecodeConfig(tie_break="rightmost")


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_the_ranked_span_is_the_canvas_rows_each_reference_ranks(cache):
    """A block of 8 at position 11 of a 35-position canvas: the uncached generators rank the whole canvas at every
    step, Fast-dLLM's cached ones at the block-start forward; later the rows they feed. Block-causal targets: the block."""
    build, _, _ = TARGETS["llada"]
    target = DualCacheTarget(build(seed=0), MASK, frozenset({EOS}), 8, cache=cache)
    later = {"none": Span(11, 16), "prefix": Span(0, 16), "dual": Span()}[cache]
    assert target.ranked_span(11, 35, 0) == Span(11, 16) and target.ranked_span(11, 35, 3) == later
    assert tiny_target(8).ranked_span(16, 48, 2) == Span()


# (reference, seed, prompt, knob): bf16 decodes where the leftmost rule parts from the reference's torch.topk at a tie.
TOPK_TIES = [("llada", 0, list(range(1, 17)), None), ("dream", 4, list(range(1, 17)), "maskgit_plus"),
             ("dream", 3, list(range(1, 12)), "entropy"), ("fast-dllm-dream", 0, list(range(2, 7)), "full canvas"),
             ("fast-dllm-dream", 1, list(range(1, 12)), "confidence_threshold"), ("fast-dllm-dream", 1, list(range(1, 12)), "entropy")]


@pytest.mark.parametrize(("name", "seed", "prompt", "knob"), TOPK_TIES, ids=[f"{n}-{s}-{k}" for n, s, _, k in TOPK_TIES])
def test_tie_break_topk_decodes_bf16_ties_as_the_references_torch_topk(name, seed, prompt, knob):
    """The docs' reference lines with tie_break=topk decode as the generators run unamended (their torch.topk on
    their own rows), token for token in bf16, where the leftmost rule (the default) parts from them at a tie:
    LLaDA's generate.py, Dream's diffusion_generate (top_k 50) and Fast-dLLM's Dream, full-canvas capped and blocked."""
    family = "llada" if name == "llada" else "dream"
    build, _, shift = TARGETS[family]
    model = build(seed=seed, dtype=torch.bfloat16)
    with torch.no_grad():
        model.lm_head.weight.mul_(FLAT)
    exact = dict(mask_in_softmax=True, stop_at_eos=False, confidence_dtype="model")
    if name == "llada":
        target = DualCacheTarget(model, MASK, frozenset({EOS}), 8, cache="none")
        config = DecodeConfig(policy="static", steps=4, block_length=8, gen_length=24, **exact)
        expected = llada_generate(model, prompt, 24, 8, 12, pick=torch_topk)
    elif name == "dream":
        target = DualCacheTarget(model, MASK, frozenset({EOS}), 24, cache="none", shift=shift)
        confidence = {"maskgit_plus": "probability", "entropy": "entropy"}[knob]
        config = DecodeConfig(policy="timestep", steps=10, block_length=24, gen_length=24, confidence=confidence,
                              sampling=Sampling(top_k=DREAM_TOP_K), **exact)
        expected = dream_generate(model, prompt, 24, 10, knob, DREAM_TOP_K, pick=torch_topk)
    elif knob == "full canvas":
        target = DualCacheTarget(model, MASK, frozenset({EOS}), 32, cache="none", shift=shift)
        config = DecodeConfig(policy="threshold", threshold=0.3, capped=True, steps=4, block_length=32, gen_length=32, **exact)
        expected = fast_dllm_dream_full_canvas(model, prompt, 32, 4, 0.3, pick=torch_topk)
    else:
        target = DualCacheTarget(model, MASK, frozenset({EOS}), 8, cache="prefix", shift=shift)
        policy = dict(policy="threshold", threshold=0.3) if knob == "confidence_threshold" else dict(policy="timestep", steps=4)
        config = DecodeConfig(**policy, block_length=8, gen_length=24, confidence="entropy" if knob == "entropy" else "probability",
                              first_token_commit=True, **exact)
        expected = fast_dllm_dream(model, prompt, 24, 8, 12, knob, threshold=0.3, pick=torch_topk)
    assert list(generate(target, prompt, replace(config, tie_break="topk")).token_ids) == expected
    assert list(generate(target, prompt, config).token_ids) != expected  # a tie the leftmost rule breaks otherwise


class InPlaceCache:
    """Fast-dLLM's dual cache: every position's keys and values from the block-start forward, the block's own rows
    overwritten in place (its `replace_position`), so attention sums over the keys in position order."""

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end, self.kv = start, end, {}

    def update(self, key, value, layer):
        if layer not in self.kv:  # the block-start forward: keep everything
            self.kv[layer] = (key, value)
            return key, value
        keys, values = (t.clone() for t in self.kv[layer])
        keys[:, :, self.start : self.end], values[:, :, self.start : self.end] = key, value
        return keys, values


def fast_dllm_llada_in_place(model, prompt: list[int], gen_length: int, block_length: int, threshold: float | None,
                             steps: int | None = None, cache: str = "dual"):
    """Fast-dLLM's LLaDA generators at T = 0 as it computes them (llada/generate.py): `generate_with_dual_cache`,
    keys in position order (InPlaceCache) and no attention mask (bidirectional SDPA), or with cache "none" its
    `generate`, a full forward each step: (tokens, the block's logits at every forward). Each step ranks what its
    get_transfer_index gets (the whole canvas at a full forward, the block's rows later), confidences from a
    float64 softmax, with torch.topk: threshold None commits get_num_transfer_tokens(block, steps) positions a
    step (`steps` None: one), else Fast-dLLM's threshold rule (the top one and every other at >= threshold)."""
    x, n, seen, kv = torch.tensor(prompt + [MASK] * gen_length), len(prompt), [], [None]
    for layer in model.model.layers:  # the cache reaches the attention alone: the model then makes no mask
        layer.self_attn.forward = (lambda f: lambda *a, **kw: f(*a, **{**kw, "cache": kv[0]}))(layer.self_attn.forward)

    def forward(ids, positions):
        return model.lm_head(model.model(input_ids=ids[None], position_ids=positions[None]).last_hidden_state[0])

    def commit(logits, offset, i):  # logits [R, V] of the rows the forward fed, from position `offset`
        seen.append(logits[start - offset : end - offset].float())
        p = torch.softmax(logits.double(), dim=-1)
        x0 = torch.where(torch.arange(p.shape[-1]) == MASK, -1.0, p).argmax(dim=-1)
        mask_index = x[offset : offset + len(logits)] == MASK
        mask_index[end - offset :] = False
        confidence = torch.where(mask_index, p.gather(-1, x0[:, None])[:, 0], float("-inf"))
        values, chosen = torch.topk(confidence, int(mask_index.sum()) if threshold is not None else counts[i])
        if threshold is not None:
            chosen = chosen[(values >= threshold) | (torch.arange(len(values)) == 0)]
        x[offset + chosen] = x0[chosen]

    with torch.no_grad():
        for b in range(gen_length // block_length):
            start, end = n + b * block_length, n + (b + 1) * block_length
            per, masks = steps or block_length, int((x[start:end] == MASK).sum())
            counts = [masks // per + (i < masks % per) for i in range(per)]  # its get_num_transfer_tokens
            kv[0] = InPlaceCache(start, end) if cache == "dual" else None
            commit(forward(x, torch.arange(len(x))), 0, 0)
            i = 1
            while bool((x[start:end] == MASK).any()):
                if cache == "dual":
                    commit(forward(x[start:end], torch.arange(start, end)), start, i)
                else:
                    commit(forward(x, torch.arange(len(x))), 0, i)
                i += 1
    return x[n:].tolist(), seen


@pytest.mark.parametrize("cache", ["none", "dual"])
@pytest.mark.parametrize("rule", ["threshold", "steps"])
def test_llada_decodes_as_fast_dllms_generate_and_its_cached_generators_by_steps(cache, rule):
    """The docs' lines for Fast-dLLM's LLaDA `generate` (no cache) and its cached generators run by steps instead
    of a threshold, in bf16 (float64 confidences, as Fast-dLLM computes them), ties as its torch.topk breaks them."""
    build, _, _ = TARGETS["llada"]
    by = dict(policy="threshold", threshold=0.2) if rule == "threshold" else dict(policy="static", steps=3)
    config = DecodeConfig(**by, block_length=8, gen_length=24, mask_in_softmax=True, stop_at_eos=False, tie_break="topk")
    for seed, prompt in ((11, list(range(1, 12))), (4, list(range(2, 10)))):
        model = build(seed=seed, dtype=torch.bfloat16)
        target = DualCacheTarget(model, MASK, frozenset({EOS}), 8, cache=cache)
        expected, _ = fast_dllm_llada_in_place(build(seed=seed, dtype=torch.bfloat16), prompt, 24, 8,
                                               by.get("threshold"), by.get("steps"), cache)
        assert list(generate(target, prompt, config).token_ids) == expected, (seed, len(prompt))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("threshold", [None, 0.2])
def test_dual_cache_logits_equal_fast_dllms_bit_for_bit_in_every_dtype(dtype, threshold):
    """Keys in position order sum as Fast-dLLM's dual cache sums them: the same logits at every forward, to the
    last bit, in bf16 too (in [frozen | block] order they differ in bf16: bench/key_order.py)."""
    build, _, _ = TARGETS["llada"]
    model = build(seed=11, dtype=dtype)
    config = DecodeConfig(policy="threshold" if threshold else "single", threshold=threshold or 0.9, block_length=8,
                          gen_length=24, mask_in_softmax=True, stop_at_eos=False)
    for prompt in (list(range(1, 12)), list(range(2, 10))):
        target = DualCacheTarget(model, MASK, frozenset({EOS}), 8, cache="dual")
        logits, verify = [], target.verify_batch

        def recorded(calls, verify=verify, logits=logits):
            out = verify(calls)
            logits += [v.logits for v in out]
            return out

        target.verify_batch = recorded
        tokens = list(generate(target, prompt, config).token_ids)
        expected, seen = fast_dllm_llada_in_place(build(seed=11, dtype=dtype), prompt, 24, 8, threshold)
        assert tokens == expected and len(logits) == len(seen) >= 3, len(prompt)
        assert all(torch.equal(ours[0].float(), theirs) for ours, theirs in zip(logits, seen, strict=True))


# -- the dual cache's key order ------------------------------------------------------------------


def test_dual_cache_keys_in_position_order_change_only_the_order_of_a_sum():
    build, _, shift = TARGETS["llada"]
    model = build(seed=3)
    prompt, config = list(range(1, 12)), DecodeConfig(block_length=8, gen_length=16, stop_at_eos=False)
    position = generate(DualCacheTarget(model, MASK, frozenset({EOS}), 8, shift=shift), prompt, config, record=True, record_topk=4)
    first = generate(DualCacheTarget(model, MASK, frozenset({EOS}), 8, shift=shift, key_order="frozen_first"), prompt, config,
                     record=True, record_topk=4)
    assert position.token_ids == first.token_ids  # fp32: the orders differ in the last bits only
    for a, b in zip(position.trajectory, first.trajectory, strict=True):
        assert torch.allclose(a.topk_logprobs, b.topk_logprobs, atol=1e-5)
    with pytest.raises(ValueError, match="key_order 'sorted' is not one of position, frozen_first"):
        DualCacheTarget(model, MASK, frozenset({EOS}), 8, key_order="sorted")


def test_a_greedy_random_order_reads_the_noise_everywhere_a_step_is_taken():
    """budget=auto's drafter timing takes a step as decoding does: under the random order it needs the noise at T = 0."""
    from spot.cost import measure_drafter

    assert not DecodeConfig().noisy and DecodeConfig(confidence="random").noisy
    assert DecodeConfig(policy="timestep", alg_temp=0.5).noisy and DecodeConfig(sampling=Sampling(1.0)).noisy
    target = tiny_target(16)
    config = DecodeConfig(block_length=16, budget=4, confidence="random")
    reference = generate(target, list(range(1, 12)), replace(config, budget=0, gen_length=32), record=True)
    assert measure_drafter(drafters(reference)[-1], target, config, repeats=1) > 0
