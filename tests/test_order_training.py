"""The order model's training loop on synthetic trajectories, and the drafter checkpoint on disk.

Synthetic blocks follow a known rule (the target commits the masked position whose top-1
log-probability is highest), so the heuristic baseline's accuracy is known exactly and the loss
has something to learn. A small OrderModelConfig keeps every test to a few seconds.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from spot.drafters.order_examples import RecordedBlock, example_index, make_examples, order_example_index
from spot.drafters.order_model import SCALARS, OrderModel, OrderModelConfig
from spot.drafters.order_training import (
    TrainConfig,
    build_batch,
    evaluate,
    example_triples,
    split_by_request,
    train,
)
from spot_eval.checkpoints.drafter import FORMAT, load_checkpoint, save_checkpoint, state_sha256
from spot_eval.checkpoints.fingerprint import check_fingerprint

MASK, K, TOPK = 99, 8, 4
SMALL = OrderModelConfig(topk=TOPK, d_model=32, heads=4, layers=1, ff=64, buckets=16, max_block=16)
FINGERPRINT = {"model": "tiny", "tokenizer_sha256": "ab", "weights_digest": "cd", "block_length": K, "policy": "single"}



def synthetic_block(request: int, block: int, drift: float, temperature: float = 0.0, seed: int = 0) -> RecordedBlock:
    """A `single`-policy block: each step commits the masked position with the highest top-1
    log-probability of that step's logits, which drift by `drift` per step (0: stale == fresh)."""
    g = torch.Generator().manual_seed(1000 * request + block)
    state = torch.full((K,), MASK)
    state[0] = 7  # a prompt token: never a candidate
    top1 = torch.rand(K, generator=g).log()  # [K]
    states, lps, ids = [state], [], []
    while (state == MASK).any():
        top1 = (top1 + drift * torch.randn(K, generator=g)).clamp_max(0.0)
        lp = torch.stack([top1 - 1.5 * j for j in range(TOPK)], -1)  # [K, k], descending
        tok = torch.randint(0, MASK, (K, TOPK), generator=g)
        p = int(top1.masked_fill(state != MASK, float("-inf")).argmax())
        state = state.clone()
        state[p] = tok[p, 0]
        states.append(state)
        lps.append(lp)
        ids.append(tok)
    return RecordedBlock(torch.stack(states), torch.stack(lps), torch.stack(ids), MASK, seed, request, block, temperature)


def synthetic(n_requests: int = 12, drift: float = 0.3) -> list[RecordedBlock]:
    return [synthetic_block(r, b, drift, temperature=float(r % 2)) for r in range(n_requests) for b in range(2)]


def quick(**overrides) -> TrainConfig:
    return TrainConfig(**{"steps": 60, "batch_size": 16, "warmup": 5, "lr": 1e-2, "max_depth": 3, "heldout_fraction": 0.25,
                          "log_every": 5, "model": SMALL, **overrides})


def test_examples_and_labels_follow_the_trajectory():
    block = synthetic_block(0, 0, drift=0.0)
    triples = example_triples([block], max_depth=3)
    batch = build_batch([block], triples, SMALL.buckets)
    committed = block.committed_positions()
    for (_, s, d), label, candidates in zip(triples.tolist(), batch.labels, batch.candidates, strict=True):
        assert int(label) == int(committed[s + d])
        assert bool(candidates[label]) and not bool(candidates[0])  # the label is masked, the prompt never is
        assert torch.equal(candidates, block.states[s + d] == MASK)
    last = batch.feats[..., TOPK + SCALARS.index("last_commit")]
    assert torch.equal(last.argmax(-1), committed[triples[:, 1] + triples[:, 2] - 1]) and torch.equal(last.sum(-1), torch.ones(len(last)))


def test_steps_of_several_commits_are_no_order_labels():
    """A threshold-policy block: the order model learns only the steps that commit one position (a chain of single
    commits can match no other), and needs a single commit before its label too (the last-commit feature)."""
    block = synthetic_block(0, 0, drift=0.2)
    merged = torch.cat([block.states[:3], block.states[4:]])  # step 2 commits two positions at once
    threshold = replace(block, states=merged, topk_logprobs=torch.cat([block.topk_logprobs[:3], block.topk_logprobs[4:]]),
                        topk_ids=torch.cat([block.topk_ids[:3], block.topk_ids[4:]]))
    committed = threshold.committed_positions()
    assert committed[2] == -1 and bool((committed[[0, 1, 3]] >= 0).all())
    pairs = order_example_index(threshold, max_depth=3)
    assert pairs == [(s, d) for s, d in example_index(threshold, 3) if 2 not in (s + d, s + d - 1)] and len(pairs) > 4
    batch = make_examples(threshold, pairs, SMALL.buckets)
    assert torch.equal(batch.labels, committed[[s + d for s, d in pairs]])
    assert order_example_index(block, 3) == example_index(block, 3)  # a single-policy block keeps every pair


