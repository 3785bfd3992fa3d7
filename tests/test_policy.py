"""The commit policies on literal inputs: no model, exact expected states."""

import torch

from spot.config import DecodeConfig, Sampling
from spot.policy import filtered_logits, next_state, propose

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
