"""The drafters that ship, on the target that ships: loaded by name, token-identical to draft-free."""

from __future__ import annotations

from dataclasses import replace

import pytest

from spot import DecodeConfig, Sampling, generate
from spot_eval.checkpoints.shipped import DRAFTERS, EMBEDDED_TARGET, shipped_drafter
from spot_eval.checkpoints.target import encode_prompt, load_target
from spot_eval.data.datasets import load
from spot_eval.harness.methods import MethodSpec, build_drafter, drafter_file


@pytest.fixture(scope="module")
def target():
    return load_target(EMBEDDED_TARGET, 32)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["single", "threshold"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_shipped_spot_and_spiffy_are_lossless_on_the_embedded_target(target, temperature, policy):
    ids = encode_prompt(target, load("gsm8k_test")[3]["question"], chat=True)
    config = DecodeConfig(policy=policy, threshold=0.9, block_length=32, gen_length=48, sampling=Sampling(temperature), seed=5)
    reference = generate(target, ids, config, request=2)
    for spec in (MethodSpec("spot", 8), MethodSpec("spot", 20), MethodSpec("spiffy", 3)):
        drafter = build_drafter(spec, target, config.policy)  # the file shipped for the policy (its fingerprint is checked)
        got = generate(target, ids, replace(config, budget=spec.budget), drafter=drafter, request=2)
        assert got.token_ids == reference.token_ids, spec.label
        assert got.stats.forwards < reference.stats.forwards, spec.label


def test_each_policy_gets_the_drafter_shipped_for_it(target):
    for method, policy in (("spot", "single"), ("spot", "threshold"), ("spiffy", "single"), ("spiffy", "threshold"),
                           ("sets", "threshold"), ("spot_r", "single"), ("spot_rc", "single")):
        path = drafter_file(MethodSpec(method, 8), 32, policy)
        assert path == shipped_drafter(method, 32, policy) and path.is_file()
        other = "threshold" if policy == "single" else "single"
        with pytest.raises(ValueError, match=f"policy.*{policy}"):  # the other policy's loader refuses the file
            build_drafter(MethodSpec(method, 8, str(path)), target, other, threshold=0.9)


@pytest.mark.slow
@pytest.mark.parametrize(("method", "file"), [("sets", "sets_b32.pt"), ("sets", "sets_b32.json"), ("sets_r", "spot_r_b32.pt")],
                         ids=["set-model", "stale-sets", "refreshed"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_shipped_set_predictors_are_lossless_under_threshold_decoding(target, temperature, method, file):
    ids = encode_prompt(target, load("gsm8k_test")[5]["question"], chat=True)
    config = DecodeConfig(policy="threshold", threshold=0.9, block_length=32, gen_length=64, sampling=Sampling(temperature), seed=3)
    reference = generate(target, ids, config, request=1)
    spec = MethodSpec(method, 8, str(DRAFTERS / file))
    drafter = build_drafter(spec, target, config.policy, threshold=config.threshold)
    got = generate(target, ids, replace(config, budget=8, cross_block=temperature > 0), drafter=drafter, request=1)
    assert got.token_ids == reference.token_ids and got.stats.forwards < reference.stats.forwards
