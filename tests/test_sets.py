"""SPOT-Sets' tree (spot.drafters.sets): k-best set enumeration against brute force, the product rule on
literal inputs, the stale set predictor's fit, and its trees lossless under the threshold policy."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace

import pytest
import torch
from conftest import VOCAB, existing_store, tiny_target, write_checkpoint
from hypothesis import given, settings
from hypothesis import strategies as st
from test_lm import make_lm, request

from spot import DecodeConfig, Sampling, generate
from spot.drafters import AdversarialDrafter, OracleDrafter
from spot.drafters.base import DraftContext
from spot.drafters.order_examples import RecordedBlock
from spot.drafters.sets import SetsDrafter, StaleSets, best_sets, evaluate_sets, fit_stale_sets
from spot.tree import SetEdge
from spot_eval.cli import main

MASK = 9


def brute_force(probs: list[float]) -> list[tuple[float, tuple[int, ...]]]:
    c = [min(max(p, 1e-6), 1 - 1e-6) for p in probs]
    subsets = (s for r in range(1, len(c) + 1) for s in itertools.combinations(range(len(c)), r))
    return sorted(((sum(math.log(c[i]) if i in s else math.log1p(-c[i]) for i in range(len(c))), s) for s in subsets),
                  reverse=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.5, 1.0]) | st.floats(0.0, 1.0), min_size=1, max_size=7), st.integers(1, 130))
def test_best_sets_are_the_most_probable_non_empty_subsets_in_order(probs, n):
    got = best_sets(probs, n)
    truth = brute_force(probs)
    assert len(got) == min(n, len(truth)) and len({s for s, _ in got}) == len(got)
    assert [lp for _, lp in got] == pytest.approx([lp for lp, _ in truth[: len(got)]], abs=1e-9)
    for subset, lp in got:  # each score is its own subset's product
        assert lp == pytest.approx(next(t for t, s in truth if s == subset), abs=1e-9)


def test_the_product_rule_on_literal_probabilities():
    # {0} alone: 0.9 * 0.4 * 0.8 = 0.288; {0, 1}: 0.9 * 0.6 * 0.8 = 0.432; {0, 1, 2}: 0.108; {0, 2}: 0.072
    got = best_sets([0.9, 0.6, 0.2], 4)
    assert [s for s, _ in got] == [(0, 1), (0,), (0, 1, 2), (0, 2)]
    assert [math.exp(lp) for _, lp in got] == pytest.approx([0.432, 0.288, 0.108, 0.072])
    assert best_sets([0.1, 0.1], 1) == [((0,), pytest.approx(math.log(0.1 * 0.9)))]  # the empty set is never a step


def test_a_set_edge_commits_its_positions_with_their_tokens():
    state = torch.tensor([MASK, 4, MASK, MASK])
    assert SetEdge((0, 3), (7, 8), -1.0).apply(state).tolist() == [7, 4, MASK, 8] and state[0] == MASK


def test_the_stale_predictor_on_literal_confidences():
    predictor = StaleSets(((2.0, -1.0, 3.0), (1.0, 0.0, 0.0)))
    confidence = torch.tensor([0.95, 0.5, 0.99, 0.9])
    masked = torch.tensor([True, True, False, True])
    z = 2.0 * (torch.tensor([0.95, 0.5, 0.9]).double().log() - math.log(0.9)) - 1.0 + torch.tensor([3.0, 0.0, 0.0]).double()
    assert predictor.probs(confidence, masked, 0, 0.9).tolist() == pytest.approx([*torch.sigmoid(z)[:2].tolist(), 0.0,
                                                                                   float(torch.sigmoid(z[2]))])
    assert predictor.probs(confidence, masked, 7, 0.9)[3] == pytest.approx(0.5)  # the last depth's coefficients serve deeper ones
    assert StaleSets.from_dict(predictor.to_dict()) == predictor
    with pytest.raises(ValueError, match="one .a, b, e. triple per depth"):
        StaleSets(())


def test_the_tree_holds_the_best_sets_of_the_stale_tokens():
    k, vocab = 4, 12
    logits = torch.zeros(k, vocab)
    for p, (token, confidence) in enumerate([(3, 0.85), (4, 0.4), (5, 0.99)]):
        logits[p, token] = math.log(10 * confidence / (1 - confidence))  # 10 other tokens at 0 (the mask aside)
    state = torch.tensor([MASK, MASK, MASK, 2])
    config = DecodeConfig(policy="threshold", threshold=0.9, block_length=k)
    ctx = DraftContext(state, logits, state, None, config, MASK, 0, 0, 1, 3, lambda step: None)
    tree = SetsDrafter(StaleSets(((5.0, 0.0, 0.0),))).draft(ctx)
    # pi = sigmoid(5 log(c / 0.9)): 0.43, 0.02, 0.62. Sets by the product rule: {2} (0.25), {0, 2} (0.26 x 0.43 / 0.57),
    # {0} (its 0.43 x 0.38): all three beat any child of {2}, which multiplies 0.25 by at most 0.43
    assert tree.size == 3 and tree.parents[1:] == ((0,), (0,), (0,))
    assert [s.tolist() for s in tree.states[1:]] == [[MASK, MASK, 5, 2], [3, MASK, 5, 2], [3, MASK, MASK, 2]]
    assert all(bool(((s == state) | (state == MASK)).all()) for s in tree.states)  # only masked positions change


def test_model_depth_one_reuses_the_roots_probabilities_below_the_root():
    k, vocab = 4, 12
    logits = torch.zeros(k, vocab)
    for p, (token, confidence) in enumerate([(3, 0.85), (4, 0.4), (5, 0.99)]):
        logits[p, token] = math.log(10 * confidence / (1 - confidence))
    state = torch.tensor([MASK, MASK, MASK, 2])
    ctx = DraftContext(state, logits, state, None, DecodeConfig(policy="threshold", threshold=0.9, block_length=k), MASK,
                       0, 0, 1, 8, lambda step: None)
    root_only, per_depth = StaleSets(((5.0, 0.0, 0.0),)), StaleSets(((5.0, 0.0, 0.0), (-3.0, 2.0, -4.0)))

    def tree(predictor, model_depth):
        return [s.tolist() for s in SetsDrafter(predictor, model_depth=model_depth).draft(ctx).states]

    # with e = 0 the root's pi over a node's masked positions is what re-scoring with the root's coefficients
    # gives, so reusing them (model_depth 1) ignores the deeper coefficients; re-scoring every level reads them
    assert tree(per_depth, 1) == tree(root_only, None) != tree(per_depth, None)
    assert tree(root_only, 1) == tree(root_only, None) and len(tree(root_only, 1)) == 8  # the root and all 7 sets
    with pytest.raises(ValueError, match="model_depth must be >= 1"):
        SetsDrafter(root_only, model_depth=0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_set_trees_are_lossless_under_the_threshold_policy(temperature):
    target = tiny_target(16)
    prompt = list(range(1, 12))
    config = DecodeConfig(policy="threshold", threshold=0.5, block_length=16, gen_length=48,
                          sampling=Sampling(temperature), seed=2)
    reference = generate(target, prompt, config, record=True, record_topk=2)
    blocks = [RecordedBlock(t.states, t.topk_logprobs, t.topk_ids, target.mask_id, 2, 0, t.block, temperature)
              for t in reference.trajectory]
    fitted = fit_stale_sets(blocks, config.threshold, depths=2)
    drafters = [SetsDrafter(fitted), SetsDrafter(fitted, name="root-scored", model_depth=1),
                SetsDrafter(StaleSets(((-3.0, 2.0, -4.0),)), name="contrary"),
                OracleDrafter(reference.trajectory), AdversarialDrafter(reference.trajectory, VOCAB)]
    for drafter in drafters:
        for budget in (1, 8, 20):
            for cross_block in (False, True):
                got = generate(target, prompt, replace(config, budget=budget, cross_block=cross_block), drafter=drafter)
                assert got.token_ids == reference.token_ids, (drafter.name, budget, cross_block)


def test_the_fit_raises_the_likelihood_and_reports_the_baseline():
    target = tiny_target(16)
    config = DecodeConfig(policy="threshold", threshold=0.9, block_length=16, gen_length=64, seed=1)
    blocks = []
    for index, prompt in enumerate((list(range(1, 12)), list(range(20, 40)), list(range(5, 9)))):
        reference = generate(target, prompt, config, request=index, record=True, record_topk=2)
        blocks += [RecordedBlock(t.states, t.topk_logprobs, t.topk_ids, target.mask_id, 1, index, t.block, 0.0)
                   for t in reference.trajectory]
    fit = fit_stale_sets(blocks, config.threshold, depths=3)
    assert len(fit.coefficients) == 3
    report = evaluate_sets(fit, blocks, config.threshold, depths=3)
    start = evaluate_sets(StaleSets(((1.0, 0.0, 0.0),)), blocks, config.threshold, depths=3)  # the fit's starting point
    assert all(n > 0 for n in report.examples) and report.examples == start.examples
    assert all(a >= b - 1e-9 for a, b in zip(report.log_likelihood, start.log_likelihood, strict=True))
    assert all(0.0 <= x <= 1.0 for x in report.exact_set + report.f1 + report.baseline_exact_set + report.baseline_f1)
    with pytest.raises(ValueError, match="no steps"):
        fit_stale_sets([], 0.9)


def test_the_exact_set_and_f1_metrics_on_a_literal_block():
    """Steps {3}, {1, 2}, {0}; the stale confidences (the same at every step) are 0.95, 0.2, 0.95 at positions
    0, 1, 2 (tau 0.9). The baseline guesses {0, 2} at step 1 (one hit of {1, 2}) and {0} at step 2 (exact):
    exact-set rate 1 / 2, F1 over the positions 2 x 2 hits / (3 guessed + 3 committed)."""
    states = torch.tensor([[MASK, MASK, MASK, MASK], [MASK, MASK, MASK, 8], [MASK, 5, 6, 8], [7, 5, 6, 8]])
    probs = torch.tensor([[[0.95, 0.01], [0.2, 0.1], [0.95, 0.01], [0.5, 0.1]]] * 3)
    ids = torch.tensor([[[7, 1], [5, 1], [6, 1], [8, 1]]] * 3)
    block = RecordedBlock(states, probs.log(), ids, MASK, seed=0, request=0, block=0, temperature=0.0)
    report = evaluate_sets(StaleSets(((1.0, 0.0, 0.0),)), [block], 0.9, depths=1)
    assert report.examples == (2,)
    assert report.baseline_exact_set == (0.5,) and report.baseline_f1 == (pytest.approx((2 * 2) / (3 + 3)),)


@pytest.mark.slow
def test_fit_sets_and_the_sets_method_through_the_cli(tmp_path, capsys):
    path = str(write_checkpoint(tmp_path / "ckpt"))
    traj, single, sets = tmp_path / "traj", tmp_path / "single", str(tmp_path / "sets.json")
    common = ["--target", path, "--prompts", "4", "--gen-length", "48", "--no-chat", "--shard-size", "2", "--temperatures", "0,1"]
    main(["collect", *common, "--out", str(traj), "--policy", "threshold", "--threshold", "0.5"])
    main(["collect", *common, "--out", str(single), "--prompts", "1"])
    capsys.readouterr()
    main(["fit-sets", "--trajectories", str(traj), "--out", sets, "--depths", "2"])
    report = json.loads(capsys.readouterr().out)
    assert report["threshold"] == 0.5 and report["heldout"]["examples"][0] > 0 and len(report["coefficients"]) == 2
    decoded = {}
    for method, extra in (("draft_free", []), ("sets", ["--drafter", sets, "--budget", "8"])):
        main(["decode", "--pretrained", path, "--method", method, *extra, "--unmasking", "threshold", "--threshold", "0.5",
              "--prompt", "t1 t2 t3", "--gen-length", "48", "--json"])
        decoded[method] = json.loads(capsys.readouterr().out)
    assert decoded["sets"]["token_ids"] == decoded["draft_free"]["token_ids"]
    assert decoded["sets"]["forwards"] <= decoded["draft_free"]["forwards"]
    # lm_eval's model: methods=sets@8 under unmasking=threshold, every request checked against draft-free
    lm = make_lm(path, methods=f"sets@8:{sets}", budgets="", unmasking="threshold", threshold=0.5,
                 output_dir=str(tmp_path / "run"), mlflow_tracking_uri=existing_store(tmp_path))
    assert len(lm.generate_until([request("t1 t2 t3", 0), request("t4 t5", 1)])) == 2
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").open()]
    assert {s["label"] for s in samples} == {"draft_free", "sets@8"} and all(s["lossless"] for s in samples)
    for argv, message in (
        (["decode", "--pretrained", path, "--method", "sets", "--drafter", sets, "--budget", "8", "--unmasking", "threshold",
          "--threshold", "0.6", "--prompt", "t1"], "was fitted at threshold 0.5, but decoding uses 0.6"),
        (["fit-sets", "--trajectories", str(single), "--out", sets], "recorded with policy 'single', whose steps commit one position"),
    ):
        with pytest.raises(SystemExit):
            main(argv)
        assert message in capsys.readouterr().err
