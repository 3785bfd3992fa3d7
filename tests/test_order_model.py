"""The order model's inputs, from literal stale distributions."""

from __future__ import annotations

import math

import pytest
import torch

from spot.drafters.order_model import (
    SCALARS,
    OrderModel,
    Prediction,
    Prior,
    features,
    predict,
    step_noise_at_topk,
)
from spot.noise import gumbel, step_key

K_TOP = 3


def column(feats: torch.Tensor, name: str) -> torch.Tensor:
    return feats[..., K_TOP + SCALARS.index(name)]


def test_confidences_are_over_the_whole_vocabulary_with_the_tail_at_the_kth_level():
    lp = torch.tensor([[math.log(0.5), math.log(0.2), math.log(0.1)]])  # [K=1, k=3]; the tail holds 0.2
    ids = torch.tensor([[7, 8, 9]])
    zero = torch.zeros(1, 3, dtype=torch.float64)
    assert torch.allclose(predict(lp, ids, 1.0, zero).probs, torch.tensor([[0.5, 0.2]]))  # exact at T = 1
    at_half = predict(lp, ids, 0.5, zero)  # tail as if at 0.1: 0.2 / 0.1 tokens of 0.1 ** 2 each
    z = 0.5**2 + 0.2**2 + 0.1**2 + 2 * 0.1**2
    assert torch.allclose(at_half.probs, torch.tensor([[0.25 / z, 0.04 / z]]))
    assert at_half.margin.item() == pytest.approx(2 * math.log(0.5 / 0.2))
    full = torch.log(torch.tensor([[0.6, 0.3, 0.1]]))  # no tail: a plain softmax of logits / T
    assert torch.allclose(predict(full, ids, 2.0, zero).probs, torch.softmax(full / 2, -1)[:, :2], atol=1e-6)


def test_the_noise_ranks_the_tokens_and_sets_the_margin():
    lp = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    ids = torch.tensor([[7, 8, 9]])
    noise = torch.tensor([[0.0, 1.0, 0.0]], dtype=torch.float64)
    got = predict(lp, ids, 1.0, noise)
    assert got.tokens.tolist() == [[8, 7]] and torch.allclose(got.probs, torch.tensor([[0.3, 0.5]]))
    assert got.margin.item() == pytest.approx(math.log(0.3) + 1.0 - math.log(0.5))
    greedy = predict(lp, ids, 0.0, None)
    assert greedy.tokens.tolist() == [[7, 8]] and greedy.margin.item() == pytest.approx(math.log(0.5 / 0.3))


def test_one_batched_draw_is_the_steps_drawn_one_by_one_and_the_verifiers_noise():
    ids = torch.tensor([[5, 0, 9], [2, 3, 4]])  # [K=2, k=3]
    batched = step_noise_at_topk(7, 1, 2, range(4, 8), ids)  # [D=4, K, k]
    assert batched.shape == (4, 2, 3)
    for d, step in enumerate(range(4, 8)):
        one = step_noise_at_topk(7, 1, 2, step, ids)
        assert torch.equal(batched[d], one)
        assert torch.equal(one, gumbel(step_key(7, 1, 2, step), 2, 10).gather(1, ids))  # what the verifier draws
    assert not torch.equal(batched[0], batched[1])


def test_writing_front_and_prior_trend():
    n = 6
    lp = torch.log(torch.tensor([[0.5, 0.3, 0.2]])).expand(n, 3)  # [K, k]
    ids = torch.arange(n * 3).reshape(n, 3)
    pred = Prediction(ids[:, :2], torch.tensor([[0.5, 0.3]]).expand(n, 2), torch.zeros(n))
    masked = torch.tensor([True, False, True, True, False, True])
    last = torch.tensor([False, False, False, False, True, False])
    prior = Prior(torch.full((n,), math.log(0.25)), torch.tensor([0, 0, 6, 0, 0, 0]), torch.tensor(True))
    feats, _ = features(lp, ids, pred, masked, torch.zeros(n, dtype=torch.bool), last, prior, buckets=16)
    assert torch.allclose(column(feats, "to_last_commit") * n, torch.tensor([-4.0, -3, -2, -1, 0, 1]))
    assert torch.allclose(column(feats, "to_committed_left") * n, torch.tensor([1.0, 0, 1, 2, 0, 1]))
    assert torch.allclose(column(feats, "to_committed_right") * n, torch.tensor([1.0, 0, 2, 1, 0, 1]))
    assert torch.allclose(column(feats, "prior_rise"), torch.full((n,), math.log(2.0) / 10))
    assert column(feats, "prior_same").tolist() == [1, 0, 1, 0, 0, 0] and column(feats, "prior_present").tolist() == [1] * n
    absent = features(lp, ids, pred, masked, torch.zeros(n, dtype=torch.bool), last, None, buckets=16)[0]
    assert not absent[..., K_TOP + SCALARS.index("prior_rise"):].any()


def test_the_plain_encoder_is_the_torch_layers_it_reads():
    torch.manual_seed(0)
    model = OrderModel()
    h = torch.randn(3, 8, model.config.d_model)
    assert torch.equal(model.encode(h), model.encoder(h))  # with autograd torch takes its plain path too
    with torch.inference_mode():  # where torch's fused kernel runs instead
        torch.testing.assert_close(model.encode(h), model.encoder(h), atol=1e-5, rtol=1e-5)
