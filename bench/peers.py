"""The lossless rivals side by side: forwards saved at equal pieces per verify, and wall clock, on every task.

SPOT (and SPOT-R, its refreshed-token tree, and SPOT-RC, SPOT-R ordered by its refreshed confidences) against the FreeDave chain under single-commit decoding, and SPOT-Sets (and SPOT-RS, its tree read from refreshed distributions) against FreeDave++ (the chain on
threshold decoding, tau 0.9), each at the same budgets (N drafted states beside the root: N + 1 pieces a verify),
with the oracle drafter (the true future: N + 1 steps a verify) as the ceiling, on the embedded target at T = 0
and T = 1; and Spiffy v4 and v1 at D* = 3 on the same graph. At T = 1 FreeDave's own sampling rule runs too (`freedave_reused`: the last forward's sample reused at
every depth, FreeDave's code; spot.drafters.freedave) beside the coupled-noise chain.

Every prompt is decoded draft-free and by every method in one process, back to back (the order rotating from
prompt to prompt). Per (task, T, policy, method), from the same per-request records and definitions as the reports
(spot_eval.reports.results): forward_ratio and throughput_ratio of sums over the prompts, each with its 95% interval
over the items (forward_low, forward_high, ...), the share of forwards after the answer's first EOS (padding) and
the forward ratio without them, the median over prompts of each prompt's forward ratio, and the drafter's share of
the decodes' wall time, side by side; every method's tokens are checked against draft-free. The items are test items --first .. --first + --prompts - 1 of each
task (by default past the ones the committed comparison decodes). Prints one JSON line per row, then a verdict line per
(T, policy, budget): which of the trained and the training-free drafter saved more forwards, task by task; and one
per (T, policy, method): the tasks where it was faster than draft-free decoding (the median of its seeds).

Usage: python bench/peers.py [--prompts 40] [--first 40] [--gen 128] [--budgets 4+8] [--tasks gsm8k+mbpp] [--temperatures 0+1]
           [--policies single+threshold] [--methods spot+spot_r+spot_rc+sets+sets_r+freedave+oracle] [--threads 1] [--seeds 1+2+3]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import pandas as pd
import torch
from speedup import prompts_for

from spot import DecodeConfig, Sampling, generate
from spot.drafters import OracleDrafter
from spot_eval.checkpoints.shipped import EMBEDDED_TARGET
from spot_eval.checkpoints.target import encode_prompt, load_target
from spot_eval.harness.methods import MethodSpec, build_drafter
from spot_eval.harness.padding import after_eos_forwards
from spot_eval.reports.results import intervals, summarize

TASKS = ("gsm8k", "math500", "humaneval", "mbpp")
TRAINED = {"single": "spot", "threshold": "sets"}  # the trained drafter each policy is measured with
SPIFFY_D = 3  # Spiffy's D*, its paper's default


def methods(target, policy: str, budgets: list[int], temperature: float, only: set[str] | None = None) -> dict[str, tuple[int, object | None]]:
    """label -> (budget, drafter), built once for every prompt; None for the oracle, which reads each prompt's own
    draft-free trajectory. `only`: the method names to keep (None: all)."""
    # Spiffy at its paper's D* = 3: v4's online pruning against v1's calibrated order, on the same graph.
    out = {f"{name}@{SPIFFY_D}": (SPIFFY_D, build_drafter(MethodSpec(name, SPIFFY_D), target, policy)) for name in ("spiffy", "spiffy_v1")}
    for n in budgets:
        out[f"{TRAINED[policy]}@{n}"] = n, build_drafter(MethodSpec(TRAINED[policy], n), target, policy, threshold=0.9)
        out[f"freedave@{n}"] = n, build_drafter(MethodSpec("freedave", n), target, policy)
        if policy == "single":  # SPOT's tree with the chain grafted in (spot.drafters.hybrid), and with refreshed tokens
            out[f"hybrid@{n}"] = n, build_drafter(MethodSpec("hybrid", n), target, policy)
            for name in ("spot_r", "spot_rc"):
                out[f"{name}@{n}"] = n, build_drafter(MethodSpec(name, n), target, policy)
        else:  # SPOT-Sets' tree with refreshed distributions (spot.drafters.refreshed_sets)
            out[f"sets_r@{n}"] = n, build_drafter(MethodSpec("sets_r", n), target, policy, threshold=0.9)
        if temperature > 0:
            out[f"freedave_reused@{n}"] = n, build_drafter(MethodSpec("freedave_reused", n), target, policy)
        out[f"oracle@{n}"] = n, None
    return {label: built for label, built in out.items() if only is None or label.split("@")[0] in only}


def measure(target, prompts: list[list[int]], task: str, policy: str, temperature: float, budgets: list[int], gen: int,
            first: int, only: set[str] | None = None, seed: int = 1) -> list[dict]:
    """One samples row per prompt and method, as a run directory keeps them (spot_eval.reports.results.SAMPLE_FIELDS):
    what `rows` summarises with the reports' own definitions."""
    config = DecodeConfig(policy=policy, threshold=0.9, block_length=target.block_length, gen_length=gen,
                          sampling=Sampling(temperature), seed=seed)
    samples = []
    drafters = methods(target, policy, budgets, temperature, only)
    labels = list(drafters)

    def sample(label: str, budget: int, got, reference) -> dict:
        s = got.stats
        return {"task": task, "doc_id": first + i, "repeat": 0, "temperature": temperature, "policy": policy, "seed": seed,
                "label": label, "budget": budget, "tokens": len(got.token_ids), "forwards": s.forwards, "steps": s.steps,
                "seconds": s.seconds, "drafter_seconds": s.drafter_seconds, "target_seconds": s.target_seconds,
                "accepted_lengths": list(s.accepted_lengths), "draft_nodes": s.draft_nodes, "lossy": False,
                "lossless": got.token_ids == reference.token_ids, "token_divergence": 0.0,
                "after_eos_forwards": after_eos_forwards(got, target.eos_ids, target.mask_id)}

    for i, ids in enumerate(prompts):
        reference = generate(target, ids, config, request=i, record=True)
        samples.append(sample("draft_free", 0, reference, reference))
        for label in labels[i % len(labels):] + labels[: i % len(labels)]:
            budget, drafter = drafters[label]
            drafter = drafter or OracleDrafter(reference.trajectory)
            got = generate(target, ids, replace(config, budget=budget), drafter=drafter, request=i, record=True)
            samples.append(sample(label, budget, got, reference))
    return samples


