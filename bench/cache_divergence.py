"""How far the frozen-cache decoders move a bidirectional target's output from the uncached one.

The draft-free reference of a LLaDA or Dream target is the dual-cache decoder (spot.targets.dual_cache),
an approximation of the uncached decoder (every step a full forward). Per request this decodes with
cache=none and with each frozen cache, and reports per cache: the requests whose tokens are identical to
the uncached ones, the fraction of generated positions whose token differs, the median position of the
first difference, and forwards and seconds against the uncached decoder's.

Models: `--random llada|dream` (tiny random weights of that family, random prompts) or `--embedded` (the
shipped target's *trained* weights run bidirectionally under the dual-cache decoder, GSM8K prompts: a
proxy, since it was trained block-causally; no trained LLaDA or Dream fits this machine).

Usage: python bench/cache_divergence.py --random llada [--prompts 20] [--block 32] [--gen 128]
       python bench/cache_divergence.py --embedded --prompts 20
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from spot import DecodeConfig, generate
from spot.config import CACHES
from spot.targets import BlockCausalTarget, DualCacheTarget
from spot.targets.llada import LLaDAForCausalLM, llada_config
from spot_eval.checkpoints.shipped import EMBEDDED_TARGET
from spot_eval.checkpoints.target import encode_prompt
from spot_eval.data.datasets import load

VOCAB = 512  # the random models' vocabulary; the last id is the mask


def random_model(family: str) -> tuple[torch.nn.Module, bool]:
    """A 4-layer, 128-wide model of the family with seeded random weights, and whether its logits shift."""
    torch.manual_seed(0)
    if family == "llada":
        config = llada_config(d_model=128, n_heads=4, n_layers=4, mlp_hidden_size=256, embedding_size=VOCAB, vocab_size=VOCAB,
                              max_sequence_length=1024, rope_theta=10000.0)
        return LLaDAForCausalLM(config).eval(), False
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=False)
    return Qwen2ForCausalLM(config).eval(), True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--random", choices=["llada", "dream"])
    which.add_argument("--embedded", action="store_true")
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--block", type=int, default=32)
    parser.add_argument("--gen", type=int, default=128)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    if args.embedded:
        trained = BlockCausalTarget.from_pretrained(EMBEDDED_TARGET, block_length=args.block)
        model, shift, mask, eos = trained.model, False, trained.mask_id, trained.eos_ids
        questions = [row["question"] for row in load("gsm8k_test")[: args.prompts]]
        prompts = [encode_prompt(trained, q, chat=True) for q in questions]
    else:
        model, shift = random_model(args.random)
        mask, eos = VOCAB - 1, frozenset()
        g = torch.Generator().manual_seed(1)
        prompts = [torch.randint(0, VOCAB - 1, (int(n),), generator=g).tolist() for n in torch.randint(8, 64, (args.prompts,), generator=g)]
    config = DecodeConfig(block_length=args.block, gen_length=args.gen)
    runs = {}
    for cache in CACHES:
        target = DualCacheTarget(model, mask, eos, args.block, cache=cache, shift=shift)
        runs[cache] = [generate(target, p, config) for p in prompts]
    base = {"bench": "cache_divergence", "model": "embedded (bidirectional proxy)" if args.embedded else f"random {args.random}",
            "prompts": len(prompts), "block": args.block, "gen": args.gen}
    for cache in (c for c in CACHES if c != "none"):
        differing, positions, first = 0, 0, []
        for ours, full in zip(runs[cache], runs["none"], strict=True):
            a, b = ours.token_ids, full.token_ids
            n = max(len(a), len(b))
            diff = [i for i in range(n) if i >= len(a) or i >= len(b) or a[i] != b[i]]
            differing += len(diff)
            positions += n
            if diff:
                first.append(diff[0])
        forwards = sum(g.stats.forwards for g in runs[cache]) / sum(g.stats.forwards for g in runs["none"])
        seconds = sum(g.stats.seconds for g in runs["none"]) / sum(g.stats.seconds for g in runs[cache])
        print(json.dumps({**base, "cache": cache, "identical_requests": len(prompts) - len(first),
                          "token_difference_rate": differing / max(positions, 1),
                          "median_first_difference": statistics.median(first) if first else None,
                          "forward_ratio_vs_uncached": forwards, "speedup_vs_uncached": seconds}), flush=True)


if __name__ == "__main__":
    main()
