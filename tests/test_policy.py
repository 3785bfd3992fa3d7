"""The commit policies on literal inputs: no model, exact expected states."""

import math

import pytest
import torch

from spot.config import DecodeConfig, Sampling
from spot.policy import Margins, Proposal, filtered_logits, next_state, propose

M = 9  # mask id in these literal cases (vocabulary of 10)


def logits_for(rows):
    """[K, 10] logits with the given (token, logit) peaks; everything else at 0."""
    out = torch.zeros(len(rows), 10)
    for i, (token, value) in enumerate(rows):
        out[i, token] = value
    return out


def test_single_commits_the_most_confident_masked_position():
    state = torch.tensor([5, M, M, M])
    logits = logits_for([(1, 9.0), (2, 1.0), (3, 4.0), (4, 2.0)])  # position 0 is committed already
    assert next_state(state, logits, None, DecodeConfig(), M).tolist() == [5, M, 3, M]


def test_threshold_commits_top1_plus_every_confident_position():
    state = torch.tensor([M, M, M, M])
    logits = logits_for([(1, 3.0), (2, 12.0), (3, 11.0), (4, 1.0)])
    config = DecodeConfig(policy="threshold", threshold=0.9)
    assert next_state(state, logits, None, config, M).tolist() == [M, 2, 3, M]
    # Nothing above the threshold: still exactly one commit.
    low = logits_for([(1, 1.0), (2, 2.0), (3, 1.5), (4, 1.0)])
    assert next_state(state, low, None, config, M).tolist() == [M, 2, M, M]


def test_ties_go_to_the_leftmost_position():
    state = torch.tensor([M, M, M])
    logits = logits_for([(1, 5.0), (2, 5.0), (3, 5.0)])
    assert next_state(state, logits, None, DecodeConfig(), M).tolist() == [1, M, M]


def test_the_mask_token_is_never_written():
    logits = torch.zeros(2, 10)
    logits[:, M] = 100.0
    logits[:, 4] = 1.0
    p = propose(logits, None, Sampling(), M)
    assert p.tokens.tolist() == [4, 4]


def test_confidence_is_the_probability_under_the_scaled_filtered_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2, 0, 0, 0, 0, 0, 0, 0]]).clamp_min(1e-30))
    g = torch.zeros(1, 10, dtype=torch.float64)
    p = propose(logits, g, Sampling(temperature=1.0, top_k=2), M)
    assert p.tokens.tolist() == [0]
    assert abs(p.confidence.item() - 0.5 / 0.8) < 1e-6  # float32 logits
    # Temperature 0 is the argmax with its unfiltered softmax probability.
    p0 = propose(logits, None, Sampling(), M)
    assert abs(p0.confidence.item() - 0.5) < 1e-6


def test_top_p_keeps_the_smallest_set_reaching_p_and_always_the_top_token():
    z = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=torch.float64))
    kept = torch.isfinite(filtered_logits(z, Sampling(temperature=1.0, top_p=0.75))).tolist()
    assert kept == [[True, True, False, False]]
    kept = torch.isfinite(filtered_logits(z, Sampling(temperature=1.0, top_p=0.01))).tolist()
    assert kept == [[True, False, False, False]]


def test_gumbel_noise_decides_the_token_at_positive_temperature():
    logits = logits_for([(1, 1.0)])
    g = torch.zeros(1, 10, dtype=torch.float64)
    g[0, 7] = 5.0  # noise strong enough to beat the logit gap
    assert propose(logits, g, Sampling(temperature=1.0), M).tokens.tolist() == [7]
    assert propose(logits, g, Sampling(temperature=1.0, top_k=1), M).tokens.tolist() == [1]


def test_the_token_margin_is_the_lead_in_logits_plus_scaled_noise():
    logits = logits_for([(1, 3.0), (2, 0.5)])  # position 0: 3 over 0; position 1: 0.5 over 0
    at_zero = propose(logits, None, Sampling(), M, margins=True)
    assert at_zero.token_margin.tolist() == [3.0, 0.5]
    assert propose(logits, None, Sampling(), M).token_margin is None  # only on request
    noise = torch.zeros(2, 10, dtype=torch.float64)
    noise[1, 7] = 2.0  # at T = 0.5 token 7 scores 0 / 0.5 + 2 = 2 against token 2's 0.5 / 0.5 = 1
    sampled = propose(logits, noise, Sampling(temperature=0.5), M, margins=True)
    assert sampled.tokens.tolist() == [1, 7]
    assert sampled.token_margin.tolist() == [3.0, 0.5]  # lead (6 - 0, 2 - 1) in score units, times T


def confidences(values, margins):
    """A Proposal with literal confidences and token margins (tokens are not read by Margins)."""
    return Proposal(torch.zeros(len(values), dtype=torch.long), torch.tensor(values, dtype=torch.float64),
                    torch.tensor(margins, dtype=torch.float64))


