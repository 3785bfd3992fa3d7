"""What ordering a dual-cache forward's keys in position order costs, and what it changes in bf16.

The frozen-cache decoder (spot.targets.dual_cache) feeds the live rows of a block against frozen keys and values.
`key_order="position"` (the default) puts a live row's own keys between the frozen prefix and suffix, in the
order the reference (Fast-dLLM's dual cache) sums them; `"frozen_first"` puts them after every frozen key, as
this project did before. Per order this decodes the same requests draft-free, interleaving the two orders
request by request, and reports the median seconds per verify forward of the later steps (the forwards
whose key order differs) and their ratio, the largest logit difference between the two orders over the
forwards that both runs make at the same canvas and block state, and the requests whose tokens differ.

Usage: python bench/key_order.py [--random llada|dream] [--dtype bfloat16|float32] [--prompts 12] [--block 32] [--gen 64]
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from cache_divergence import VOCAB, random_model

from spot import DecodeConfig, generate
from spot.targets import DualCacheTarget


class Timed:
    """Notes each verify forward's seconds and logits after the block-start one."""

    def __init__(self, target: DualCacheTarget) -> None:
        self.target, self.seconds, self.logits = target, [], {}  # logits: (canvas so far, state) -> [K, V]

    def __getattr__(self, name):
        return getattr(self.target, name)

    def verify_batch(self, calls):
        (call,) = calls  # one request at a time
        fresh = call.stream.layout is None
        t = time.perf_counter()
        out = self.target.verify_batch(calls)
        if not fresh:
            self.seconds.append(time.perf_counter() - t)
            key = (tuple(call.stream.tokens.tolist()), tuple(call.pieces[0].tolist()))
            self.logits[key] = out[0].logits[0].float()
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--random", choices=["llada", "dream"], default="llada")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--block", type=int, default=32)
    parser.add_argument("--gen", type=int, default=64)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    model, shift = random_model(args.random)
    model = model.to(getattr(torch, args.dtype))
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, VOCAB - 1, (int(n),), generator=g).tolist() for n in torch.randint(8, 64, (args.prompts,), generator=g)]
    config = DecodeConfig(block_length=args.block, gen_length=args.gen)
    targets = {order: DualCacheTarget(model, VOCAB - 1, frozenset(), args.block, shift=shift, key_order=order)
               for order in ("position", "frozen_first")}
    seconds = {order: [] for order in targets}
    max_diff, differing, compared = 0.0, 0, 0
    for prompt in prompts:
        runs = {}
        for order, target in targets.items():  # interleaved: both orders see the same machine state
            timed = Timed(target)
            runs[order] = (generate(timed, prompt, config).token_ids, timed)
            seconds[order] += timed.seconds
        (a, ta), (b, tb) = runs["position"], runs["frozen_first"]
        differing += a != b
        same = ta.logits.keys() & tb.logits.keys()  # forwards at the same canvas and block state in both runs
        compared += len(same)
        max_diff = max([max_diff, *((ta.logits[k] - tb.logits[k]).abs().max().item() for k in same)])
    median = {order: statistics.median(s) for order, s in seconds.items()}
    print(json.dumps({"bench": "key_order", "model": f"random {args.random}", "dtype": args.dtype, "prompts": len(prompts),
                      "block": args.block, "gen": args.gen, "forwards_timed": {o: len(s) for o, s in seconds.items()},
                      "median_ms_position": 1e3 * median["position"], "median_ms_frozen_first": 1e3 * median["frozen_first"],
                      "ratio_position_over_frozen_first": median["position"] / median["frozen_first"],
                      "max_abs_logit_diff": max_diff, "forwards_compared": compared, "requests_with_other_tokens": differing}))


if __name__ == "__main__":
    main()