def rows(samples: pd.DataFrame) -> list[dict]:
    """Per (task, T, policy, method): the reports' ratios of sums (spot_eval.reports.results.summarize), each with its
    95% interval over the items (`intervals`), the share of forwards after the answer's first EOS and the forward
    ratio without them, the median of each prompt's own forward ratio (its forwards the mean over the seeds), and
    the drafter's share of the wall time; with several seeds, the ratios of the sums over every seed, and each seed's
    throughput and forward ratio with their medians over the seeds."""
    keys = ["task", "temperature", "policy"]
    table = summarize(samples, keys).merge(intervals(samples, keys), on=[*keys, "label"], how="left")
    by_seed = summarize(samples, [*keys, "seed"]).set_index([*keys, "label"]).sort_values("seed")
    per = samples.pivot_table(index=[*keys, "doc_id"], columns="label", values="forwards")
    out = []
    for r in table.itertuples():
        mine = per[r.label].groupby(level=[0, 1, 2]).get_group((r.task, r.temperature, r.policy))
        free = per["draft_free"].groupby(level=[0, 1, 2]).get_group((r.task, r.temperature, r.policy))
        out.append({"bench": "peers", "task": r.task, "temperature": r.temperature, "policy": r.policy, "method": r.label,
                    "requests": r.requests, "forward_ratio": r.forward_ratio, "forward_low": r.forward_low,
                    "forward_high": r.forward_high, "forward_ratio_median": float((free / mine).median()),
                    "forward_ratio_to_eos": r.forward_ratio_to_eos, "after_eos_share": r.after_eos_share,
                    "throughput_ratio": r.throughput_ratio, "throughput_low": r.throughput_low,
                    "throughput_high": r.throughput_high, "lossless": r.lossless,
                    "drafter_share": float(r.drafter_share),
                    **_over_seeds(by_seed.loc[[(r.task, r.temperature, r.policy, r.label)]])})
    return out


def _over_seeds(seeds: pd.DataFrame) -> dict:
    """A cell's per-seed rows (summarize's, by seed): the seeds, each one's ratios and their medians (what a
    fixed-budget wall-clock claim is judged by: the median of three seeds)."""
    return {"seeds": seeds.seed.tolist(), "throughput_by_seed": seeds.throughput_ratio.tolist(),
            "throughput_median_over_seeds": float(seeds.throughput_ratio.median()),
            "forward_by_seed": seeds.forward_ratio.tolist(), "forward_median_over_seeds": float(seeds.forward_ratio.median())}


