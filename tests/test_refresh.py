"""SPOT-R (spot.drafters.refresh): the neighbours its head reads, its training examples on literal blocks, training,
its trees lossless whatever the head's weights (fp32 and bf16, T = 0 and 1, small and large budgets, cross-block
pieces), its file's round trip and refusals, and the shipped drafter on the embedded target."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import replace

import pytest
import torch
from conftest import tiny_target
from test_token_drift import block

from spot import DecodeConfig, Sampling, generate
from spot.drafters.base import DraftContext
from spot.drafters.order_examples import RecordedBlock
from spot.drafters.order_model import OrderModel
from spot.drafters.reach import ReachCalibration, ReachMap
from spot.drafters.refresh import OFFSETS, RefreshConfig, RefreshedTokens, RefreshHead, neighbours
from spot.drafters.refresh_training import (
    RefreshTrainConfig,
    block_examples,
    concat,
    drawn,
    fit_refreshed_order,
    train_refresh,
)
from spot.drafters.set_model import Projection
from spot.drafters.sets import StaleSets
from spot.drafters.spot import SpotDrafter
from spot.drafters.stale import StaleOrder
from spot.policy import topk_logprobs
from spot_eval.checkpoints.drafter import checkpoint_payload
from spot_eval.checkpoints.refresh_head import (
    RefreshedRule,
    load_refresh,
    save_orders,
    save_refresh,
    save_sets,
)
from spot_eval.checkpoints.shipped import shipped_drafter
from spot_eval.cli import main
from spot_eval.training.calibrate_reach import calibrate_reach_command

M = 9  # test_token_drift's mask id
SMALL = RefreshConfig(topk=32, hidden_dims=8, embedding_dims=8)
REACH = ReachCalibration((1, 2), (ReachMap((-1.0, 0.0), (0.4, 0.9)), ReachMap((-3.0, 0.0), (0.05, 0.5))), (0.8, 0.5, 0.3))


def test_a_position_reads_the_tokens_committed_beside_it_since_the_stale_forward():
    stale = torch.tensor([5, M, M, M, M, M, M, M])
    node = torch.tensor([5, 6, M, M, 7, M, M, 4])  # since the stale forward: 6 at 1, 7 at 4, 4 at 7
    tokens, new = neighbours(node[None], stale)  # [1, K, 6]
    at = {offset: i for i, offset in enumerate(OFFSETS)}
    assert tokens[0, 2, at[-1]] == 6 and tokens[0, 2, at[2]] == 7 and new[0, 2].sum() == 2  # position 2: 1 and 4
    assert new[0, 0, at[-1]] == 0  # nothing left of the block's start
    assert new[0, 1, at[-1]] == 0 and tokens[0, 1, at[-1]] == 0  # 5 was there before the stale forward
    assert new[0, 5].tolist() == [0, 0, 1, 0, 1, 0]  # position 5: 7 one left, 4 two right
    assert tokens[0, 5, at[-1]] == 7 and tokens[0, 5, at[2]] == 4
    assert new[0, 7, at[1]] == 0 and new[0, 7, at[-3]] == 1  # nothing right of the block's end


def with_hidden(b: RecordedBlock) -> RecordedBlock:
    return dataclasses.replace(b, hidden=torch.arange(4 * 4 * 3, dtype=torch.float32).reshape(4, 4, 3))  # [S, K, R]


def test_every_masked_position_of_a_step_is_an_example_with_the_fresh_distribution_there():
    """test_token_drift's block: 0 <- 5, then 1 <- 6, then 3 <- 7, then 2 <- 8; top-2 recorded per step."""
    rows = block_examples(with_hidden(block()), max_staleness=2)
    # step 1: masked 1, 2, 3 at Δ = 1; step 2: masked 2, 3 at Δ = 1, 2; step 3: masked 2 at Δ = 1, 2
    assert rows.inputs.staleness.tolist() == [1, 1, 1, 1, 1, 2, 2, 1, 2]
    assert rows.token.tolist() == [6, -1, -1, -1, 7, -1, 7, 8, 8]
    assert rows.position.tolist() == [1, 2, 3, 2, 3, 2, 3, 2, 2] and rows.step.tolist() == [1, 1, 1, 2, 2, 2, 2, 3, 3]
    # step 2, Δ = 1, position 3 (row 4): step 1's candidates there are (2, 7); behind step 2 the target ranks 7 first
    assert rows.inputs.ids[4].tolist() == [2, 7]
    assert rows.fresh[4, 1] == pytest.approx(math.log(0.6)) and rows.fresh[4, 0] == pytest.approx(math.log(0.3) - 1.0)
    assert rows.mass[4] == pytest.approx(math.log(0.6))  # only 7 of the candidates is in step 2's recorded top-2
    assert rows.inputs.hidden[4].tolist() == with_hidden(block()).hidden[1, 3].tolist()
    at = {offset: i for i, offset in enumerate(OFFSETS)}
    assert rows.inputs.near_new[4, at[-2]] == 1 and rows.inputs.near_tokens[4, at[-2]] == 6  # position 1's 6
    committed = rows.token >= 0
    assert (drawn(rows.inputs.lp, rows) == rows.token)[committed].tolist() == [True, False, True, False, True]


