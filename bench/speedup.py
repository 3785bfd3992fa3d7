"""Target-forward reduction and wall-clock throughput of each method against draft-free decoding.

Every prompt is decoded draft-free and by every method in one process, interleaved per prompt
(the order rotates from prompt to prompt so that drift in machine state spreads evenly). Ratios
are of sums over the same prompts: forwards(draft-free) / forwards(method) and seconds(draft-free)
/ seconds(method). Each method's tokens are checked against draft-free (lossless must be 1.0), except a
lossy method's (`sets_max@8`: max-commit, opt-in), which differ by design: for it 1 - lossless is the
fraction of prompts whose output differs, and token_divergence the fraction of output positions.
Under a set policy (`--unmasking threshold`) every prompt is also decoded by standard decoding (the
single policy, draft-free) in the same rotation, and standard_forward_ratio / standard_throughput_ratio
are each method's ratios against it, as the SPOT paper reports SPOT-Sets against standard decoding.
`--sets-model-depths 1+all` runs each sets method once per number of tree levels its predictor scores
(deeper nodes reuse their parent's set probabilities; spot.drafters.sets): what re-scoring buys.
With several seeds the JSON gives mean, std and median over seeds. `spot@auto` sizes every tree by this
machine's verify-cost profile (measured once, cached; spot_eval.harness.profile), refitted to the
timings decoding measures after every prompt as `lm_eval --model spot` does, and the mean tree
size (draft nodes per verify forward) is reported for every method. Prints one JSON line (a table
on stderr).

Usage: python bench/speedup.py --prompts 50 [--first 0] --block 32 --gen 256 --temperature 0 --seeds 0
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
from spot.drafters.sets import SetsDrafter
from spot_eval.checkpoints.shipped import EMBEDDED_TARGET
from spot_eval.checkpoints.target import encode_prompt, load_target
from spot_eval.data.datasets import load, mbpp_split
from spot_eval.harness.lossless import token_divergence
from spot_eval.harness.methods import build_drafter, parse_methods
from spot_eval.harness.profile import Refitted, auto_sizing, verify_profile
from spot_eval.reports.results import summarize

STANDARD = "standard"  # the anchor's label: draft-free decoding under the single policy (one commit per forward)
PROMPT_FIELDS = {"gsm8k_test": "question", "math500_test": "problem", "humaneval_test": "prompt"}


def prompts_for(task: str, n: int, first: int = 0) -> list[str]:
    """The test items first .. first + n - 1 of a task, as its prompt states them."""
    if task == "mbpp":  # the problem and its tests, as the spot_mbpp task states them
        return ["\n".join([row["text"], *row["test_list"][:3]]) for row in mbpp_split("test")[first : first + n]]
    name = f"{task}_test"
    return [row[PROMPT_FIELDS[name]] for row in load(name)[first : first + n]]


def build_drafters(target, config: DecodeConfig, specs, sets_model_depths: list[int | None]) -> dict:
    """label -> (spec, drafter); a sets spec once per model depth (labelled `sets@8/d1`, `sets@8/dall`) when
    `sets_model_depths` holds more than the default (every level scored)."""
    drafters = {}
    for spec in specs:
        drafter = build_drafter(spec, target, config.policy, threshold=config.threshold)
        if isinstance(drafter, SetsDrafter) and sets_model_depths != [None]:
            for depth in sets_model_depths:
                drafters[f"{spec.label}/d{depth or 'all'}"] = spec, SetsDrafter(drafter.predictor, drafter.name, depth)
        else:
            drafters[spec.label] = spec, drafter
    return drafters


def run_seed(target, prompts: list[list[int]], config: DecodeConfig, specs, seed: int, anchor: bool,
             sets_model_depths: list[int | None]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The methods' rows, and the standard-decoding anchor's (`anchor`: the single policy, draft-free)."""
    config = replace(config, seed=seed)
    entries = build_drafters(target, config, specs, sets_model_depths)
    drafters = {label: drafter for label, (_, drafter) in entries.items()}
    profile = verify_profile(target) if any(s.auto for s in specs) else None
    sizings = {label: Refitted(auto_sizing(target, drafter, spec.config(config), profile))
               for label, (spec, drafter) in entries.items() if spec.auto}  # refitted after every prompt, as lm_eval runs it
    lossy = {label for label, (spec, _) in entries.items() if spec.lossy}
    rows, anchor_rows = [], []
    for i, ids in enumerate(prompts):
        labels = ["draft_free", *drafters, *([STANDARD] if anchor else [])]
        labels = labels[i % len(labels) :] + labels[: i % len(labels)]
        results = {}
        for label in labels:
            if label == STANDARD:
                g = generate(target, ids, replace(config, policy="single"), request=i)
                anchor_rows.append({"seed": seed, "doc_id": i, "forwards": g.stats.forwards, "seconds": g.stats.seconds})
                continue
            cfg = config if label == "draft_free" else entries[label][0].config(config)
            auto = sizings.get(label)
            results[label] = generate(target, ids, cfg, drafter=drafters.get(label), request=i, sizing=auto and auto.sizing)
            if auto:
                auto.observe(results[label].stats)
        for label, g in results.items():
            s, reference = g.stats, results["draft_free"].token_ids
            rows.append({
                "seed": seed, "doc_id": i, "label": label, "tokens": len(g.token_ids), "forwards": s.forwards, "steps": s.steps,
                "seconds": s.seconds, "drafter_seconds": s.drafter_seconds, "target_seconds": s.target_seconds,
                "accepted_lengths": s.accepted_lengths, "draft_nodes": s.draft_nodes,
                "lossless": g.token_ids == reference, "token_divergence": token_divergence(g.token_ids, reference),
                "lossy": label in lossy,
            })
    return pd.DataFrame(rows), pd.DataFrame(anchor_rows, columns=["seed", "doc_id", "forwards", "seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(EMBEDDED_TARGET))
    parser.add_argument("--task", default="gsm8k", choices=["gsm8k", "math500", "humaneval", "mbpp"])
    parser.add_argument("--prompts", type=int, default=50)
    parser.add_argument("--first", type=int, default=0, help="the first test item decoded (items first .. first + prompts - 1)")
    parser.add_argument("--block", type=int, default=32)
    parser.add_argument("--gen", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seeds", default="0", help="e.g. 0+1+2")
    parser.add_argument("--methods", default="spot@8+spot@20+spiffy@3+spiffy@10")
    parser.add_argument("--unmasking", default="single")
    parser.add_argument("--threshold", type=float, default=0.9, help="the threshold and dynamic policies' tau")
    parser.add_argument("--sets-model-depths", default="all",
                        help="tree levels the set drafter scores, e.g. 1+2+all: each sets method once per depth (what re-scoring buys)")
    parser.add_argument("--cross-block", action="store_true", help="let the forward that finishes a block take the next block's first step")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_target(args.target, args.block, args.device)
    prompts = [encode_prompt(target, p, chat=True) for p in prompts_for(args.task, args.prompts, args.first)]
    config = DecodeConfig(policy=args.unmasking, threshold=args.threshold, block_length=args.block, gen_length=args.gen,
                          sampling=Sampling(temperature=args.temperature), cross_block=args.cross_block)
    specs = parse_methods(args.methods, "")
    generate(target, prompts[0], replace(config, gen_length=args.block))  # warm-up
    seeds = [int(s) for s in args.seeds.split("+")]
    anchor = args.unmasking != "single"  # under single, draft-free decoding is the standard decoder itself
    depths = [None if d == "all" else int(d) for d in args.sets_model_depths.split("+")]
    runs = [run_seed(target, prompts, config, specs, seed, anchor, depths) for seed in seeds]
    sums = summarize(pd.concat([rows for rows, _ in runs]), ["seed"])
    if anchor:  # ratios against standard decoding: its sums over the same prompts / the method's
        standard = pd.concat([a for _, a in runs]).groupby("seed")[["forwards", "seconds"]].sum()
        sums["standard_forward_ratio"] = standard["forwards"].reindex(sums["seed"]).to_numpy() / sums["forwards"]
        sums["standard_throughput_ratio"] = standard["seconds"].reindex(sums["seed"]).to_numpy() / sums["seconds"]
    columns = ["seed", "label", "forwards", "seconds", "forward_ratio", "throughput_ratio", "drafter_share", "accepted_mean",
               "mean_tree_size", "lossless", "lossy", "token_divergence"]
    ratios = ("forward_ratio", "throughput_ratio", "tokens_per_forward", "drafter_share", "accepted_mean", "mean_tree_size",
              "lossless", "token_divergence")
    if anchor:
        columns += ["standard_forward_ratio", "standard_throughput_ratio"]
        ratios += ("standard_forward_ratio", "standard_throughput_ratio")
    print(sums[columns].to_string(index=False, float_format=lambda x: f"{x:.3f}"), file=sys.stderr)
    methods = {}
    for label, group in sums.groupby("label", sort=False):
        entry = {}
        for column in ratios:
            values = group[column].tolist()
            entry[column] = {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                             "median": statistics.median(values)}
        entry["forwards"] = int(group.forwards.sum())
        entry["lossy"] = bool(group.lossy.any())  # differs from draft-free by design: 1 - lossless is its divergence rate
        methods[label] = entry
    print(json.dumps({
        "bench": "speedup", "target": args.target, "task": args.task, "prompts": len(prompts), "first": args.first, "block": args.block,
        "gen": args.gen, "temperature": args.temperature, "seeds": seeds, "unmasking": args.unmasking, "threshold": args.threshold, "cross_block": args.cross_block,
        "device": args.device, "methods": methods,
        **({"standard": {"forwards": int(standard["forwards"].sum()), "seconds": float(standard["seconds"].sum())}} if anchor else {}),
    }))


if __name__ == "__main__":
    main()
