"""Target-forward reduction and wall-clock throughput of each method against draft-free decoding.

Every prompt is decoded draft-free and by every method in one process, interleaved per prompt
(the order rotates from prompt to prompt so that drift in machine state spreads evenly). Ratios
are of sums over the same prompts: forwards(draft-free) / forwards(method) and seconds(draft-free)
/ seconds(method). Each method's tokens are checked against draft-free (lossless must be 1.0), except a
lossy method's (`sets_max@8`: max-commit, opt-in), which differ by design: for it 1 - lossless is the
fraction of prompts whose output differs, and token_divergence the fraction of output positions.
With several seeds the JSON gives mean and std over seeds. `spot@auto` sizes every tree by this
machine's verify-cost profile (measured once, cached; spot_eval.harness.profile), refitted to the
timings decoding measures after every prompt as `lm_eval --model spot` does, and the mean tree
size (draft nodes per verify forward) is reported for every method. Prints one JSON line (a table
on stderr).

Usage: python bench/speedup.py --prompts 50 --block 32 --gen 256 --temperature 0 --seeds 0
           --methods spot@8+spot@20+spiffy@3+spiffy@10+spot@auto [--task gsm8k] [--target DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace

import pandas as pd
import torch

from spot import DecodeConfig, Sampling, generate
from spot_eval.checkpoints.shipped import EMBEDDED_TARGET
from spot_eval.checkpoints.target import encode_prompt, load_target
from spot_eval.data.datasets import load, mbpp_split
from spot_eval.harness.lossless import token_divergence
from spot_eval.harness.methods import build_drafter, parse_methods
from spot_eval.harness.profile import Refitted, auto_sizing, verify_profile
from spot_eval.reports.results import summarize

PROMPT_FIELDS = {"gsm8k_test": "question", "math500_test": "problem", "humaneval_test": "prompt"}


def prompts_for(task: str, n: int) -> list[str]:
    if task == "mbpp":  # the problem and its tests, as the spot_mbpp task states them
        return ["\n".join([row["text"], *row["test_list"][:3]]) for row in mbpp_split("test")[:n]]
    name = f"{task}_test"
    return [row[PROMPT_FIELDS[name]] for row in load(name)[:n]]


def run_seed(target, prompts: list[list[int]], config: DecodeConfig, specs, seed: int) -> pd.DataFrame:
    config = replace(config, seed=seed)
    drafters = {s.label: build_drafter(s, target, config.policy, threshold=config.threshold) for s in specs}
    profile = verify_profile(target) if any(s.auto for s in specs) else None
    sizings = {s.label: Refitted(auto_sizing(target, drafters[s.label], s.config(config), profile))
               for s in specs if s.auto}  # refitted to decoding's timings after every prompt, as lm_eval runs it
    lossy = {s.label for s in specs if s.lossy}
    rows = []
    for i, ids in enumerate(prompts):
        labels = ["draft_free", *drafters]
        labels = labels[i % len(labels) :] + labels[: i % len(labels)]
        results = {}
        for label in labels:
            spec = next((s for s in specs if s.label == label), None)
            cfg = config if spec is None else spec.config(config)
            auto = sizings.get(label)
            results[label] = generate(target, ids, cfg, drafter=drafters.get(label), request=i, sizing=auto and auto.sizing)
            if auto:
                auto.observe(results[label].stats)
        for label, g in results.items():
            s, reference = g.stats, results["draft_free"].token_ids
            rows.append({
                "seed": seed, "prompt": i, "label": label, "tokens": len(g.token_ids), "forwards": s.forwards,
                "seconds": s.seconds, "drafter_seconds": s.drafter_seconds, "target_seconds": s.target_seconds,
                "accepted_lengths": s.accepted_lengths, "draft_nodes": s.draft_nodes,
                "lossless": g.token_ids == reference, "token_divergence": token_divergence(g.token_ids, reference),
                "lossy": label in lossy,
            })
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(EMBEDDED_TARGET))
    parser.add_argument("--task", default="gsm8k", choices=["gsm8k", "math500", "humaneval", "mbpp"])
    parser.add_argument("--prompts", type=int, default=50)
    parser.add_argument("--block", type=int, default=32)
    parser.add_argument("--gen", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seeds", default="0", help="e.g. 0+1+2")
    parser.add_argument("--methods", default="spot@8+spot@20+spiffy@3+spiffy@10")
    parser.add_argument("--unmasking", default="single")
    parser.add_argument("--threshold", type=float, default=0.9, help="the threshold and dynamic policies' tau")
    parser.add_argument("--cross-block", action="store_true", help="let the forward that finishes a block take the next block's first step")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_target(args.target, args.block, args.device)
    prompts = [encode_prompt(target, p, chat=True) for p in prompts_for(args.task, args.prompts)]
    config = DecodeConfig(policy=args.unmasking, threshold=args.threshold, block_length=args.block, gen_length=args.gen,
                          sampling=Sampling(temperature=args.temperature), cross_block=args.cross_block)
    specs = parse_methods(args.methods, "")
    generate(target, prompts[0], replace(config, gen_length=args.block))  # warm-up
    seeds = [int(s) for s in args.seeds.split("+")]
    df = pd.concat([run_seed(target, prompts, config, specs, seed) for seed in seeds])
    sums = summarize(df, ["seed"])
    columns = ["seed", "label", "forwards", "seconds", "forward_ratio", "throughput_ratio", "drafter_share", "accepted_mean",
               "mean_tree_size", "lossless", "lossy", "token_divergence"]
    print(sums[columns].to_string(index=False, float_format=lambda x: f"{x:.3f}"), file=sys.stderr)
    methods = {}
    for label, group in sums.groupby("label", sort=False):
        entry = {}
        for column in ("forward_ratio", "throughput_ratio", "tokens_per_forward", "drafter_share", "accepted_mean",
                       "mean_tree_size", "lossless", "token_divergence"):
            values = group[column].tolist()
            entry[column] = {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}
        entry["forwards"] = int(group.forwards.sum())
        entry["lossy"] = bool(group.lossy.any())  # differs from draft-free by design: 1 - lossless is its divergence rate
        methods[label] = entry
    print(json.dumps({
        "bench": "speedup", "target": args.target, "task": args.task, "prompts": len(prompts), "block": args.block,
        "gen": args.gen, "temperature": args.temperature, "seeds": seeds, "unmasking": args.unmasking, "threshold": args.threshold, "cross_block": args.cross_block,
        "device": args.device, "methods": methods,
    }))


if __name__ == "__main__":
    main()
