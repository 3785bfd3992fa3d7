"""How often the leftmost tie rule and tie_break=topk decode as the reference generators do in bf16.

On the tests' tiny LLaDA and Dream models in bf16 (tests/test_dual_cache.py), against the generators as
tests/test_reference_rules.py transcribes them, run unamended (their own torch.topk on their own rows): LLaDA's
generate.py, Dream's diffusion_generate (top_k 50; maskgit_plus, topk_margin, entropy), Fast-dLLM's full-canvas
capped Dream and its blocked Dream with a prefix cache (confidence_threshold, entropy). With --flat the LM head is
scaled down (tests' FLAT), so that bf16 rounds many confidences equal and ties are common. Prints one JSON line.

    python bench/reference_ties.py [--seeds 6]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import test_reference_rules as R  # noqa: E402  (the transcriptions)
from test_dual_cache import EOS, MASK, TARGETS  # noqa: E402

from spot import DecodeConfig, Sampling, generate  # noqa: E402
from spot.targets import DualCacheTarget  # noqa: E402

MODEL = dict(mask_in_softmax=True, stop_at_eos=False, confidence_dtype="model")


def model(family: str, seed: int, flat: bool):
    build, _, _ = TARGETS[family]
    m = build(seed=seed, dtype=torch.bfloat16)
    if flat:
        with torch.no_grad():
            m.lm_head.weight.mul_(R.FLAT)
    return m


def cases(seeds: int):
    """(reference, setting, model, target, config, the reference's tokens), for each decode."""
    shift = TARGETS["dream"][2]
    for seed in range(seeds):
        for prompt in (list(range(1, 17)), list(range(1, 12)), list(range(3, 9))):
            m = model("llada", seed, True)
            yield ("llada generate.py", "static", DualCacheTarget(m, MASK, frozenset({EOS}), 8, cache="none"),
                   DecodeConfig(policy="static", steps=4, block_length=8, gen_length=24, **MODEL),
                   R.llada_generate(m, prompt, 24, 8, 12, pick=R.torch_topk), prompt)
            for alg, rule in (("maskgit_plus", "probability"), ("topk_margin", "margin"), ("entropy", "entropy")):
                m = model("dream", seed, True)
                yield ("dream diffusion_generate", alg, DualCacheTarget(m, MASK, frozenset({EOS}), 24, cache="none", shift=shift),
                       DecodeConfig(policy="timestep", steps=10, block_length=24, gen_length=24, confidence=rule,
                                    sampling=Sampling(top_k=R.DREAM_TOP_K), **MODEL),
                       R.dream_generate(m, prompt, 24, 10, alg, R.DREAM_TOP_K, pick=R.torch_topk), prompt)
        for flat in (False, True):
            for _, prompt, gen, steps, threshold in R.FULL_CANVAS:
                m = model("dream", seed, flat)
                yield ("fast-dllm dream, full canvas", "capped threshold",
                       DualCacheTarget(m, MASK, frozenset({EOS}), gen, cache="none", shift=shift),
                       DecodeConfig(policy="threshold", threshold=threshold, capped=True, steps=steps, block_length=gen,
                                    gen_length=gen, **MODEL),
                       R.fast_dllm_dream_full_canvas(m, prompt, gen, steps, threshold, pick=R.torch_topk), prompt)
            for alg in ("confidence_threshold", "entropy"):
                for prompt in (list(range(1, 12)), list(range(2, 7))):
                    m = model("dream", seed, flat)
                    policy = dict(policy="threshold", threshold=0.3) if alg == "confidence_threshold" else dict(policy="timestep", steps=4)
                    yield ("fast-dllm dream, prefix cache", alg, DualCacheTarget(m, MASK, frozenset({EOS}), 8, cache="prefix", shift=shift),
                           DecodeConfig(**policy, block_length=8, gen_length=24, first_token_commit=True,
                                        confidence="entropy" if alg == "entropy" else "probability", **MODEL),
                           R.fast_dllm_dream(m, prompt, 24, 8, 12, alg, threshold=0.3, pick=R.torch_topk), prompt)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=6)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    rows: dict[str, dict[str, int]] = {}
    for reference, _, target, config, expected, prompt in cases(args.seeds):
        row = rows.setdefault(reference, {"decodes": 0, "leftmost": 0, "topk": 0})
        row["decodes"] += 1
        row["leftmost"] += list(generate(target, prompt, config).token_ids) == expected
        row["topk"] += list(generate(target, prompt, replace(config, tie_break="topk")).token_ids) == expected
    print(json.dumps({"bench": "reference_ties", "dtype": "bfloat16", "device": "cpu", "torch": torch.__version__,
                      "seeds": args.seeds, "matches": rows}))


if __name__ == "__main__":
    main()