def verdicts(rows: list[dict], budgets: list[int]) -> list[dict]:
    """Per (T, policy, budget): the trained drafter's and the chain's forward ratios per task, and which is ahead."""
    out = []
    for (temperature, policy) in sorted({(r["temperature"], r["policy"]) for r in rows}):
        for n in budgets:
            cell = {(r["task"], r["method"]): r["forward_ratio"] for r in rows
                    if r["temperature"] == temperature and r["policy"] == policy}
            trained, chain = f"{TRAINED[policy]}@{n}", f"freedave@{n}"
            tasks = sorted({task for task, _ in cell})
            out.append({"bench": "peers_verdict", "temperature": temperature, "policy": policy, "budget": n,
                        "trained": trained, "free": chain,
                        "ahead": {t: _ahead(cell[(t, trained)], cell[(t, chain)], trained, chain) for t in tasks},
                        "trained_over_free": {t: cell[(t, trained)] / cell[(t, chain)] for t in tasks},
                        "trained_share_of_bound": {t: (cell[(t, trained)] - 1) / (cell[(t, f'oracle@{n}')] - 1) for t in tasks},
                        "free_share_of_bound": {t: (cell[(t, chain)] - 1) / (cell[(t, f'oracle@{n}')] - 1) for t in tasks}})
    return out


def wall_clock(rows: list[dict]) -> list[dict]:
    """Per (T, policy, method): the tasks where it beat draft-free decoding in wall-clock time by the median of its
    seeds' throughput ratios, and, apart, the tasks where the interval over the items (every seed pooled) lies above 1."""
    out = []
    for key in sorted({(r["temperature"], r["policy"], r["method"]) for r in rows if r["method"] != "draft_free"}):
        mine = [r for r in rows if (r["temperature"], r["policy"], r["method"]) == key]
        out.append({"bench": "peers_wall_clock", "temperature": key[0], "policy": key[1], "method": key[2],
                    "median_over_seeds": {r["task"]: r["throughput_median_over_seeds"] for r in mine},
                    "faster": sorted(r["task"] for r in mine if r["throughput_median_over_seeds"] > 1),
                    "faster_interval_above_1": sorted(r["task"] for r in mine if r["throughput_low"] > 1)})
    return out


def _ahead(trained: float, free: float, trained_label: str, free_label: str) -> str:
    return trained_label if trained > free else free_label if free > trained else "tie"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=40, help="prompts per task")
    parser.add_argument("--first", type=int, default=40,
                        help="the first test item of each task (default 40: past the items the committed comparison decodes)")
    parser.add_argument("--gen", type=int, default=128)
    parser.add_argument("--budgets", default="4+8")
    parser.add_argument("--tasks", default="+".join(TASKS))
    parser.add_argument("--temperatures", default="0+1")
    parser.add_argument("--policies", default="+".join(TRAINED), help="single, threshold or both (+-joined)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seeds", default="1", help="decoding seeds, +-joined (each prompt decoded once per seed; at "
                                                     "T = 0 a seed only repeats the timing)")
    parser.add_argument("--methods", default=None,
                        help="the methods to run, +-joined (e.g. spot+spot_r+freedave+oracle; default: all, and the "
                             "verdict lines need spot or sets, freedave and oracle)")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_target(EMBEDDED_TARGET, None, "cpu")
    budgets = [int(b) for b in args.budgets.split("+")]
    samples = []
    for task in args.tasks.split("+"):
        prompts = [encode_prompt(target, p, chat=True) for p in prompts_for(task, args.prompts, args.first)]
        for temperature in (float(t) for t in args.temperatures.split("+")):
            for policy in args.policies.split("+"):
                for seed in (int(s) for s in args.seeds.split("+")):
                    samples += measure(target, prompts, f"spot_{task}", policy, temperature, budgets, args.gen, args.first,
                                       None if args.methods is None else set(args.methods.split("+")), seed)
    summary = rows(pd.DataFrame(samples))
    for row in summary:
        print(json.dumps(row), flush=True)
    for verdict in verdicts(summary, budgets) + wall_clock(summary):
        print(json.dumps(verdict), flush=True)


if __name__ == "__main__":
    main()