def test_the_refreshed_order_is_fitted_on_each_node_s_committed_position():
    """Five nodes of test_token_drift's block (step, Δ): (1, 1), (2, 1), (2, 2), (3, 1), (3, 2); steps 1 and 2 commit
    positions 1 and 3. Confidences that put each node's commit first fit a sharp order; ones that put it last, as
    flat a one as the grid allows. The last step's nodes have one masked position: always right."""
    rows = block_examples(with_hidden(block()), max_staleness=2)
    committed = rows.token >= 0

    def confidences(committing: float, other: float) -> torch.Tensor:  # [N, 2] top-2 log-probabilities
        top = torch.where(committed, committing, other)
        return torch.stack([top, 1 - top], -1).log()

    right = fit_refreshed_order(confidences(0.9, 0.6), rows)
    assert right.steps == 5 and right.top1 == 1.0 and right.temperature < 0.03
    wrong = fit_refreshed_order(confidences(0.6, 0.9), rows)
    assert wrong.top1 == pytest.approx(2 / 5) and wrong.temperature > right.temperature


def test_training_learns_the_fresh_tokens_from_recorded_decodes():
    target = tiny_target(16)
    embeddings = target.embeddings().detach().float()
    hidden = Projection.fit(torch.randn(64, embeddings.shape[1], generator=torch.Generator().manual_seed(0)), SMALL.hidden_dims)
    coords = Projection.fit(embeddings, SMALL.embedding_dims)(embeddings)
    config = DecodeConfig(block_length=16, gen_length=32, seed=1)
    parts = []
    for request, prompt in enumerate((list(range(1, 12)), list(range(20, 40)), list(range(5, 9)), list(range(30, 33)))):
        got = generate(target, prompt, config, request=request, record=True, record_topk=SMALL.topk, record_hidden=True)
        parts += [block_examples(RecordedBlock(t.states, t.topk_logprobs, t.topk_ids, target.mask_id, 1, request, t.block, 0.0,
                                               hidden(t.hidden)), SMALL.max_staleness) for t in got.trajectory]
    losses = []
    head, report = train_refresh(concat([p for p in parts if p is not None]), coords,
                                 RefreshTrainConfig(steps=60, batch_size=64, head=SMALL), lambda step, loss: losses.append(loss))
    assert sum(losses[-10:]) < sum(losses[:10])
    assert report["heldout"] > 0 and set(report["top1"]) and all(0 <= v["refreshed"] <= 1 for v in report["top1"].values())
    assert report["order"]["temperature"] > 0 and 0 <= report["order"]["top1"] <= 1 and report["order"]["steps"] > 0
    assert not head.training


