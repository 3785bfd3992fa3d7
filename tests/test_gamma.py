"""SPOT-gamma's replay reproduces the engine's walk exactly, and the fit never loses to plain SPOT."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from conftest import VOCAB, tiny_target

from spot import DecodeConfig, Sampling, generate
from spot.drafters.base import DraftContext
from spot.drafters.gamma import fit_gamma, replay_commits
from spot.drafters.order_examples import ExampleBatch, RecordedBlock, example_index, make_examples
from spot.drafters.order_model import OrderModel
from spot.drafters.spot import SpotDrafter, _renormalised
from spot.targets import BlockCausalTarget


def recorded(target, prompts, config):
    blocks = []
    for request, ids in enumerate(prompts):
        g = generate(target, ids, config, request=request, record=True, record_topk=32)
        for t in g.trajectory:
            blocks.append(RecordedBlock(t.states, t.topk_logprobs, t.topk_ids, target.mask_id, config.seed,
                                        request, t.block, config.sampling.temperature))
    return blocks


def spied_drafter() -> tuple[BlockCausalTarget, SpotDrafter, list]:
    """A tiny target and the drafter of a seeded order model whose every call's (feats, buckets) lands in `seen`."""
    target = tiny_target(16, seed=4, eos_ids=frozenset())
    torch.manual_seed(0)
    model = OrderModel()
    seen: list = []
    model.register_forward_hook(lambda module, args, out: seen.append(args[:2]))
    return target, SpotDrafter(model, gate=0.9), seen


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_replay_equals_the_engine(temperature):
    target = tiny_target(16, seed=4, eos_ids=frozenset())
    torch.manual_seed(0)
    drafter = SpotDrafter(OrderModel(), gate=0.9)
    config = DecodeConfig(block_length=16, gen_length=40, sampling=Sampling(temperature), seed=2)
    prompts = [torch.randint(0, VOCAB - 2, (n,)).tolist() for n in (5, 19)]
    steps = forwards = 0
    for request, ids in enumerate(prompts):
        g = generate(target, ids, replace(config, budget=6), drafter=drafter, request=request)
        steps, forwards = steps + g.stats.steps, forwards + g.stats.forwards
    assert replay_commits(drafter, recorded(target, prompts, config), budget=6) == pytest.approx(steps / forwards, abs=1e-12)


def test_the_fit_is_at_least_plain_spot():
    target = tiny_target(16, seed=5, eos_ids=frozenset())
    torch.manual_seed(1)
    drafter = SpotDrafter(OrderModel(), gate=0.9)
    blocks = recorded(target, [list(range(1, 9))], DecodeConfig(block_length=16, gen_length=32))
    fit = fit_gamma(drafter, blocks, budget=4, roots=(0.5, 1.0), slopes=(1.0, 1.25))
    assert len(fit.grid) == 4 and fit.commits_per_forward >= fit.baseline_commits_per_forward
    assert fit.commits_per_forward == max(row[2] for row in fit.grid)


