"""budget=auto: the cost curve, the tree-size rule with literal curves and reach probabilities, the
reach calibration with literal data, and the engine's use of both (losslessness is in test_engine's grid)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from conftest import VOCAB, tiny_target
from test_engine import FLAT, STEEP, Reaching, prompt_ids

from spot import DecodeConfig, Sampling, generate
from spot.drafters import OracleDrafter, RandomDrafter
from spot.drafters.reach import ReachCalibration, ReachMap, ReplayedTree, fit_reach, isotonic, with_table
from spot.sizing import MIN_SAMPLES, DraftMode, ForwardTiming, Plan, Sizing, VerifyCost, best_size, refit
from spot.tree import DraftTree

CURVE = VerifyCost(pieces=(1, 2, 5), contexts=(32, 288), seconds=((1.0, 1.5, 3.0), (2.0, 2.5, 5.0)))


@pytest.mark.parametrize(
    ("pieces", "context", "seconds"),
    [
        (1, 32, 1.0), (2, 32, 1.5), (5, 288, 5.0),  # measured points
        (3, 32, 2.0), (2, 160, 2.0),  # linear between them
        (9, 32, 5.0), (1, 544, 3.0),  # beyond: the last segment's slope continues
        (1, 0, 1.0), (2, 16, 1.5),  # below the shortest context: the shortest's cost
    ],
)
def test_the_verify_cost_interpolates_the_measured_grid(pieces, context, seconds):
    assert CURVE(pieces, context) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(pieces=(2, 3)), "ascend from 1"),
        (dict(contexts=(288, 32)), "contexts must ascend"),
        (dict(seconds=((1.0, 1.5, 3.0),)), r"\[contexts\]\[pieces\]"),
        (dict(seconds=((1.0, 0.0, 3.0), (2.0, 2.5, 5.0))), "positive"),
    ],
)
def test_a_malformed_cost_curve_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        replace(CURVE, **fields)


def test_a_flat_curve_grows_to_the_cap_and_a_steep_one_stops_at_zero_or_one():
    reach = [0.9, 0.8, 0.6, 0.5, 0.2, 0.1]
    free = lambda n: 0.0  # noqa: E731
    assert best_size(reach, lambda p: 1.0, free) == 6  # every node adds expected steps at no cost
    assert best_size(reach, lambda p: 1.0 + 0.01 * (p - 1), free) == 6
    assert best_size(reach, lambda p: float(p), free) == 0  # c(P) = P: a node never repays its piece
    # c(P) = 1 + 0.8 (P - 1): the first node pays (1.9 / 1.8 > 1), the second does not (2.7 / 2.6 < 1.9 / 1.8).
    assert best_size(reach, lambda p: 1.0 + 0.8 * (p - 1), free) == 1
    assert best_size([], lambda p: 1.0, free) == 0
    # A drafter whose trees cost a whole forward more from the third node on: two nodes, not six.
    assert best_size(reach, lambda p: 1.0, lambda n: 1.0 * (n >= 3)) == 2


def test_the_drafters_time_counts_before_drafting_and_not_after():
    model = DraftMode("model", ((1, 0.5),), (0.6, 0.2))
    sizing = Sizing(VerifyCost((1, 2, 3), (0,), ((1.0, 1.2, 1.4),)), (model,))
    # Before: (1 + 0.6) / (1.2 + 0.5) < 1 and (1 + 0.6 + 0.2) / (1.4 + 0.5) < 1.
    assert sizing.plan(context=0, cap=2) == Plan(None, 0)
    # After drafting its time is spent: the same reach pays for a node (1.6 / 1.2 > 1, and > 1.8 / 1.4).
    assert sizing.size([0.6, 0.2], context=0) == 1
    cheap = replace(sizing, modes=(replace(model, seconds=((1, 0.05), (2, 0.05))),))
    assert cheap.plan(context=0, cap=2) == Plan("model", 1) and cheap.plan(context=0, cap=0) == Plan(None, 0)
    # The drafter's cost between and beyond its measured budgets.
    costs = DraftMode("m", ((1, 0.1), (5, 0.5)), ())
    assert [costs.drafter_seconds(n) for n in (0, 1, 3, 5, 20)] == pytest.approx([0.0, 0.1, 0.3, 0.5, 0.5])
    with pytest.raises(ValueError, match="ascending budgets"):
        DraftMode("m", ((4, 0.1), (2, 0.2)), ())
    with pytest.raises(ValueError, match="at least one calibrated drafting mode"):
        Sizing(sizing.verify, ())


def test_the_plan_picks_the_mode_that_pays_most():
    verify = VerifyCost((1, 2, 3), (0,), ((1.0, 1.2, 1.4),))
    model = DraftMode("model", ((1, 0.2),), (0.6, 0.4))  # 1.6 / 1.4 = 1.143; 2.0 / 1.6 = 1.25
    stale = DraftMode("stale", ((1, 0.01),), (0.45, 0.1))  # 1.45 / 1.21 = 1.198; 1.55 / 1.41 = 1.099
    assert Sizing(verify, (model, stale)).plan(0, cap=2) == Plan("model", 2)
    # With a cap of one node the model's tree no longer repays its cost, the stale one does.
    assert Sizing(verify, (model, stale)).plan(0, cap=1) == Plan("stale", 1)
    assert Sizing(verify, (stale, model)).plan(0, cap=1) == Plan("stale", 1)  # not the order given
    assert Sizing(verify, (replace(stale, mean_reach=(0.1,)),)).plan(0, cap=1) == Plan(None, 0)  # 1.1 / 1.21 < 1


def test_prefix_keeps_the_first_nodes_with_their_scores_and_reach():
    tree = DraftTree(torch.tensor([[9, 9], [1, 9], [1, 2], [3, 9]]), ((), (0,), (1,), (0,)), (0.0, -0.1, -0.5, -2.0),
                     (1.0, 0.9, 0.6, 0.1))
    cut = tree.prefix(2)
    assert cut.size == 2 and cut.parents == ((), (0,), (1,)) and cut.reach == (1.0, 0.9, 0.6) and cut.scores == (0.0, -0.1, -0.5)
    assert tree.prefix(0).size == 0
    with pytest.raises(ValueError, match="one reach value per node"):
        DraftTree(tree.states, tree.parents, reach=(1.0,))


def test_the_calibration_fit_recovers_a_known_map():
    """Nodes drawn with P(reach) = sigmoid(2 * score + 1) whatever their rank: every rank group's map
    finds it, the table (measured on trees the fit did not see) agrees, and the mean reach by rank is
    counted over trees."""
    generator = torch.Generator().manual_seed(0)
    trees = []
    for _ in range(2000):
        scores = sorted((-3 * torch.rand(5, generator=generator)).tolist(), reverse=True)
        reached = tuple(bool(torch.rand(1, generator=generator) < 1 / (1 + math.exp(-(2 * s + 1)))) for s in scores)
        trees.append(ReplayedTree(tuple(scores), reached))
    fit = with_table(fit_reach(trees[::2]), trees[1::2])
    assert fit.ranks == (1, 2, 4) and len(fit.maps) == 3
    for reach_map in fit.maps:  # each within the scores its ranks take (rank 1 the highest of five, ranks 4-5 the lowest)
        assert list(reach_map.reach) == sorted(reach_map.reach)
        low, high = reach_map.scores[2], reach_map.scores[-3]
        for score in (low, (low + high) / 2, high):
            assert reach_map(score) == pytest.approx(1 / (1 + math.exp(-(2 * score + 1))), abs=0.12)
    assert fit.error < 0.05 and sum(b.count for b in fit.bins) == 5000
    assert fit.mean_reach[0] == pytest.approx(sum(t.reached[0] for t in trees[::2]) / 1000)


def test_the_calibration_with_literal_outcomes():
    """A tree's first node (score 0) always reached; its second (score -1) half of the time: each rank
    group gets its own map, and deeper ranks without nodes reuse the last one."""
    trees = [ReplayedTree((0.0, -1.0), (True, True)), ReplayedTree((0.0, -1.0), (True, False))]
    fit = with_table(fit_reach(trees), trees, n_bins=4)
    assert fit.maps[0] == ReachMap((0.0,), (1.0,)) and fit.maps[1] == fit.maps[2] == ReachMap((-1.0,), (0.5,))
    assert fit((-1.0, -1.0, 0.0, -9.0)) == (1.0, 0.5, 0.5, 0.5)  # by rank: the first node's map, then the others'
    assert fit.mean_reach == (1.0, 0.5) and sum(b.count for b in fit.bins) == 4 and fit.error == 0.0
    assert ReachCalibration.from_dict(fit.to_dict()) == fit
    assert ReplayedTree((0.0, -1.0), (True, False)).steps == 2
    two = ReachMap((-1.0, 0.0), (0.5, 1.0))
    assert [two(x) for x in (-2.0, -1.0, -0.5, 0.0, 3.0)] == [0.5, 0.5, 0.75, 1.0, 1.0]
    assert isotonic([1.0, 3.0, 2.0, 4.0], [1, 1, 1, 1]) == [1.0, 2.5, 2.5, 4.0]
    assert isotonic([2.0, 1.0], [3, 1]) == [1.75, 1.75]
    with pytest.raises(ValueError, match="no drafted nodes"):
        fit_reach([ReplayedTree((), ())])
    with pytest.raises(ValueError, match="ascending scores"):
        ReachMap((0.0, -1.0), (0.5, 0.6))
    with pytest.raises(ValueError, match="one map per rank group"):
        ReachCalibration((2,), (two,), ())


def test_auto_grows_to_the_cap_on_a_flat_curve_and_never_drafts_on_a_steep_one():
    target = tiny_target(16, seed=2, eos_ids=frozenset())
    config = DecodeConfig(block_length=16, gen_length=40, sampling=Sampling(1.0), seed=1)
    prompt = prompt_ids(3, 10)
    reference = generate(target, prompt, config, record=True)
    oracle = OracleDrafter(reference.trajectory)
    sure = Sizing(FLAT, (DraftMode("oracle", ((1, 0.0),), (1.0,) * 20),))

    class Certain(Reaching):
        def draft(self, ctx):
            tree = self.drafter.draft(ctx)
            return replace(tree, reach=(1.0,) * (tree.size + 1))

    big = generate(target, prompt, replace(config, budget=6), drafter=Certain(oracle, 0), sizing=sure)
    fixed = generate(target, prompt, replace(config, budget=6), drafter=oracle)
    assert big.token_ids == reference.token_ids and big.stats.accepted_lengths == fixed.stats.accepted_lengths
    never = generate(target, prompt, replace(config, budget=20), drafter=Reaching(oracle, 0), sizing=Sizing(STEEP, (DraftMode("oracle", ((1, 0.5),), (0.5,)),)))
    assert never.token_ids == reference.token_ids
    assert never.stats.draft_nodes == 0 and never.stats.forwards == reference.stats.forwards


def test_auto_needs_a_drafter_that_knows_its_reach():
    target = tiny_target(16, seed=2, eos_ids=frozenset())
    config = DecodeConfig(block_length=16, gen_length=40, budget=4)
    with pytest.raises(ValueError, match="budget=auto needs reach probabilities.*calibrate-reach"):
        generate(target, prompt_ids(3, 10), config, drafter=RandomDrafter(VOCAB, seed=1), sizing=Sizing(FLAT, (DraftMode("random", ((1, 0.0),), (1.0,)),)))


def test_refit_scales_the_costs_to_what_decoding_measured():
    verify = VerifyCost((1, 2, 3), (0,), ((1.0, 1.2, 1.4),))
    stale = DraftMode("stale", ((1, 0.01), (4, 0.02)), (0.45,))
    probed = Sizing(verify, (stale,))
    assert probed.plan(0, cap=1) == Plan("stale", 1)  # 1.45 / 1.21 > 1
    forwards = [ForwardTiming(1, 0, 1.1)] * 10 + [ForwardTiming(2, 0, 1.8, drafted=1, mode="stale", draft_seconds=0.03)] * 10
    fitted = refit(probed, forwards)
    # P = 1 measured 1.1x its prediction, P = 2 1.5x; the knot P = 3 takes the nearest observed P's factor.
    assert fitted.verify.seconds[0] == pytest.approx((1.1, 1.8, 2.1))
    assert [b for b, _ in fitted.modes[0].seconds] == [1, 4]
    assert [s for _, s in fitted.modes[0].seconds] == pytest.approx([0.03, 0.06])  # drafts took 3x the probe's time
    assert fitted.plan(0, cap=1) == Plan(None, 0)  # 1.45 / 1.83 < 1 / 1.1: no longer worth a draft
    # Too few samples keep the probe's values.
    assert refit(probed, forwards[: MIN_SAMPLES - 1]) == probed
    assert refit(probed, []) == probed


def test_every_forward_is_timed_with_its_pieces_and_draft():
    target = tiny_target(16, seed=2, eos_ids=frozenset())
    config = DecodeConfig(block_length=16, gen_length=40, sampling=Sampling(1.0), seed=1)
    prompt = prompt_ids(3, 10)
    reference = generate(target, prompt, config, record=True)
    got = generate(target, prompt, replace(config, budget=3), drafter=OracleDrafter(reference.trajectory))
    timings = got.stats.timings
    assert len(timings) == got.stats.forwards and len(reference.stats.timings) == reference.stats.forwards
    assert all(t.pieces - 1 == t.drafted for t in timings) and got.stats.draft_nodes > 0  # a fixed budget verifies all it drafts
    assert all(t.verify_seconds > 0 and t.context % 16 == 0 and (t.drafted == 0) == (t.draft_seconds == 0) for t in timings)
    assert {t.pieces for t in reference.stats.timings} == {1}
