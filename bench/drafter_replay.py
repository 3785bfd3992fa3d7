"""SPOT's commits per verify forward on held-out trajectories, without running the target.

Replays the engine's walk over the recorded draft-free blocks the drafter's training held out
(`spot.drafters.reach.replay`: grow the tree from step s - 1's stale distribution, accept the true
future states found in it plus the free step), for each budget and each `model_depth` (order-model
calls per tree level), with the drafting seconds. Two bounds put the numbers in context:

  order_oracle_top1   a chain along the target's true commit order whose tokens are what the
                      stale distribution predicts there (the top-1 under the step's noise, as the
                      drafter draws them): acceptance with a perfect order model and no token
                      branching. It shows how far the stale tokens alone carry a tree. On threshold
                      trajectories (a drafter trained with --policy threshold) each step is the
                      target's committed set: SPOT-Sets' bound with perfect set prediction.
  budget_plus_one     the engine's ceiling, reached by the true-future oracle drafter (tests).

Prints one JSON line (a table on stderr).

Usage: python bench/drafter_replay.py --drafter spot_eval/assets/drafters/spot_b32.pt
           --trajectories DIR [--budgets 8+20] [--model-depths 1+2+all] [--max-blocks 100]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from spot.drafters.gamma import replay_commits
from spot.drafters.order_examples import RecordedBlock
from spot.drafters.order_model import predict, step_noise_at_topk
from spot.drafters.spot import SpotDrafter
from spot_eval.checkpoints.drafter import load_checkpoint
from spot_eval.training.fit_gamma import heldout_blocks


def order_oracle_top1(blocks: list[RecordedBlock], budget: int) -> float:
    """Commits per forward of the walk along the target's true commits (each step's one position, or under a
    set policy its whole committed set: perfect set prediction) with the stale-predicted tokens."""
    steps = forwards = 0
    for block in blocks:
        n_steps = block.states.shape[0] - 1
        s = 0
        while s < n_steps:
            accepted = 1
            if s > 0:
                lp, ids = block.topk_logprobs[s - 1].float(), block.topk_ids[s - 1].long()
                while accepted <= budget and s + accepted <= n_steps - 1:
                    step = s + accepted - 1  # the chain's node at depth accepted - 1 commits this step
                    committed = block.states[step + 1] != block.states[step]  # [K] the step's position or set
                    noise = step_noise_at_topk(block.seed, block.request, block.block, step, ids) if block.temperature > 0 else None
                    tokens = predict(lp, ids, block.temperature, noise).tokens[:, 0]  # [K]
                    if not torch.equal(tokens[committed], block.states[step + 1, committed]):
                        break
                    accepted += 1
            s += accepted
            steps += accepted
            forwards += 1
    return steps / max(forwards, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--trajectories", nargs="+", required=True)
    parser.add_argument("--budgets", default="8+20")
    parser.add_argument("--model-depths", default="1+2+all", help="'all' re-scores every tree level")
    parser.add_argument("--max-blocks", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    checkpoint = load_checkpoint(args.drafter)
    heldout = heldout_blocks(checkpoint, args.trajectories)[: args.max_blocks]
    rows = []
    for budget in (int(b) for b in args.budgets.split("+")):
        for temperature in sorted({b.temperature for b in heldout}):
            subset = [b for b in heldout if b.temperature == temperature]
            row = {"budget": budget, "temperature": temperature, "blocks": len(subset),
                   "order_oracle_top1": order_oracle_top1(subset, budget), "budget_plus_one": budget + 1}
            for depth in args.model_depths.split("+"):
                drafter = SpotDrafter(checkpoint.model, model_depth=None if depth == "all" else int(depth))
                t0 = time.perf_counter()
                row[f"spot_depth_{depth}"] = replay_commits(drafter, subset, budget)
                row[f"spot_depth_{depth}_seconds"] = time.perf_counter() - t0
            rows.append(row)
            print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), file=sys.stderr)
    print(json.dumps({"drafter": args.drafter, "heldout_blocks": len(heldout), "rows": rows}))


if __name__ == "__main__":
    main()