def test_heuristic_baseline_is_exact_when_stale_equals_fresh():
    blocks = [synthetic_block(r, 0, drift=0.0) for r in range(3)]  # T = 0 and constant confidences
    evaluation = evaluate(OrderModel(SMALL), blocks, max_depth=3)
    assert all(a.heuristic == 1.0 and a.examples > 0 for a in evaluation.by_depth)
    assert evaluation.by_temperature == ((0.0, evaluation.depth0),)


def test_split_is_by_request_and_seeded():
    blocks = synthetic(n_requests=20)
    train_blocks, heldout = split_by_request(blocks, 0.1, seed=3)
    assert {b.request for b in train_blocks}.isdisjoint({b.request for b in heldout})
    assert len({b.request for b in heldout}) == 2 and len(train_blocks) + len(heldout) == len(blocks)
    assert {b.temperature for b in heldout} == {0.0, 1.0}  # stratified by temperature
    assert [b.request for b in split_by_request(blocks, 0.1, seed=3)[1]] == [b.request for b in heldout]
    with pytest.raises(ValueError, match="needs >= 2 requests"):
        split_by_request(blocks[:2], 0.1, seed=0)


def test_training_is_deterministic_and_the_loss_falls():
    blocks = synthetic()
    first, again = train(blocks, quick()), train(blocks, quick())
    for name, tensor in first.model.state_dict().items():
        assert torch.equal(tensor, again.model.state_dict()[name]), name
    assert first.curve == again.curve and first.heldout == again.heldout
    assert first.curve[-1][1] < 0.85 * first.curve[0][1]
    torch.manual_seed(0)
    untrained = evaluate(OrderModel(SMALL), split_by_request(blocks, 0.25, seed=0)[1], max_depth=3)
    assert first.heldout.loss < untrained.loss
    assert first.steps == 60 and not first.stopped_early and first.parameters == sum(p.numel() for p in first.model.parameters())
    other = train(blocks, quick(seed=1))
    assert not torch.equal(other.model.head.weight, first.model.head.weight)


def test_progress_is_reported_and_the_time_cap_stops_early():
    seen = []
    result = train(synthetic(), quick(steps=10), progress=seen.append)
    assert [p.step for p in seen] == [5, 10]
    capped = train(synthetic(), quick(steps=10_000, max_seconds=0.0))
    assert capped.stopped_early and capped.steps == 0 and result.steps == 10


def test_bad_training_input_is_named():
    with pytest.raises(ValueError, match="do not fit an order model with topk 32"):
        train(synthetic(), quick(model=OrderModelConfig()))
    with pytest.raises(ValueError, match="mix block lengths"):
        short = synthetic_block(50, 0, 0.3)
        short = RecordedBlock(short.states[:, :4], short.topk_logprobs[:, :4], short.topk_ids[:, :4], MASK, 0, 50, 0, 0.0)
        train([*synthetic(), short], quick())
    with pytest.raises(ValueError, match="steps must be >= 1"):
        TrainConfig(steps=0)


# -- the checkpoint ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("drafter") / "spot.pt"
    torch.manual_seed(0)
    save_checkpoint(path, OrderModel(SMALL), FINGERPRINT, {"heldout_top1_depth0": 0.5})
    return path


def test_checkpoint_round_trip_with_weights_only(checkpoint):
    raw = torch.load(checkpoint, weights_only=True)
    assert raw["format"] == FORMAT and raw["gamma"] is None and raw["config"] == SMALL.to_dict()
    loaded = load_checkpoint(checkpoint)
    assert loaded.config == SMALL and loaded.fingerprint == FINGERPRINT and loaded.metrics == {"heldout_top1_depth0": 0.5}
    torch.manual_seed(0)
    for name, tensor in OrderModel(SMALL).state_dict().items():
        assert torch.equal(loaded.model.state_dict()[name], tensor)
    assert not loaded.model.training and loaded.gamma is None


def test_gamma_round_trips(tmp_path):
    save_checkpoint(tmp_path / "g.pt", OrderModel(SMALL), FINGERPRINT, {}, gamma=(1.0, 0.5))
    assert load_checkpoint(tmp_path / "g.pt").gamma == (1.0, 0.5)


