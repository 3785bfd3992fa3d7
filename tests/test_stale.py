"""The stale-confidence order (budget=auto's cheap mode): its logits, its fit with literal blocks, and
SPOT drafting in that mode without the order model (its losslessness is in test_engine's grid)."""

from __future__ import annotations

import math

import pytest
import torch

from spot import DecodeConfig
from spot.drafters.base import DraftContext
from spot.drafters.order_examples import RecordedBlock
from spot.drafters.order_model import OrderModel
from spot.drafters.reach import ReachCalibration, ReachMap
from spot.drafters.spot import SpotDrafter
from spot.drafters.stale import TEMPERATURES, StaleOrder, fit_by_trees, fit_temperature

MASK = 9


def test_the_stale_order_is_a_power_of_the_confidence_over_masked_positions():
    order = StaleOrder(0.5)
    logits = order.logits(torch.tensor([0.9, 0.5, 0.99, 0.1]), torch.tensor([True, True, False, True]))
    assert logits.tolist() == pytest.approx([2 * math.log(0.9), 2 * math.log(0.5), -math.inf, 2 * math.log(0.1)])
    with pytest.raises(ValueError, match="positive"):
        StaleOrder(0.0)
    calibrated = StaleOrder(0.2, ReachCalibration((1,), (ReachMap((0.0,), (0.5,)),), (0.5,)))
    assert StaleOrder.from_dict(calibrated.to_dict()) == calibrated


def block(first: float, last: float) -> RecordedBlock:
    """Three positions committed in the order 1, 2, 0 at T = 0; the stale distribution behind the second
    step (the first one with a stale distribution) puts confidence `first` at position 0 and `last` at 2."""
    states = torch.tensor([[MASK, MASK, MASK], [MASK, 5, MASK], [MASK, 5, 6], [7, 5, 6]])
    probs = torch.tensor([[[first, 0.05], [0.9, 0.05], [last, 0.1]]] * 3)  # [S, K, k]
    ids = torch.tensor([[[7, 1], [5, 1], [6, 1]]] * 3)
    return RecordedBlock(states, probs.log(), ids, MASK, seed=0, request=0, block=0, temperature=0.0)


def test_the_temperature_fit_follows_how_often_the_most_confident_position_is_next():
    right = fit_temperature([block(0.3, 0.8)])  # the committed position 2 is the more confident: a sharp order
    assert right.top1 == 1.0 and right.steps == 2 and right.temperature < 0.03 and right.log_likelihood == pytest.approx(0.0)
    wrong = fit_temperature([block(0.8, 0.3)])  # the less confident one: as flat as the grid allows
    assert wrong.top1 == 0.5 and wrong.temperature == max(TEMPERATURES)  # the last step's one candidate is always right
    assert wrong.log_likelihood == pytest.approx(math.log(0.3 ** 0.1 / (0.3 ** 0.1 + 0.8 ** 0.1)) / 2)
    with pytest.raises(ValueError, match="no steps"):
        fit_temperature([])


def test_spot_drafts_in_the_stale_mode_without_the_order_model():
    torch.manual_seed(0)
    model = OrderModel()
    calls = []
    model.register_forward_hook(lambda *args: calls.append(1))
    reach = ReachCalibration((1,), (ReachMap((-5.0, 0.0), (0.1, 0.7)),), (0.4,))
    drafter = SpotDrafter(model, stale=StaleOrder(0.1, reach))
    assert drafter.modes == {"stale": (0.4,)}  # the model's trees are not calibrated: only the stale mode is offered
    k, vocab = 4, 40  # the order model reads the top 32
    logits = torch.full((k, vocab), -10.0)
    for position, (token, value) in enumerate([(3, 2.0), (4, 9.0), (5, 0.5), (6, 5.0)]):
        logits[position, token] = value
    state = torch.tensor([2, MASK, MASK, MASK])
    stale_state = torch.tensor([MASK, MASK, MASK, MASK])

    def ctx(mode):
        return DraftContext(state, logits, stale_state, None, DecodeConfig(block_length=k, budget=3), MASK, 0, 0, 1, 3,
                            lambda _: None, mode)

    tree = drafter.draft(ctx("stale"))
    assert not calls and tree.size == 3
    assert tree.states[1].tolist() == [2, 4, MASK, MASK]  # the most confident masked position first, with its top token
    assert tree.reach == (1.0, *reach(tree.scores[1:]))
    drafter.draft(ctx("model"))
    assert calls
    with pytest.raises(ValueError, match="mode 'model' or 'stale'"):
        drafter.draft(ctx("graph"))
    with pytest.raises(ValueError, match="calibrate-reach"):
        SpotDrafter(model).draft(ctx("stale"))


def test_the_trees_choose_the_order_temperature_that_commits_the_most():
    """Behind the second step the stale confidence is higher at position 0 (0.5) than at 2 (0.45), where the target
    commits next: a sharp order spends a two-node tree below position 0, a flat one tries position 2 beside it and
    commits two steps in one forward."""
    grow_at = lambda t: SpotDrafter(OrderModel(), gate=0.0, stale=StaleOrder(t)).grow  # noqa: E731
    fit = fit_by_trees(grow_at, [block(0.5, 0.45)], budget=2, temperatures=(0.01, 1.0))
    assert fit.grid == ((0.01, 1.0), (1.0, 1.5)) and (fit.temperature, fit.commits_per_forward) == (1.0, 1.5)
    for grid in ((0.01, 1.0), (1.0, 0.01)):  # a tie: the sharper, in whatever order the grid lists them
        assert fit_by_trees(grow_at, [block(0.5, 0.45)], budget=1, temperatures=grid).temperature == 0.01
    with pytest.raises(ValueError, match="no recorded blocks"):
        fit_by_trees(grow_at, [], budget=2)
