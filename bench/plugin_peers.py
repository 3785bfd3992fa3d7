"""The example plugin against the lossless rivals: forwards saved by `lookup` (examples/prompt-lookup) beside
FreeDave's chain and SPOT, at the same budgets, on every task, at T = 0 and T = 1.

Single-commit decoding on the embedded target (the policy SPOT's shipped drafter is trained for). Prompts are the
tasks' items from `--offset` on, past the first ten that the conformance check and the tests decode, so that no
method is judged on the prompts it was tried on. Every prompt is decoded draft-free and by every method in one
process, back to back, the order rotating from prompt to prompt; every drafter is built once per temperature by
the harness (spot_eval.harness.methods.build_drafter: the plugin's comes wrapped as a run wraps it), and every
method's tokens are checked against draft-free. Per (task, T, method): forward_ratio, the ratio of sums over the
prompts (draft-free forwards / the method's), and the median over prompts of each prompt's ratio; then per (T,
budget) the three methods' ratios over all tasks together, and which saved most (all of them in a tie). Prints one JSON object.

Needs the example installed: pip install -e examples/prompt-lookup.

Usage: python bench/plugin_peers.py [--prompts 6] [--offset 20] [--gen 128] [--budgets 4+8] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace

import torch
from peers import TASKS
from speedup import prompts_for

from spot import DecodeConfig, Sampling, generate
from spot_eval.checkpoints.shipped import EMBEDDED_TARGET
from spot_eval.checkpoints.target import encode_prompt, load_target
from spot_eval.harness.methods import MethodSpec, build_drafter

METHODS = ("lookup", "freedave", "spot")  # the plugin first, then its rivals
POLICY = "single"
DRAFT_FREE = "draft_free"


def measure(target, prompts: list[list[int]], task: str, temperature: float, budgets: list[int], gen: int) -> list[dict]:
    """One row per method (and draft-free) on one task at one temperature."""
    config = DecodeConfig(policy=POLICY, block_length=target.block_length, gen_length=gen,
                          sampling=Sampling(temperature), seed=1)
    drafters = {f"{name}@{n}": (n, build_drafter(MethodSpec(name, n), target, POLICY)) for n in budgets for name in METHODS}
    labels = list(drafters)
    runs: dict[str, list[tuple[int, bool]]] = {label: [] for label in (DRAFT_FREE, *labels)}
    for i, ids in enumerate(prompts):
        reference = generate(target, ids, config, request=i)
        runs[DRAFT_FREE].append((reference.stats.forwards, True))
        for label in labels[i % len(labels):] + labels[: i % len(labels)]:
            budget, drafter = drafters[label]
            got = generate(target, ids, replace(config, budget=budget), drafter=drafter, request=i)
            runs[label].append((got.stats.forwards, got.token_ids == reference.token_ids))
    free = [f for f, _ in runs[DRAFT_FREE]]
    return [{"task": task, "temperature": temperature, "method": label, "requests": len(got),
             "forwards": sum(f for f, _ in got),
             "forward_ratio": sum(free) / sum(f for f, _ in got),
             "forward_ratio_median": statistics.median(a / b for a, (b, _) in zip(free, got, strict=True)),
             "lossless": sum(ok for _, ok in got) / len(got)}
            for label, got in runs.items()]


def verdicts(rows: list[dict], budgets: list[int]) -> list[dict]:
    """Per (T, budget): each method's forward ratio over every task's prompts together, and which is ahead."""
    out = []
    for temperature in sorted({r["temperature"] for r in rows}):
        here = [r for r in rows if r["temperature"] == temperature]
        free = sum(r["forwards"] for r in here if r["method"] == DRAFT_FREE)
        for n in budgets:
            ratios = {name: free / sum(r["forwards"] for r in here if r["method"] == f"{name}@{n}") for name in METHODS}
            best = max(ratios.values())
            out.append({"temperature": temperature, "budget": n, "forward_ratio": ratios,
                        "lookup_over_freedave": ratios["lookup"] / ratios["freedave"],
                        "ahead": [name for name in METHODS if ratios[name] == best]})  # several where they tie
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=6, help="prompts per task")
    parser.add_argument("--offset", type=int, default=20, help="the first item of each task to use")
    parser.add_argument("--gen", type=int, default=128)
    parser.add_argument("--budgets", default="4+8")
    parser.add_argument("--tasks", default="+".join(TASKS))
    parser.add_argument("--temperatures", default="0+1")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    torch.set_num_threads(args.threads)
    target = load_target(EMBEDDED_TARGET, None, "cpu")
    budgets = [int(b) for b in args.budgets.split("+")]
    rows = []
    for task in args.tasks.split("+"):
        prompts = [encode_prompt(target, p, chat=True) for p in prompts_for(task, args.offset + args.prompts)[args.offset:]]
        for temperature in (float(t) for t in args.temperatures.split("+")):
            rows += measure(target, prompts, f"spot_{task}", temperature, budgets, args.gen)
    print(json.dumps({"bench": "plugin_peers", "policy": POLICY, "gen": args.gen, "offset": args.offset,
                      "prompts_per_task": args.prompts, "lossless": all(r["lossless"] == 1.0 for r in rows),
                      "verdicts": verdicts(rows, budgets), "rows": rows}))


if __name__ == "__main__":
    main()