@pytest.mark.parametrize("model_depth, calls", [(1, 1), (None, None)])
def test_model_depth_one_calls_the_order_model_once_per_tree(model_depth, calls):
    target = tiny_target(16, seed=4, eos_ids=frozenset())
    torch.manual_seed(0)
    model = OrderModel()
    seen = []
    model.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[0]))
    drafter = SpotDrafter(model, gate=0.9, model_depth=model_depth)
    config = DecodeConfig(block_length=16, gen_length=40, seed=2)
    ids = list(range(1, 12))
    reference = generate(target, ids, config)
    got = generate(target, ids, replace(config, budget=8), drafter=drafter)
    assert got.token_ids == reference.token_ids
    drafts = got.stats.forwards - 1  # every forward after a block's first one drafted a tree
    if calls is None:
        assert len(seen) > 2 * drafts  # every level re-scored
    else:
        assert 0 < len(seen) <= calls * drafts
    with pytest.raises(ValueError, match="model_depth must be >= 1"):
        SpotDrafter(model, model_depth=0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_drafter_scores_the_root_from_the_features_it_was_trained_on(temperature):
    """Training examples (order_examples) and the drafter at decode time build identical inputs."""
    target, drafter, seen = spied_drafter()
    model = drafter.model
    config = DecodeConfig(block_length=16, gen_length=32, sampling=Sampling(temperature), seed=3)
    block = recorded(target, [list(range(1, 12))], config)[0]
    assert block.states.shape[0] > 3  # a few steps to compare
    for s in range(1, block.states.shape[0] - 1):
        ctx = DraftContext(block.states[s], None, block.states[s - 1], None, config, block.mask_id, block.request, block.block,
                           s, 4, lambda _: None)
        seen.clear()
        drafter.grow(ctx, block.topk_logprobs[s - 1].float(), block.topk_ids[s - 1].long(), block.prior(s))
        trained = make_examples(block, [(s, 0)], model.config.buckets)
        assert torch.equal(seen[0][0][:1], trained.feats) and torch.equal(seen[0][1][:1], trained.buckets)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_drafter_in_the_engine_reads_the_inputs_its_training_examples_hold(temperature):
    """At decode time the stale and prior logits come from verify forwards (the prior from the same
    forward when a tree was accepted, else from the one before); the order model must still see what
    make_examples builds from the draft-free trajectory at that root step."""
    target, drafter, seen = spied_drafter()
    model = drafter.model
    roots = []
    draft_batch = drafter.draft_batch  # what the engine calls, for every request drafting in a round

    def spy(ctxs):
        roots.extend((ctx.block, ctx.step, ctx.prior_logits is not None) for ctx in ctxs if ctx.stale_logits is not None)
        return draft_batch(ctxs)

    drafter.draft_batch = spy
    config = DecodeConfig(block_length=16, gen_length=48, sampling=Sampling(temperature), seed=3)
    ids = list(range(1, 12))
    got = generate(target, ids, replace(config, budget=4), drafter=drafter)
    blocks = {b.block: b for b in recorded(target, [ids], config)}
    assert got.token_ids == generate(target, ids, config).token_ids
    assert len(seen) == len(roots) and any(with_prior for *_, with_prior in roots)
    assert max(got.stats.accepted_lengths) > 1  # some priors come from the same forward as the stale logits
    for (block, s, with_prior), (feats, buckets) in zip(roots, seen, strict=True):
        assert with_prior == (s >= 2)
        trained = make_examples(blocks[block], [(s, 0)], model.config.buckets)
        assert torch.allclose(feats, trained.feats, atol=1e-5) and torch.equal(buckets, trained.buckets)


def test_examples_built_in_one_batch_equal_the_examples_built_one_at_a_time():
    """make_examples draws every example's step noise in one call and reads every prior at once (T = 1, where
    the noise decides the inputs); each row equals the example built alone, bit for bit. The one-example path
    is the one the drafter's decode-time features are checked against above."""
    target = tiny_target(16, seed=4, eos_ids=frozenset())
    config = DecodeConfig(block_length=16, gen_length=48, sampling=Sampling(1.0), seed=3)
    for block in recorded(target, [list(range(1, 12))], config):
        pairs = example_index(block, 3)
        batch = make_examples(block, pairs, 128)
        assert len(pairs) > 3 and any(s < 2 for s, _ in pairs)  # priors absent and present
        for i, pair in enumerate(pairs):
            alone = make_examples(block, [pair], 128)
            for field in ExampleBatch.__dataclass_fields__:
                assert torch.equal(getattr(alone, field)[0], getattr(batch, field)[i]), (pair, field)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_auxiliary_target_is_the_confidence_the_target_selects_by(temperature):
    """With the whole vocabulary recorded, each example's fresh confidences are the ones the target's
    step compared: their argmax over the node's masked positions is the label, at every depth."""
    target = tiny_target(16, seed=4, eos_ids=frozenset())
    config = DecodeConfig(block_length=16, gen_length=48, sampling=Sampling(temperature), seed=3)
    blocks = []
    for request, ids in enumerate([list(range(1, 12)), list(range(20, 23))]):
        g = generate(target, ids, config, request=request, record=True, record_topk=VOCAB - 1)
        blocks += [RecordedBlock(t.states, t.topk_logprobs, t.topk_ids, target.mask_id, config.seed, request, t.block,
                                 temperature) for t in g.trajectory]
    for block in blocks:
        n_steps = block.states.shape[0] - 1
        batch = make_examples(block, [(s, d) for s in range(1, n_steps) for d in range(min(3, n_steps - s))], 128)
        assert torch.equal(batch.fresh.masked_fill(~batch.candidates, -1.0).argmax(-1), batch.labels)


def test_a_node_takes_its_sources_edges_at_its_masked_positions_renormalised():
    """_renormalised: literal table of (log P_order + log q, position, token), best first."""
    logits = torch.tensor([0.0, math.log(3.0), float("-inf"), math.log(4.0)])  # position 2 committed at the source
    table = [(math.log(4.0) - 0.1, 3, 40), (math.log(3.0) - 0.2, 1, 10), (math.log(3.0) - 0.9, 1, 11), (-0.3, 0, 7)]
    # the node has also committed position 3: the order renormalises over positions {0, 1}
    edges = _renormalised(table, [True, True, False, False], logits, budget=8)
    assert [(e.position, e.token) for e in edges] == [(1, 10), (1, 11), (0, 7)]
    assert [e.logp for e in edges] == pytest.approx([math.log(0.75) - 0.2, math.log(0.75) - 0.9, math.log(0.25) - 0.3])
    assert len(_renormalised(table, [True, True, False, True], logits, budget=2)) == 2
    assert _renormalised(table, [False, False, False, False], logits, budget=8) == []
