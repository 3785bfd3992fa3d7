"""SPOT-Sets' learned set model (spot.drafters.set_model): its projections, its size, its examples on a literal
block, its trees lossless under the threshold policy (any weights, fp32 and bf16), and collect -> train-sets ->
decode, with calibration for another target (--init-from), through the CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import VOCAB, existing_store, run_lm_eval_here, tiny_qwen3, tiny_target, write_checkpoint
from test_lm import REPO
from test_refreshed_sets import wild

from spot import DecodeConfig, Sampling, generate
from spot.drafters.order_examples import RecordedBlock
from spot.drafters.order_model import parameter_count
from spot.drafters.refreshed_sets import RefreshedSets
from spot.drafters.set_model import LearnedSets, Projection, SetModel, SetModelConfig
from spot.drafters.set_training import SetTrainConfig, losses, make_set_examples, train_set_model
from spot.drafters.sets import SetsDrafter, StaleSets
from spot_eval.cli import main

MASK = 9
SMALL = SetModelConfig(topk=4, d_model=32, heads=4, layers=1, ff=64, buckets=16, max_block=16, embedding_dims=3, hidden_dims=4)


def test_a_projection_whitens_its_rows_and_is_the_same_when_fitted_again():
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(400, 6, generator=generator) @ torch.randn(6, 6, generator=generator) + 3.0
    projection = Projection.fit(rows, 3)
    coords = projection(rows).double()
    assert coords.mean(0).abs().max() < 1e-4
    assert torch.allclose(coords.T @ coords / (len(rows) - 1), torch.eye(3, dtype=torch.float64), atol=1e-4)
    again = Projection.fit(rows.clone(), 3)
    assert torch.equal(again.basis, projection.basis) and torch.equal(again.mean, projection.mean)
    assert Projection.from_dict(projection.to_dict()) == projection
    with pytest.raises(ValueError, match="needs 1 <= dims <= 6"):
        Projection.fit(rows, 7)
    with pytest.raises(ValueError, match=">= 2 rows"):
        Projection.fit(rows[:1], 1)


def test_the_set_model_has_the_published_size_and_starts_from_the_stale_tokens():
    model = SetModel()
    assert (model.config.layers, model.config.d_model) == (6, 256)
    assert 5.0e6 <= parameter_count(model) <= 5.2e6  # the published set drafter: 5.1M parameters
    small = SetModel(SMALL)
    k = 5
    feats = torch.randn(2, k, SMALL.inputs)
    lp = torch.randn(2, k, SMALL.topk)
    from spot.drafters.set_model import SetInputs

    inclusion, scores = small(SetInputs(feats, torch.zeros(2, k, dtype=torch.long)), lp)
    assert inclusion.shape == (2, k) and torch.equal(scores, lp)  # the token correction starts at zero


def test_a_set_example_on_a_literal_block():
    """Steps commit {3} then {1, 2}; the example (s = 1, d = 0) is the node before step 1, read under the stale
    distribution behind step 0. Its labels are the set {1, 2} and, per slot of the stale top-2, the fresh
    distribution: stale ids (5, 1) at position 1 against fresh ids (1, 6) with log-probabilities (-0.1, -3):
    id 5 left the fresh top-2 and counts at -3, id 1 at -0.1."""
    states = torch.tensor([[MASK, MASK, MASK, MASK], [MASK, MASK, MASK, 8], [MASK, 5, 6, 8]])
    stale_ids = torch.tensor([[7, 1], [5, 1], [6, 1], [8, 1]])
    fresh_ids = torch.tensor([[7, 1], [1, 6], [6, 1], [8, 1]])
    lp = torch.tensor([[-0.1, -3.0]] * 4)
    block = RecordedBlock(states, torch.stack([lp, lp]), torch.stack([stale_ids, fresh_ids]), MASK, seed=0, request=0,
                          block=0, temperature=0.0, hidden=torch.zeros(2, 4, SMALL.hidden_dims))
    config = replace(SMALL, topk=2)
    batch = make_set_examples(block, [(1, 0)], config, torch.zeros(VOCAB, SMALL.embedding_dims))
    assert batch.masked.tolist() == [[True, True, True, False]] and batch.chosen.tolist() == [[False, True, True, False]]
    assert batch.committed.tolist() == [[-1, 5, 6, -1]]
    assert batch.fresh[0, 1].tolist() == pytest.approx(torch.softmax(torch.tensor([-3.0, -0.1]), -1).tolist())
    assert batch.stale_tokens.tolist() == [[7, 5, 6, 8]] and batch.inputs.feats.shape == (1, 4, config.inputs)


def test_the_position_loss_is_the_order_models_cross_entropy_on_single_commits():
    """Steps commit {3}, {2}, then {0, 1}. Node (s = 1, d = 0) is followed by the single commit of position 2,
    node (1, 1) by the set {0, 1}: the position term is the softmax cross-entropy over the first node's masked
    positions' inclusion logits, and the second adds none."""
    states = torch.tensor([[MASK, MASK, MASK, MASK], [MASK, MASK, MASK, 8], [MASK, MASK, 6, 8], [4, 5, 6, 8]])
    ids = torch.tensor([[4, 1], [5, 1], [6, 1], [8, 1]])
    lp = torch.tensor([[-0.1, -3.0]] * 4)
    block = RecordedBlock(states, torch.stack([lp] * 3), torch.stack([ids] * 3), MASK, seed=0, request=0, block=0,
                          temperature=0.0, hidden=torch.zeros(3, 4, SMALL.hidden_dims))
    config = replace(SMALL, topk=2)
    batch = make_set_examples(block, [(1, 0), (1, 1)], config, torch.zeros(VOCAB, SMALL.embedding_dims))
    assert batch.chosen.tolist() == [[False, False, True, False], [True, True, False, False]]
    torch.manual_seed(0)
    model = SetModel(config)
    with torch.no_grad():
        plain, token, inclusion, _ = losses(model, batch, "cpu")
        weighted, same_token, _, _ = losses(model, batch, "cpu", position_weight=0.5)
    ce = -torch.log_softmax(inclusion[0, :3], -1)[2]  # the single-commit node: masked positions 0-2, label 2
    assert float(weighted) == pytest.approx(float(plain + 0.5 * ce), rel=1e-6) and torch.equal(token, same_token)
    with pytest.raises(ValueError, match="position_weight must be >= 0"):
        SetTrainConfig(position_weight=-1.0)