def test_margins_of_a_step_on_literal_confidences():
    before = torch.tensor([M, M, M, 7])
    proposal = confidences([0.5, 0.2, 0.3, 0.9], [1.0, 2.0, 3.0, 4.0])  # position 3 is committed already
    single = Margins.of(before, torch.tensor([4, M, M, 7]), proposal, DecodeConfig(), M)
    assert single.position == pytest.approx(math.log(0.5 / 0.3)) and single.threshold is None and single.token == 1.0
    config = DecodeConfig(policy="threshold", threshold=0.25)
    both = Margins.of(before, torch.tensor([4, M, 6, 7]), proposal, config, M)
    # tau = 0.25: position 2 (0.3) is the nearest of the non-top-1 positions, then position 1 (0.2)
    assert both.threshold == pytest.approx(math.log(0.3 / 0.25)) and both.token == 1.0
    assert Margins.of(torch.tensor([M, 5, 5, 7]), torch.tensor([4, 5, 5, 7]), proposal, config, M) == Margins(None, None, 1.0)


def test_a_logit_error_flips_only_decisions_within_the_bounds():
    bounds = Margins(None, None, 0.0).bounds(delta=0.1, temperature=0.0)
    assert (bounds.position, bounds.threshold, bounds.token) == pytest.approx((0.4, 0.2, 0.2))
    assert Margins(None, None, 0.0).bounds(0.1, temperature=2.0).position == pytest.approx(0.2)
    assert Margins(position=0.39, threshold=None, token=5.0).within(0.1, 0.0)
    assert not Margins(position=0.41, threshold=0.21, token=0.21).within(0.1, 0.0)
    assert Margins(position=None, threshold=0.19, token=5.0).within(0.1, 0.0)


@pytest.mark.parametrize("policy", ["single", "threshold", "static", "dynamic"])
@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.5])
def test_every_step_that_a_small_logit_error_flips_was_within_its_bounds(policy, temperature):
    """The soundness of Margins.bounds: perturb every logit by at most delta; whenever the step's outcome
    changes, the unperturbed step's margins say it could (`within`)."""
    g = torch.Generator().manual_seed(7)
    delta, flips = 0.3, 0
    steps = 3 if policy in ("static", "dynamic") else None  # 6 positions in 3 steps: 2 commits a step
    config = DecodeConfig(policy=policy, threshold=0.3, steps=steps, block_length=6, sampling=Sampling(temperature=temperature))
    for trial in range(1000):
        step = trial % 3
        logits = 2 * torch.randn(6, 10, generator=g, dtype=torch.float64)
        state = torch.where(torch.rand(6, generator=g) < 0.7, M, 5)
        state[0] = M
        noise = None
        if temperature > 0:
            noise = -torch.log(-torch.log(torch.rand(6, 10, generator=g, dtype=torch.float64)))
        error = (2 * torch.rand(6, 10, generator=g, dtype=torch.float64) - 1) * delta
        after = next_state(state, logits, noise, config, M, step)
        if torch.equal(next_state(state, logits + error, noise, config, M, step), after):
            continue
        flips += 1
        proposal = propose(logits, noise, config.sampling, M, margins=True)
        assert Margins.of(state, after, proposal, config, M, step).within(delta, temperature)
    assert flips > 10  # the perturbation is large enough to test something


def test_sdar_schedules_split_a_block_as_get_num_transfer_tokens_does():
    """block_length // steps commits a step, the remainder one each to the first steps."""
    assert [DecodeConfig(policy="static", block_length=32, steps=4).commit_count(s) for s in range(4)] == [8] * 4
    assert [DecodeConfig(policy="static", block_length=10, steps=4).commit_count(s) for s in range(4)] == [3, 3, 2, 2]
    assert DecodeConfig(policy="dynamic", block_length=4).commit_count(3) == 1  # steps defaults to the block length
    assert DecodeConfig(policy="single").commit_count(5) == DecodeConfig(policy="threshold").commit_count(0) == 1
    with pytest.raises(ValueError, match="steps applies to the static, dynamic, timestep policies"):
        DecodeConfig(policy="single", steps=4)
    with pytest.raises(ValueError, match=r"steps must be in \[1, block_length = 8\], got 9"):
        DecodeConfig(policy="static", block_length=8, steps=9)


def test_static_commits_the_k_most_confident_and_dynamic_the_confident_set_or_the_k_most_confident():
    state = torch.tensor([M, M, M, M, 5])
    # confidences about 0.72, 0.36, 0.98, 0.95 (a peak of 3, 1.5, 6, 5 against 8 zeros; the mask token is excluded)
    logits = logits_for([(1, 3.0), (2, 1.5), (3, 6.0), (4, 5.0), (5, 9.0)])
    static = DecodeConfig(policy="static", block_length=5, steps=2)  # 3 then 2 commits
    assert next_state(state, logits, None, static, M, step=0).tolist() == [1, M, 3, 4, 5]
    assert next_state(state, logits, None, static, M, step=1).tolist() == [M, M, 3, 4, 5]
    confidence = propose(logits, None, Sampling(), M).confidence
    tau = float((confidence[2] + confidence[3]) / 2)  # only position 2 clears it
    dynamic = DecodeConfig(policy="dynamic", threshold=tau, block_length=5, steps=5)  # k_s = 1
    assert next_state(state, logits, None, dynamic, M).tolist() == [M, M, 3, M, 5]
    two = DecodeConfig(policy="dynamic", threshold=tau, block_length=5, steps=2)  # k_0 = 3 > one confident position
    assert next_state(state, logits, None, two, M).tolist() == [1, M, 3, 4, 5]
    exactly = DecodeConfig(policy="dynamic", threshold=float(confidence[3]), block_length=5)  # strictly greater
    assert next_state(state, logits, None, exactly, M).tolist() == [M, M, 3, M, 5]
