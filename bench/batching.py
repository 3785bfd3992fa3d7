"""Batched decoding: throughput and forwards per request at batch sizes 1, 2, 4, 8, and what batching changes.

Every method (draft-free and each drafter) decodes the same prompts at every batch size (spot.engine.generations:
B requests per verify forward, continuous batching), in one process; the sizes run in rotation, `--repeats`
times, and each figure is the median over the repeats:

  tokens_per_second     output tokens / wall seconds of the whole batch run
  speedup_over_batch1   tokens_per_second at B / the same method's at batch 1
  forwards_per_request  target forwards a request took part in (batching leaves it alone: each request's
                        own decode is unchanged)
  forwards_per_round    target forwards of the run / requests: what B requests sharing a forward save
  over_draft_free       the method's tokens_per_second / draft-free's at the same B
  drafting_share        the run's seconds in the drafter's calls / its wall seconds (a round drafts every
                        request's tree in one `draft_batch` call: SPOT's order model scores all the roots at once)
  differ_from_batch1    requests whose tokens differ from the same method's batch-1 tokens (0 in the exact
                        layout; in the packed one, a near tie in bf16 can flip), with the smallest decision margin
  path_from_batch1      requests whose tokens are the same but whose steps per forward are not: a flipped
                        decision that reached the same tokens another way (the packed layout)
  lossless              requests whose tokens equal draft-free's at the same B

Prints one JSON line (a table on stderr).

Usage: python bench/batching.py [--prompts 8] [--gen 128] [--sizes 1+2+4+8] [--methods spot@8+spiffy@3]
           [--dtype bfloat16] [--exact] [--repeats 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace

import pandas as pd
import torch
from speedup import prompts_for

from spot import DecodeConfig, Request, generate_batch
from spot.drafters.base import draft_all
from spot_eval.checkpoints.shipped import EMBEDDED_TARGET
from spot_eval.checkpoints.target import encode_prompt, load_target
from spot_eval.harness.lossless import diverge
from spot_eval.harness.methods import build_drafter, parse_methods
from spot_eval.harness.settings import DTYPES, resolve_dtype


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(EMBEDDED_TARGET))
    parser.add_argument("--task", default="gsm8k", choices=["gsm8k", "math500", "humaneval", "mbpp"])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--gen", type=int, default=128)
    parser.add_argument("--sizes", default="1+2+4+8")
    parser.add_argument("--methods", default="spot@8+spiffy@3")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--exact", action="store_true", help="the per-piece layout (bit for bit at any batch size)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split("+")]
    target = load_target(args.target, None, args.device, args.exact, resolve_dtype("--dtype", args.dtype, args.device))
    prompts = [encode_prompt(target, p, chat=True) for p in prompts_for(args.task, args.prompts)]
    config = DecodeConfig(block_length=target.block_length, gen_length=args.gen)
    references = generate_batch(target, [Request(p, config, number=i) for i, p in enumerate(prompts)], 1, record=True,
                                record_margins=True)  # the batch-1 draft-free decodes (and a warm-up)
    methods = {"draft_free": (config, None)}
    for spec in parse_methods(args.methods, ""):
        methods[spec.label] = (spec.config(replace(config, budget=spec.budget)),
                               _Timed(build_drafter(spec, target, config.policy, threshold=config.threshold)))
    rows, alone = [], {}
    for repeat in range(args.repeats):
        for size in sizes if repeat % 2 == 0 else sizes[::-1]:  # rotate: drift in machine state spreads evenly
            for label, (method_config, drafter) in methods.items():
                requests = [Request(p, method_config, drafter, i) for i, p in enumerate(prompts)]
                forwards = target.forwards
                if drafter is not None:
                    drafter.seconds = 0.0
                t = time.perf_counter()
                got = generate_batch(target, requests, size, record=True, record_margins=True)
                seconds = time.perf_counter() - t
                if size == sizes[0]:
                    alone.setdefault(label, got)
                first = alone.get(label, got)
                flips = [diverge(g, f, method_config, target.mask_id) for g, f in zip(got, first, strict=True)]
                paths = sum(d is None and g.stats.accepted_lengths != f.stats.accepted_lengths
                            for d, g, f in zip(flips, got, first, strict=True))
                flips = [d for d in flips if d is not None]
                rows.append({
                    "repeat": repeat, "batch": size, "label": label, "seconds": seconds,
                    "tokens_per_second": sum(len(g.token_ids) for g in got) / seconds,
                    "forwards_per_request": statistics.fmean(g.stats.forwards for g in got),
                    "forwards_per_round": (target.forwards - forwards) / len(got),
                    "drafting_share": 0.0 if drafter is None else drafter.seconds / seconds,
                    "differ_from_batch1": len(flips), "path_from_batch1": paths,
                    "smallest_margin": min((d.margin for d in flips if d.margin is not None), default=None),
                    "lossless": statistics.fmean(g.token_ids == r.token_ids for g, r in zip(got, references, strict=True)),
                })
    frame = pd.DataFrame(rows)
    medians = frame.groupby(["label", "batch"], sort=False).agg(
        tokens_per_second=("tokens_per_second", "median"), forwards_per_request=("forwards_per_request", "median"),
        forwards_per_round=("forwards_per_round", "median"), drafting_share=("drafting_share", "median"), differ_from_batch1=("differ_from_batch1", "max"),
        path_from_batch1=("path_from_batch1", "max"),
        smallest_margin=("smallest_margin", "min"), lossless=("lossless", "min")).reset_index()
    one = medians[medians.batch == sizes[0]].set_index("label").tokens_per_second
    free = medians[medians.label == "draft_free"].set_index("batch").tokens_per_second
    medians["speedup_over_batch1"] = medians.tokens_per_second / medians.label.map(one)
    medians["over_draft_free"] = medians.tokens_per_second / medians.batch.map(free)
    print(medians.to_string(index=False, float_format=lambda x: f"{x:.3f}"), file=sys.stderr)
    print(json.dumps({
        "bench": "batching", "target": args.target, "task": args.task, "prompts": len(prompts), "gen": args.gen,
        "dtype": args.dtype, "exact": args.exact, "device": args.device, "repeats": args.repeats,
        "rows": json.loads(medians.to_json(orient="records")),
    }))


class _Timed:
    """A drafter whose batched calls add their seconds to `seconds`."""

    def __init__(self, drafter) -> None:
        self.drafter, self.name, self.seconds = drafter, drafter.name, 0.0
        self.modes = getattr(drafter, "modes", {})

    def draft(self, ctx):
        return self.draft_batch([ctx])[0]

    def draft_batch(self, ctxs):
        t = time.perf_counter()
        trees = draft_all(self.drafter, ctxs)
        self.seconds += time.perf_counter() - t
        return trees


if __name__ == "__main__":
    main()