def learned(target, seed: int, wild: bool = False) -> SetsDrafter:
    """A set drafter with random weights (wild: token corrections large enough to overturn the stale ranking)."""
    torch.manual_seed(seed)
    model = SetModel(SMALL)
    if wild:
        torch.nn.init.normal_(model.correction.weight, std=5.0)
    embeddings = target.embeddings().detach().float()
    hidden = Projection.fit(torch.randn(64, embeddings.shape[1]), SMALL.hidden_dims)
    return SetsDrafter(LearnedSets(model, hidden, Projection.fit(embeddings, SMALL.embedding_dims)(embeddings)), name=f"learned{seed}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_learned_set_trees_are_lossless_under_the_threshold_policy(temperature, dtype):
    """The learned set model's trees, and SPOT-RS's (a refresh head whose reading of the neighbours overturns the
    stale ranking, and a rule), whatever their weights."""
    target = tiny_target(16, dtype=dtype)
    prompt = list(range(1, 12))
    config = DecodeConfig(policy="threshold", threshold=0.5, block_length=16, gen_length=48, sampling=Sampling(temperature), seed=2)
    reference = generate(target, prompt, config)
    refreshed = SetsDrafter(RefreshedSets(wild(target, 2), StaleSets(((2.0, 0.5, 1.0), (1.0, -0.5, 0.5)))), name="sets_r")
    for drafter in (learned(target, 0), learned(target, 1, wild=True), refreshed):
        for budget, cross_block in ((1, False), (8, True), (20, False), (20, True)):
            got = generate(target, prompt, replace(config, budget=budget, cross_block=cross_block), drafter=drafter)
            assert got.token_ids == reference.token_ids, (drafter.name, budget, cross_block)
            assert got.stats.forwards <= reference.stats.forwards, (drafter.name, budget, cross_block)


def test_training_lowers_the_loss_and_reports_both_guessers():
    target = tiny_target(16)
    hidden = Projection.fit(torch.randn(64, target.embeddings().shape[1]), SMALL.hidden_dims)
    embeddings = target.embeddings().detach().float()
    coords = Projection.fit(embeddings, SMALL.embedding_dims)(embeddings)
    config = DecodeConfig(policy="threshold", threshold=0.5, block_length=16, gen_length=48, seed=1)
    blocks = []
    for request, prompt in enumerate((list(range(1, 12)), list(range(20, 40)), list(range(5, 9)), list(range(30, 33)))):
        got = generate(target, prompt, config, request=request, record=True, record_topk=SMALL.topk, record_hidden=True)
        blocks += [RecordedBlock(t.states, t.topk_logprobs, t.topk_ids, target.mask_id, 1, request, t.block, 0.0, hidden(t.hidden))
                   for t in got.trajectory]
    result = train_set_model(blocks, coords, SetTrainConfig(threshold=0.5, steps=40, batch_size=32, warmup=5, log_every=10,
                                                            heldout_fraction=0.25, model=SMALL))
    assert result.curve[-1][1] < result.curve[0][1]
    depth0 = result.heldout.by_depth[0]
    assert depth0.examples > 0 and 0.0 <= depth0.exact_step <= depth0.exact_set <= 1.0
    assert 0.0 <= depth0.baseline_exact_step <= depth0.baseline_exact_set <= 1.0 and 0.0 <= depth0.token <= 1.0
    with pytest.raises(ValueError, match="collect with --topk 8 --hidden-dims 4"):
        train_set_model(blocks, coords, SetTrainConfig(model=replace(SMALL, topk=8)))


@pytest.mark.slow
def test_collect_train_sets_decode_and_calibrate_for_another_target(tmp_path, capsys):
    first, second = str(write_checkpoint(tmp_path / "first")), str(write_checkpoint(tmp_path / "second", model=tiny_qwen3(seed=1)))
    common = ["--prompts", "4", "--gen-length", "48", "--no-chat", "--shard-size", "2", "--temperatures", "0,1",
              "--policy", "threshold", "--threshold", "0.5", "--hidden-dims", "8", "--embedding-dims", "4"]
    for target in (first, second):
        main(["collect", "--target", target, "--out", f"{target}-traj", *common])
    main(["collect", "--target", first, "--out", f"{first}-other", *common, "--prompts", "2", "--seed", "5"])
    main(["collect", "--target", first, "--out", f"{first}-traj", *common])  # a rerun resumes: nothing left to do
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["shards_skipped"] == 2
    shard = torch.load(f"{first}-traj/shard-00001.pt", weights_only=True)
    assert shard["hidden"].shape[1:] == (16, 8) and shard["hidden"].shape[0] == shard["topk_ids"].shape[0]
    model = str(tmp_path / "sets.pt")
    train = ["train-sets", "--steps", "2", "--batch-size", "16", "--heldout", "0.25"]
    main([*train, "--trajectories", f"{first}-traj", "--out", model])
    report = json.loads(capsys.readouterr().out)
    assert report["parameters"] > 5e6 and report["heldout"]["by_depth"][0]["examples"] > 0

    def decode(target: str, *extra: str) -> dict:
        main(["decode", "--pretrained", target, "--unmasking", "threshold", "--threshold", "0.5", "--prompt", "t1 t2 t3",
              "--gen-length", "48", "--json", *extra])
        return json.loads(capsys.readouterr().out)

    reference = decode(first, "--method", "draft_free")
    assert decode(first, "--method", "sets", "--drafter", model, "--budget", "8")["token_ids"] == reference["token_ids"]
    # lm_eval: the set model at budget 8 under threshold decoding, with cross-block pieces
    existing_store(tmp_path)  # the run's default store, ./mlflow.db
    args = (f"pretrained={first},methods=sets@8:{model},budgets=,unmasking=threshold,threshold=0.5,cross_block=True,"
            "gen_length=32,device=cpu,threads=1")
    run = run_lm_eval_here(capsys, "--model", "spot", "--model_args", args, "--tasks", "spot_gsm8k", "--include_path",
                           str(REPO / "tasks"), "--limit", "1", "--output_path", str(tmp_path / "out"), cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    samples = [json.loads(line) for line in next(tmp_path.glob("spot-eval-runs/*/samples.jsonl")).open()]
    assert {s["label"] for s in samples} == {"draft_free", "sets@8"} and len(samples) == 2 and all(s["lossless"] for s in samples)
    for argv, message in (
        (["decode", "--pretrained", second, "--method", "sets", "--drafter", model, "--budget", "8", "--unmasking", "threshold",
          "--threshold", "0.5", "--prompt", "t1"], "set model " + model + " was trained for target"),
        ([*train, "--trajectories", f"{first}-traj", f"{first}-other", "--out", model], "were projected on different bases"),
    ):
        with pytest.raises(SystemExit):
            main(argv)
        assert message in capsys.readouterr().err
    calibrated = str(tmp_path / "calibrated.pt")
    main([*train, "--trajectories", f"{second}-traj", "--out", calibrated, "--init-from", model, "--prompts", "3"])
    report = json.loads(capsys.readouterr().out)
    assert report["init_from"] == model and report["train_requests"] + report["heldout_requests"] == 3
    reference = decode(second, "--method", "draft_free")
    assert decode(second, "--method", "sets", "--drafter", calibrated, "--budget", "8")["token_ids"] == reference["token_ids"]
    raw = bytearray(Path(calibrated).read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    Path(calibrated).write_bytes(bytes(raw))
    with pytest.raises(SystemExit):
        decode(second, "--method", "sets", "--drafter", calibrated, "--budget", "8")
    assert "is corrupt or not a set model" in capsys.readouterr().err
