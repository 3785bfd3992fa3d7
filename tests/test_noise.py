import math

import torch

from spot.noise import gumbel, gumbel_at, step_key


def test_same_key_same_noise_and_distinct_keys_differ():
    a = gumbel(step_key(0, 1, 2, 3), 16, 100)
    assert torch.equal(a, gumbel(step_key(0, 1, 2, 3), 16, 100))
    for other in [(1, 1, 2, 3), (0, 2, 2, 3), (0, 1, 3, 3), (0, 1, 2, 4)]:
        assert not torch.equal(a, gumbel(step_key(*other), 16, 100))


def test_positions_and_tokens_get_different_noise():
    g = gumbel(step_key(0, 0, 0, 0), 32, 1000)
    assert g.shape == (32, 1000) and g.dtype == torch.float64
    assert torch.unique(g).numel() > 0.99 * g.numel()


def test_noise_is_standard_gumbel():
    g = gumbel(step_key(7, 0, 0, 0), 64, 4096).flatten()
    euler_gamma = 0.5772156649
    assert abs(g.mean().item() - euler_gamma) < 0.01
    assert abs(g.var().item() - math.pi**2 / 6) < 0.03


def test_gumbel_max_samples_the_softmax():
    logits = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)
    counts = torch.zeros(3)
    for step in range(4000):
        counts[torch.argmax(logits + gumbel(step_key(0, 0, 0, step), 1, 3)[0])] += 1
    assert torch.allclose(counts / counts.sum(), torch.softmax(logits, 0).float(), atol=0.03)


def test_noise_at_chosen_tokens_equals_the_full_tensor():
    key = step_key(3, 1, 4, 1)
    full = gumbel(key, 8, 50)
    positions = torch.tensor([[0, 0], [5, 5], [7, 7]])
    tokens = torch.tensor([[3, 49], [0, 17], [2, 8]])
    assert torch.equal(gumbel_at(key, positions, tokens), full[positions, tokens])


def test_distinct_seeds_never_share_a_noise_key():
    """step_key chains bijective 32-bit mixes, so for a fixed (request, block, step) it is a bijection of the
    32-bit seed; DecodeConfig refuses seeds of 2**32 and more, which would alias (tests/test_engine.py)."""
    g = torch.Generator().manual_seed(0)
    seeds = {0, 1, 2**31, 2**32 - 1, *torch.randint(0, 2**32, (100_000,), generator=g, dtype=torch.int64).tolist()}
    for request, block, step in ((0, 0, 0), (2**32 - 1, 7, 31)):
        assert len({step_key(seed, request, block, step) for seed in seeds}) == len(seeds)
