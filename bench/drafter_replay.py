"""SPOT's commits per verify forward on held-out trajectories, without running the target.

Replays the engine's walk over the recorded draft-free blocks the drafter's training held out
(`spot.drafters.reach.replay`: grow the tree from step s - 1's stale distribution, accept the true
future states found in it plus the free step), for each budget and each `model_depth` (order-model
calls per tree level), with the drafting seconds. Three bounds put the numbers in context:

  order_oracle_top1   a chain along the target's true commit order whose tokens are what the
                      stale distribution predicts there (the top-1 under the step's noise, as the
                      drafter draws them): acceptance with a perfect order model and no token
                      branching. It shows how far the stale tokens alone carry a tree. On threshold
                      trajectories (a drafter trained with --policy threshold) each step is the
                      target's committed set: SPOT-Sets' bound with perfect set prediction.
  order_oracle_tree   a tree of the same size with the true order that also branches on the stale top-k tokens,
                      scored by each depth's calibrated rank shares (measured on the same blocks): an estimate of the ceiling
                      of trees whose tokens come from the stale distribution, whatever their order model
                      (single-commit steps: a step that commits a set ends the tree there).
  budget_plus_one     the engine's ceiling, reached by the true-future oracle drafter (tests).

Prints one JSON line (a table on stderr).

Usage: python bench/drafter_replay.py --drafter spot_eval/assets/drafters/spot_b32.pt
           --trajectories DIR [--budgets 8+20] [--model-depths 1+2+all] [--max-blocks 100] [--all-blocks]
"""

from __future__ import annotations

import argparse
import heapq
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


def true_ranks(block: RecordedBlock, s: int, depths: int) -> list[int]:
    """From root step s: for each following single-commit step s + j (j < depths, stopping at a set step or the
    block's last step), the 0-based rank of the token the target commits there among the stale top-k behind step
    s - 1, ranked as the target draws at step s + j; -1 where the token is not in the top-k."""
    positions, ranks = block.committed_positions(), []
    k = block.topk_ids.shape[-1]
    for step in range(s, min(s + depths, block.states.shape[0] - 2)):
        p = int(positions[step])
        if p < 0:
            break
        rank = block.token_rank(s - 1, step, p)
        ranks.append(rank if rank < k else -1)
    return ranks


def order_oracle_tree(blocks: list[RecordedBlock], budget: int) -> float:
    """Commits per forward of the walk over a tree of `budget` nodes that knows the target's true order (each
    depth's position is the one the target commits at that step) and branches on the stale top-k tokens there,
    ranked as the target draws at that step: the `budget` token sequences of the highest calibrated probability,
    each depth's rank scored by how often the target's token holds that rank at that depth in these same blocks
    (so in-sample: an upper estimate). The walk accepts the longest prefix of the true tokens the tree holds.
    The ceiling of trees whose tokens come from the stale distribution, whatever their order model."""
    roots = {(i, s): true_ranks(block, s, budget) for i, block in enumerate(blocks) for s in range(1, block.states.shape[0] - 1)}
    k = blocks[0].topk_ids.shape[-1] if blocks else 1
    counts = torch.ones(budget, k)  # [depth, rank], add-one so that every rank stays possible
    for ranks in roots.values():
        for depth, rank in enumerate(ranks):
            if rank >= 0:
                counts[depth, rank] += 1
    scores = (counts / counts.sum(-1, keepdim=True)).log().tolist()  # [depth][rank]
    steps = forwards = 0
    for i, block in enumerate(blocks):
        n_steps, s = block.states.shape[0] - 1, 0
        while s < n_steps:
            accepted = 1
            if s > 0:
                truth = roots[(i, s)]
                kept, frontier = set(), [(-v, (r,)) for r, v in enumerate(scores[0])] if truth else []
                heapq.heapify(frontier)
                while frontier and len(kept) < budget:
                    cost, path = heapq.heappop(frontier)
                    kept.add(path)
                    if len(path) < len(truth):
                        for r, v in enumerate(scores[len(path)]):
                            heapq.heappush(frontier, (cost - v, (*path, r)))
                while accepted - 1 < len(truth) and tuple(truth[:accepted]) in kept:
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
    parser.add_argument("--all-blocks", action="store_true",
                        help="every block of the trajectories (ones the drafter was not trained on), not its held-out split")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    checkpoint = load_checkpoint(args.drafter)
    heldout = heldout_blocks(checkpoint, args.trajectories, every=args.all_blocks)[: args.max_blocks]
    rows = []
    for budget in (int(b) for b in args.budgets.split("+")):
        for temperature in sorted({b.temperature for b in heldout}):
            subset = [b for b in heldout if b.temperature == temperature]
            row = {"budget": budget, "temperature": temperature, "blocks": len(subset),
                   "order_oracle_top1": order_oracle_top1(subset, budget), "order_oracle_tree": order_oracle_tree(subset, budget),
                   "budget_plus_one": budget + 1}
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