def refreshed(target, seed: int, wild: bool = False, mode: str = "model") -> SpotDrafter:
    """SPOT-R with random weights (wild: the head's reading of the neighbours large enough to overturn the stale
    ranking, so its trees differ from SPOT's); mode "stale": SPOT-RC, the refreshed confidences order the nodes."""
    torch.manual_seed(seed)
    embeddings = target.embeddings().detach().float()
    head = RefreshHead(SMALL, Projection.fit(embeddings, SMALL.embedding_dims)(embeddings))
    if wild:
        torch.nn.init.normal_(head.neighbour, std=3.0)
        torch.nn.init.normal_(head.query.weight, std=3.0)
    hidden = Projection.fit(torch.randn(64, embeddings.shape[1]), SMALL.hidden_dims)
    return SpotDrafter(OrderModel(), gate=0.9, name=f"spot_r{seed}{mode}", tokens=RefreshedTokens(head.eval(), hidden),
                       model_depth=None if wild else 1, stale=StaleOrder(0.05), mode=mode)  # every node's order, or the root's


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_refreshed_trees_are_lossless(temperature, dtype):
    target = tiny_target(16, dtype=dtype)
    prompt = list(range(1, 12))
    config = DecodeConfig(block_length=16, gen_length=32, sampling=Sampling(temperature), seed=2)
    reference = generate(target, prompt, config)
    rc = refreshed(target, 3, wild=True, mode="stale")
    rc.model.register_forward_hook(lambda *args: pytest.fail("SPOT-RC called the order model"))
    for drafter, shapes in ((refreshed(target, 0), ((8, True),)), (refreshed(target, 1, wild=True), ((1, False), (8, True), (20, False))),
                            (rc, ((2, False), (8, True)))):
        for budget, cross_block in shapes:
            got = generate(target, prompt, replace(config, budget=budget, cross_block=cross_block), drafter=drafter)
            assert got.token_ids == reference.token_ids, (drafter.name, budget, cross_block)
            assert got.stats.forwards <= reference.stats.forwards


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_spot_rc_drafts_from_the_masked_rows_the_tree_the_whole_top_k_gives(temperature):
    """SPOT-RC reads the stale top-k at the root's masked rows only (spot.drafters.spot.SpotDrafter._masked_topk): its
    tree is the one grown from the whole top-k, node for node."""
    target = tiny_target(16)
    k, g = target.block_length, torch.Generator().manual_seed(1)
    rc = refreshed(target, 3, wild=True, mode="stale")
    hidden = torch.randn(k, target.embeddings().shape[1], generator=g)
    for committed in (0, 5, 11):
        state = torch.full((k,), target.mask_id)
        where = torch.randperm(k, generator=g)[:committed]
        state[where] = torch.randint(4, target.vocab_size, (committed,), generator=g)
        stale_state = state.clone()
        if committed:
            stale_state[where[0]] = target.mask_id  # the last step committed one of them
        config = DecodeConfig(block_length=k, budget=6, sampling=Sampling(temperature), seed=3)
        ctx = DraftContext(state, torch.randn(k, target.vocab_size, generator=g), stale_state, None, config, target.mask_id,
                           0, 0, 2, 6, lambda _: None, stale_hidden=hidden)
        whole = rc.grow(ctx, *topk_logprobs(ctx.stale_logits, rc.model.config.topk, target.mask_id), None)
        drafted = rc.draft(ctx)
        assert torch.equal(drafted.states, whole.states) and drafted.parents == whole.parents and drafted.size == 6
        assert drafted.scores == whole.scores, committed


def test_a_context_without_hidden_states_is_refused_before_the_tree_grows():
    target = tiny_target(16)
    k = target.block_length
    logits = torch.randn(k, target.vocab_size, generator=torch.Generator().manual_seed(0))
    state = torch.full((k,), target.mask_id)
    ctx = DraftContext(state, logits, state.clone(), None, DecodeConfig(block_length=k, budget=4), target.mask_id, 0, 0, 1, 4,
                       lambda _: None)
    with pytest.raises(ValueError, match="DraftContext.stale_hidden.*draft it from the engine"):
        refreshed(target, 0).draft(ctx)


