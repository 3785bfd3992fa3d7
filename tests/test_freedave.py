"""FreeDave / SSD (spot.drafters.freedave): the chain on literal logits, its coupled-noise tokens, FreeDave's own
reused sample, and the method names through the harness."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import tiny_target

from spot import DecodeConfig, Sampling, generate
from spot.drafters.base import DraftContext
from spot.drafters.freedave import FreeDaveDrafter
from spot.noise import gumbel, step_key
from spot.policy import decide
from spot_eval.harness.methods import MethodSpec, build_drafter, parse_methods

M, K, V = 5, 4, 6
# Stale logits: positions 1, 3, 0, 2 in that order of confidence, tokens 2, 3, 1, 4.
STALE = torch.zeros(K, V)
for position, token, height in ((1, 2, 9.0), (3, 3, 7.0), (0, 1, 5.0), (2, 4, 3.0)):
    STALE[position, token] = height


def context(state, budget, config, step=3, noise=lambda s: None) -> DraftContext:
    return DraftContext(torch.tensor(state), STALE, torch.tensor([M] * K), None, config, M, 0, 0, step, budget, noise)


def chain(tree) -> list[list[int]]:
    assert tree.parents == ((),) + tuple((i,) for i in range(tree.size))  # a chain, each under the one before
    return tree.states.tolist()


def test_single_commit_fills_the_most_confident_positions_one_a_node():
    tree = FreeDaveDrafter().draft(context([M, M, M, M], 3, DecodeConfig(block_length=K)))
    assert chain(tree) == [[M, M, M, M], [M, 2, M, M], [M, 2, M, 3], [1, 2, M, 3]]


def test_the_chain_stops_at_the_budget_and_at_a_full_block():
    assert FreeDaveDrafter().draft(context([M, M, M, M], 1, DecodeConfig(block_length=K))).size == 1
    tree = FreeDaveDrafter().draft(context([M, 2, M, 3], 8, DecodeConfig(block_length=K)))
    assert chain(tree) == [[M, 2, M, 3], [1, 2, M, 3], [1, 2, 4, 3]]


def test_under_threshold_decoding_each_node_adds_one_position_freedave_plus_plus():
    """The root is the threshold step (the two positions above tau committed); then one position a node."""
    config = DecodeConfig(policy="threshold", threshold=0.9, block_length=K)
    tree = FreeDaveDrafter().draft(context([M, 2, M, 3], 2, config))
    assert chain(tree) == [[M, 2, M, 3], [1, 2, M, 3], [1, 2, 4, 3]]


def test_at_t1_each_node_draws_with_its_own_steps_coupled_noise():
    config = DecodeConfig(block_length=K, sampling=Sampling(temperature=1.0), seed=7)
    steps = {s: gumbel(step_key(7, 0, 0, s), K, V) for s in range(2, 8)}
    tree = FreeDaveDrafter().draft(context([M, M, M, M], 3, config, step=3, noise=steps.__getitem__))
    expected, state = [[M] * K], torch.tensor([M] * K)
    for d in range(3):  # the draft-free decoder's own steps 3, 4, 5 on the stale logits
        state = decide(state, STALE, steps[3 + d], config, M, 3 + d)[0]
        expected.append(state.tolist())
    assert chain(tree) == expected
    reused = FreeDaveDrafter(reuse_sample=True).draft(context([M, M, M, M], 3, config, step=3, noise=steps.__getitem__))
    state, again = torch.tensor([M] * K), [[M] * K]
    for d in range(3):  # FreeDave's own: the last forward's sample (step 2's noise) at every depth
        state = decide(state, STALE, steps[2], config, M, 3 + d)[0]
        again.append(state.tolist())
    assert chain(reused) == again


def test_a_blocks_first_step_has_nothing_to_draft_from():
    ctx = context([M, M, M, M], 4, DecodeConfig(block_length=K))
    tree = FreeDaveDrafter().draft(DraftContext(ctx.state, None, None, None, ctx.config, M, 0, 0, 0, 4, ctx.gumbel))
    assert tree.size == 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_freedave_saves_forwards_losslessly_and_freedaves_own_sample_does_not_survive_sampling(temperature):
    target = tiny_target(16, seed=1, eos_ids=frozenset())
    config = DecodeConfig(block_length=16, gen_length=48, sampling=Sampling(temperature), seed=2)
    prompt = list(range(1, 20))
    reference = generate(target, prompt, config)
    coupled = generate(target, prompt, replace(config, budget=7), drafter=FreeDaveDrafter())
    # The authors' rule by its methods= name, at their Dream and TraDo setting (8 drafts: freedave@7).
    reused = generate(target, prompt, replace(config, budget=7),
                      drafter=build_drafter(MethodSpec("freedave_reused", 7), target, "single"))
    assert coupled.token_ids == reference.token_ids == reused.token_ids
    assert coupled.stats.forwards < reference.stats.forwards
    if temperature > 0:  # the reused sample is accepted where the draws happen to agree, and less than the coupled one
        assert reused.stats.forwards > coupled.stats.forwards
    else:
        assert reused.stats.forwards == coupled.stats.forwards


def test_the_method_names_and_their_bad_forms():
    specs = parse_methods("freedave@4+ssd@8+freedave+freedave_reused@7", "2")
    assert [s.label for s in specs] == ["freedave@4", "ssd@8", "freedave@2", "freedave_reused@7"] and not any(s.lossy for s in specs)
    assert build_drafter(specs[1], tiny_target(16), "single").name == "ssd"
    reused = build_drafter(specs[3], tiny_target(16), "single")
    assert reused.name == "freedave_reused" and reused.reuse_sample
    for item, message in (("freedave@0", "budget must be >= 1, got 0"), ("freedave@-1", "budget must be >= 1, got -1"),
                          ("freedave:some/path", "freedave reads no file (it drafts from the target's own outputs); "
                                                 "drop ':some/path'"),
                          ("freedave@auto", "budget auto needs calibrated reach probabilities"),
                          ("ssd@auto", "give ssd a fixed budget (ssd@3)")):
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            parse_methods(item, "")
    assert MethodSpec("freedave", 4).method.cost.startswith("nothing")


def test_the_papers_settings_suite_loads_and_every_method_in_it_builds_at_its_block_length():
    """spot_eval/reports/suites/freedave-paper.toml, FreeDave's TraDo setting on the embedded target, is runnable
    as written: its model_args parse, its block length and eager mode reach the decoder, and its methods need no
    file that does not ship for that block length."""
    from lm_eval.utils import simple_parse_args_string

    from spot_eval.harness.methods import drafter_file
    from spot_eval.harness.model_args import SpotArgs
    from spot_eval.reports.nightly import DEFAULT_SUITE, load_suite

    suite = load_suite(DEFAULT_SUITE.with_name("freedave-paper.toml"))
    args = SpotArgs.parse(simple_parse_args_string(suite.model_args))
    config = args.decode_config(args.block_length)  # as SpotLM passes it where the model_args set one
    assert (config.block_length, config.cross_block, config.policy) == (4, True, "single")
    specs = parse_methods(suite.methods, args.budgets)
    assert [s.label for s in specs] == ["freedave@7", "freedave_reused@7", "oracle@7"]
    for spec in specs:
        assert drafter_file(spec, config.block_length, config.policy) is None