def damaged(checkpoint, tmp_path, edit) -> str:
    data = bytearray(checkpoint.read_bytes())
    path = tmp_path / "damaged.pt"
    path.write_bytes(bytes(edit(data)))
    return str(path)


def flip(offset_fraction: float):
    def edit(data: bytearray) -> bytearray:
        data[int(len(data) * offset_fraction)] ^= 0xFF
        return data

    return edit


@pytest.mark.parametrize(
    "edit",
    [lambda d: d[: len(d) // 2], lambda d: d[:100], lambda d: b""],
    ids=["truncated-half", "truncated-head", "empty"],
)
def test_damaged_files_are_named_as_corrupt(checkpoint, tmp_path, edit):
    path = damaged(checkpoint, tmp_path, edit)
    with pytest.raises(ValueError, match="corrupt or truncated") as err:
        load_checkpoint(path)
    assert path in str(err.value) and "retrain" in str(err.value)


@pytest.mark.parametrize("fraction", [0.5, 0.3, 0.01, 0.02, 0.999], ids=lambda f: f"flip-at-{f}")
def test_a_flipped_byte_is_named_as_corrupt_or_changes_nothing(checkpoint, tmp_path, fraction):
    """Never a quietly different drafter: a flip is caught, or it hit a byte that carries no data (a pickle
    memo slot, zip padding) and everything loads exactly as saved."""
    path = damaged(checkpoint, tmp_path, flip(fraction))
    try:
        loaded = load_checkpoint(path)
    except ValueError as err:
        assert "corrupt or truncated" in str(err) and path in str(err)
        return
    original = load_checkpoint(checkpoint)
    assert (loaded.config, loaded.fingerprint, loaded.metrics, loaded.gamma, loaded.reach) == (
        original.config, original.fingerprint, original.metrics, original.gamma, original.reach)
    state = original.model.state_dict()
    assert all(torch.equal(t, state[name]) for name, t in loaded.model.state_dict().items())


def rewritten(checkpoint, tmp_path, change) -> str:
    raw = torch.load(checkpoint, weights_only=True)
    change(raw)
    path = tmp_path / "rewritten.pt"
    torch.save(raw, path)
    return str(path)


def _wrong_shape(raw: dict) -> None:
    raw["state_dict"]["head.weight"] = torch.zeros(1, 16)
    raw["state_sha256"] = state_sha256(raw["state_dict"])


@pytest.mark.parametrize(
    "change, why",
    [
        (lambda raw: raw.update(format="spot-order-model/0"), "format 'spot-order-model/0'"),
        (lambda raw: raw.pop("fingerprint"), "missing keys"),
        (lambda raw: raw["config"].update(d_model=64), "do not fit the recorded config"),
        (_wrong_shape, "do not fit the recorded config"),
        (lambda raw: raw["fingerprint"].pop("block_length"), "fingerprint lacks"),
        (lambda raw: raw.update(gamma="high"), "gamma is 'high'"),
    ],
)
def test_foreign_or_inconsistent_files_are_named(checkpoint, tmp_path, change, why):
    path = rewritten(checkpoint, tmp_path, change)
    with pytest.raises(ValueError, match="corrupt or truncated") as err:
        load_checkpoint(path)
    assert why in str(err.value) and path in str(err.value)


@pytest.mark.parametrize(
    "retired, why", [("spot-order-model/1", "reads no last-commit input"), ("spot-order-model/2", "reads no margin")]
)
def test_a_checkpoint_of_a_retired_format_asks_for_retraining(checkpoint, tmp_path, retired, why):
    path = rewritten(checkpoint, tmp_path, lambda raw: raw.update(format=retired))
    with pytest.raises(ValueError, match=f"written by an earlier spot-eval: its order model {why}") as err:
        load_checkpoint(path)
    assert "retrain it with spot-eval train-drafter" in str(err.value) and path in str(err.value)


def test_missing_file_and_other_target_are_clear(tmp_path, checkpoint):
    with pytest.raises(FileNotFoundError, match="train one with spot-eval train-drafter"):
        load_checkpoint(tmp_path / "nope.pt")
    check_fingerprint(FINGERPRINT, {**FINGERPRINT, "model": "renamed-directory"})  # the name is informational
    for field, value in (("block_length", 16), ("weights_digest", "ef"), ("policy", "threshold")):
        other = {**FINGERPRINT, field: value}
        with pytest.raises(ValueError, match=f"differs in {field}") as err:
            check_fingerprint(FINGERPRINT, other)
        assert json.dumps(FINGERPRINT) in str(err.value) and json.dumps(other) in str(err.value)
