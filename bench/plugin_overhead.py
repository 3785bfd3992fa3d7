"""What the plugin path costs a decode: the example plugin's method (examples/prompt-lookup, `lookup`) through the
harness, against the very same Method admitted as a built-in.

A plugin's drafter reaches the engine wrapped (spot_eval.harness.watchdog.Watched: a SIGALRM timer around every
draft, so that a hung plugin stops its method, not the run); a built-in's comes bare. Here both arms build their
drafter with spot_eval.harness.methods.build_drafter, as a run does: `lookup` from its installed package (wrapped),
and a copy of its Method registered under another name with the built-in origin (bare; for this bench only). Each
prompt is decoded by both arms on the embedded target, `--repeats` times, the arm that goes first alternating from
repeat to repeat, and every output is checked equal between the arms. Prints one JSON object: per arm the median
seconds of a decode and of its drafting, and the ratio of the plugin arm's medians to the built-in arm's.

Needs the example installed: pip install -e examples/prompt-lookup.

Usage: python bench/plugin_overhead.py [--prompts 4] [--repeats 5] [--gen 64] [--budget 4] [--threads 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import torch
from speedup import prompts_for

from spot import DecodeConfig, generate
from spot_eval import registry
from spot_eval.checkpoints.shipped import EMBEDDED_TARGET
from spot_eval.checkpoints.target import encode_prompt, load_target
from spot_eval.harness.methods import MethodSpec, build_drafter
from spot_eval.harness.watchdog import Watched

PLUGIN = "lookup"  # the example's method, as its package declares it
AS_BUILT_IN = "lookup_as_built_in"  # its copy, admitted with the built-in origin
TASKS = ("mbpp", "humaneval")  # where a prompt lookup has names to copy


def arms(target, budget: int) -> dict[str, object]:
    """arm -> drafter, each built by the harness: the installed plugin's (wrapped) and the built-in copy's (bare)."""
    plugin = registry.entry(PLUGIN)  # raises, naming the methods here, where the example is not installed
    registry.entries()[AS_BUILT_IN] = registry.Entry(dataclasses.replace(plugin.method, name=AS_BUILT_IN), registry.BUILT_IN)
    drafters = {name: build_drafter(MethodSpec(name, budget), target, "single") for name in (PLUGIN, AS_BUILT_IN)}
    assert isinstance(drafters[PLUGIN], Watched) and not isinstance(drafters[AS_BUILT_IN], Watched)
    return drafters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4, help="prompts, taken in turn from MBPP and HumanEval")
    parser.add_argument("--offset", type=int, default=20, help="the first item of each task to use")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gen", type=int, default=64)
    parser.add_argument("--budget", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    torch.set_num_threads(args.threads)
    target = load_target(EMBEDDED_TARGET, None, "cpu")
    per_task = -(-args.prompts // len(TASKS))
    texts = [t for task in TASKS for t in prompts_for(task, args.offset + per_task)[args.offset:]]
    prompts = [encode_prompt(target, t, chat=True) for t in texts][: args.prompts]
    config = DecodeConfig(block_length=target.block_length, gen_length=args.gen, budget=args.budget)
    drafters = arms(target, args.budget)
    names = list(drafters)
    for name in names:  # warm-up: the first decode pays for allocations neither arm should carry
        generate(target, prompts[0], config, drafter=drafters[name])
    seconds: dict[str, list[float]] = {name: [] for name in names}
    drafting: dict[str, list[float]] = {name: [] for name in names}
    same = True
    for repeat in range(args.repeats):
        order = names if repeat % 2 == 0 else names[::-1]
        for i, ids in enumerate(prompts):
            outputs = []
            for name in order:
                t = time.perf_counter()
                got = generate(target, ids, config, drafter=drafters[name], request=i)
                seconds[name].append(time.perf_counter() - t)
                drafting[name].append(got.stats.drafter_seconds)
                outputs.append(got.token_ids)
            same &= outputs[0] == outputs[1]
    median = {name: statistics.median(seconds[name]) for name in names}
    median_drafting = {name: statistics.median(drafting[name]) for name in names}
    print(json.dumps({
        "bench": "plugin_overhead",
        "device": "cpu",
        "threads": args.threads,
        "method": PLUGIN,
        "budget": args.budget,
        "gen": args.gen,
        "prompts": len(prompts),
        "repeats": args.repeats,
        "decode_s_median": {"plugin": median[PLUGIN], "built_in": median[AS_BUILT_IN]},
        "drafting_s_median": {"plugin": median_drafting[PLUGIN], "built_in": median_drafting[AS_BUILT_IN]},
        "plugin_over_built_in": median[PLUGIN] / median[AS_BUILT_IN],
        "drafting_plugin_over_built_in": median_drafting[PLUGIN] / median_drafting[AS_BUILT_IN],
        "outputs_equal": same,
    }))


if __name__ == "__main__":
    main()