def test_a_spot_r_file_round_trips_and_refuses_damage(tmp_path):
    target = tiny_target(16)
    drafter = refreshed(target, 2)
    path, fingerprint = tmp_path / "spot_r.pt", {"tokenizer_sha256": "a", "weights_digest": "b", "block_length": 16,
                                                 "policy": "single"}
    order = checkpoint_payload(shipped_drafter("spot", 32))
    save_refresh(path, drafter.tokens.head, drafter.tokens.hidden, drafter.tokens.hidden, fingerprint, {"steps": 1}, order,
                 StaleOrder(0.04))
    loaded = load_refresh(path)
    assert loaded.fingerprint == fingerprint and loaded.order.config.topk == 32 and loaded.stale == StaleOrder(0.04)
    assert loaded.reach is None  # written without one: it decodes at fixed budgets only
    assert all(torch.equal(loaded.state_dict[k], v) for k, v in drafter.tokens.head.state_dict().items())
    # a calibration rewrites the orders and keeps the head and the order model as they were
    save_orders(path, tmp_path / "calibrated.pt", StaleOrder(0.03, REACH), REACH, {"steps": 1, "reach_fit": {}},
                loaded.sha256)
    calibrated = load_refresh(tmp_path / "calibrated.pt")
    assert calibrated.reach == REACH and calibrated.stale == StaleOrder(0.03, REACH) and "reach_fit" in calibrated.metrics
    assert all(torch.equal(calibrated.state_dict[k], v) for k, v in loaded.state_dict.items())
    assert all(torch.equal(a, b) for a, b in zip(calibrated.order.model.state_dict().values(), loaded.order.model.state_dict().values(), strict=True))
    raw = torch.load(path, weights_only=True)
    raw["state_dict"]["scale"] = raw["state_dict"]["scale"] + 1
    torch.save(raw, tmp_path / "edited.pt")
    with pytest.raises(ValueError, match="do not match their recorded sha256"):
        load_refresh(tmp_path / "edited.pt")
    raw = torch.load(path, weights_only=True)
    raw["stale"]["temperature"] = -1.0
    torch.save(raw, tmp_path / "edited.pt")
    with pytest.raises(ValueError, match="corrupt .*the refreshed order, the reach calibration or SPOT-RS's rule: ValueError"):
        load_refresh(tmp_path / "edited.pt")
    # SPOT-RS's rule is written beside the rest, which stays as it was; a damaged one is refused as the orders are
    rule = RefreshedRule(0.9, StaleSets(((1.0, 0.0, 0.5), (0.5, -1.0, 0.0))), {**fingerprint, "policy": "threshold"}, {"blocks": 3})
    save_sets(path, tmp_path / "sets.pt", rule, loaded.sha256)
    with_sets = load_refresh(tmp_path / "sets.pt")
    assert with_sets.sets == rule and with_sets.sha256 == loaded.sha256 and with_sets.stale == loaded.stale
    raw = torch.load(tmp_path / "sets.pt", weights_only=True)
    raw["sets"]["coefficients"] = [[1.0, 0.0]]
    torch.save(raw, tmp_path / "edited.pt")
    with pytest.raises(ValueError, match="corrupt .*SPOT-RS's rule: ValueError: StaleSets needs one"):
        load_refresh(tmp_path / "edited.pt")
    raw = torch.load(path, weights_only=True)
    raw["stale"]["temperature"] = -1.0
    other = refreshed(target, 3).tokens
    save_refresh(tmp_path / "other.pt", other.head, other.hidden, other.hidden, fingerprint, {}, order, StaleOrder(0.04))
    with pytest.raises(ValueError, match="changed while it was calibrated"):  # another head's file is not given these
        save_orders(tmp_path / "other.pt", tmp_path / "again.pt", StaleOrder(0.03, REACH), REACH, {}, loaded.sha256)
    with pytest.raises(ValueError, match="changed while SPOT-RS's rule was fitted"):
        save_sets(tmp_path / "other.pt", tmp_path / "again.pt", rule, loaded.sha256)
    raw["format"] = "spot-refresh-head/1"
    torch.save(raw, tmp_path / "edited.pt")
    with pytest.raises(ValueError, match="predates the refreshed order's temperature.*spot-eval train-refresh"):
        load_refresh(tmp_path / "edited.pt")
    with pytest.raises(ValueError, match="predates the refreshed order's temperature"):  # not "retrain train-drafter"
        calibrate_reach_command(tmp_path / "edited.pt", [tmp_path], 8, None, 10)
    with pytest.raises(ValueError, match="a SPOT-R file.*drop --all-blocks"):
        calibrate_reach_command(path, [tmp_path], 8, None, 10, all_blocks=True)
    with pytest.raises(ValueError, match="--order-temperature is SPOT-RC's.*drop --order-temperature"):
        calibrate_reach_command(shipped_drafter("spot", 32), [tmp_path], 8, None, 10, order_temperature=0.1)
    with pytest.raises(ValueError, match="--max-blocks must be >= 1"):
        calibrate_reach_command(path, [tmp_path], 8, None, 0)
    with pytest.raises(ValueError, match="'stale' given the stale order's temperature; got 'stale' without one"):
        SpotDrafter(OrderModel(), tokens=drafter.tokens, mode="stale")
    with pytest.raises(ValueError, match="not a SPOT-R drafter .*format 'spot-order-model/3'"):
        load_refresh(shipped_drafter("spot", 32))
    with pytest.raises(FileNotFoundError, match="spot-eval train-refresh"):
        load_refresh(tmp_path / "missing.pt")


@pytest.mark.slow
def test_the_shipped_drafter_decodes_the_embedded_target_losslessly_and_refuses_another_policy(capsys):
    def decode(*extra: str) -> dict:
        main(["decode", "--prompt", "Natalia sold clips to 48 of her friends.", "--chat", "--gen-length", "64", "--json",
              "--threads", "1", *extra])
        return json.loads(capsys.readouterr().out)

    for temperature in ("0", "1"):
        free = decode("--method", "draft_free", "--temperature", temperature)
        for method in ("spot_r", "spot_rc"):
            got = decode("--method", method, "--budget", "8", "--temperature", temperature)
            assert got["token_ids"] == free["token_ids"] and got["forwards"] < free["forwards"], method
    with pytest.raises(SystemExit):
        decode("--method", "spot_r", "--budget", "8", "--unmasking", "threshold", "--drafter", str(shipped_drafter("spot_r", 32)))
    assert "was trained for target" in capsys.readouterr().err
