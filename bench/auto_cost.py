"""What budget=auto weighs on this machine: the verify-cost curve c(P, L), the drafter's seconds per
tree (the order-model call alone, and whole trees of budget 1, 8 and 20 in each mode: the order
model's and the stale-confidence order's), the reach calibrations of the shipped drafter, and the
mode and tree size the rule picks at the drafter's mean reach.

With --trajectories (draft-free trajectories of the target, `spot-eval collect`), it also bounds what
any sizing could give here: SPOT's budget-20 walk is replayed over the recorded blocks, and each
forward is costed with this machine's c(P, L) and drafter time (per mode: the walk differs) as a sizing that knew the outcome
would have chosen it: `perfect_set` verifies exactly the nodes the walk reaches (no draft at all when
it reaches none), `perfect_prefix` the shortest best-first prefix holding them. The ratios are
seconds of draft-free decoding over those seconds, for the same steps.

Prints one JSON line (a table on stderr).

Usage: python bench/auto_cost.py [--block 32] [--threads 2] [--device cuda --dtype bfloat16 --exact] [--remeasure]
           [--trajectories DIR [--max-blocks 200]]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from spot import DecodeConfig
from spot.cost import measure_drafter, probe_prefix
from spot.drafters.order_model import features, predict
from spot.drafters.reach import replay
from spot.policy import topk_logprobs
from spot.sizing import DraftMode, Sizing
from spot_eval.checkpoints.shipped import EMBEDDED_TARGET
from spot_eval.checkpoints.target import load_target
from spot_eval.harness.methods import MethodSpec, build_drafter
from spot_eval.harness.profile import verify_profile
from spot_eval.training.trajectories import read_blocks


def order_model_seconds(drafter, target, repeats: int = 20) -> float:
    """The median seconds of the order model's forward alone on one root (what a tree costs at least)."""
    k = target.block_length
    target.start(probe_prefix(target, k))
    root = torch.full((k,), target.mask_id, dtype=torch.long)
    stale = target.verify(root[None], k)[0]  # [K, V]
    lp, ids = topk_logprobs(stale, drafter.model.config.topk, target.mask_id)
    device = next(drafter.model.parameters()).device
    lp, ids = lp.to(device), ids.to(device)
    masked = torch.ones(1, k, dtype=torch.bool, device=device)
    feats, buckets = features(lp[None], ids[None], predict(lp[None], ids[None], 0.0, None), masked,
                              torch.zeros_like(masked), torch.zeros_like(masked), None, drafter.model.config.buckets)
    times = []
    with torch.inference_mode():
        for _ in range(repeats + 1):
            t = time.perf_counter()
            drafter.model(feats, buckets, masked)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t)
    return statistics.median(times[1:])


def perfect_sizing(trees, verify, drafter_seconds) -> dict:
    """Throughput over draft-free of sizings that know which nodes the walk reaches (module docstring).
    trees: the replay's items (None: a block's first step, one draft-free forward)."""
    draft_free = perfect_set = perfect_prefix = 0.0
    for tree in trees:
        context = 0 if tree is None else tree.context
        one = verify(1, context)
        if tree is None:
            draft_free, perfect_set, perfect_prefix = draft_free + one, perfect_set + one, perfect_prefix + one
            continue
        draft_free += one * tree.steps  # draft-free takes each of these steps in a forward of its own
        reached = [i for i, r in enumerate(tree.reached) if r]
        perfect_set += verify(len(reached) + 1, context) + drafter_seconds(len(reached)) if reached else one
        perfect_prefix += verify(reached[-1] + 2, context) + drafter_seconds(reached[-1] + 1) if reached else one
    return {"perfect_set": draft_free / perfect_set, "perfect_prefix": draft_free / perfect_prefix}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(EMBEDDED_TARGET))
    parser.add_argument("--block", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--exact", action="store_true", help="the per-piece verify layout")
    parser.add_argument("--remeasure", action="store_true", help="measure c(P, L) again (else the cached profile)")
    parser.add_argument("--trajectories", default=None, help="recorded draft-free blocks for the perfect-sizing bound")
    parser.add_argument("--max-blocks", type=int, default=200)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_target(args.target, args.block, args.device, args.exact, getattr(torch, args.dtype))
    profile = verify_profile(target, remeasure=args.remeasure)
    drafter = build_drafter(MethodSpec("spot", 20, auto=True), target, "single")
    modes = tuple(DraftMode(name, tuple((b, measure_drafter(drafter, target, DecodeConfig(block_length=args.block, budget=b), name))
                                        for b in (1, 8, 20)), mean_reach) for name, mean_reach in drafter.modes.items())
    verify = profile.verify
    sizing = Sizing(verify, modes)
    rows = []
    for context in verify.contexts:
        c1 = verify(1, context)
        plan = sizing.plan(context, 20)
        rows.append({"context": context, **{f"c({p})/c(1)": verify(p, context) / c1 for p in verify.pieces},
                     "c(1) ms": 1e3 * c1,
                     "size at mean reach, drafter time spent": sizing.size(drafter.reach.mean_reach, context),
                     "tree drafted": f"{plan.nodes} ({plan.mode})"})
    bound = None
    if args.trajectories:
        blocks = read_blocks(args.trajectories, policy="single")[: args.max_blocks]
        bound = {m.name: perfect_sizing(list(replay(drafter.grow, blocks, 20, m.name)), verify, m.drafter_seconds) for m in modes}
        print(f"perfect sizing over draft-free: {bound}", file=sys.stderr)
    for row in rows:
        print("  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), file=sys.stderr)
    print(json.dumps({
        "bench": "auto_cost", "target": args.target, "block": args.block, "device": args.device, "dtype": args.dtype,
        "exact": args.exact, "threads": torch.get_num_threads(),
        "profile": profile.to_dict(), "curve": rows,
        "order_model_ms": 1e3 * order_model_seconds(drafter, target), "perfect_sizing": bound,
        "tree_ms": {m.name: {str(b): 1e3 * s for b, s in m.seconds} for m in modes},
        "reach": {name: {"ranks": r.ranks, "error": r.error, "mean_reach": r.mean_reach[:20], "bins": [b.__dict__ for b in r.bins]}
                  for name, r in (("model", drafter.reach), ("stale", drafter.stale.reach))},
    }))


if __name__ == "__main__":
    main()
