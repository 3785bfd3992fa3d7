"""Can a drafter refresh its stale tokens? SPOT-R's head (spot.drafters.refresh) re-ranks the stale top-k at a position
from what the drafted path committed since (the tokens at its neighbours), the stale hidden state there and the
staleness Δ, trained on the target's fresh distribution at that position (spot.drafters.refresh_training); measured
on held-out requests, without running the target.

Every drafter here takes a node's token from the last forward's distribution, d + 1 steps stale at depth d
(bench/token_drift.py: at T = 0 the stale top-1 is the token the target writes for 0.83 of commits at Δ = 1 and
0.46 at Δ = 8). A path's node is accepted only when every node above it was right, so a head may read the path's
own commits as if they were the target's: the head below reads, for the position the target commits at step t,

    the stale top-k log-probabilities and ids behind step t - Δ (the candidates it re-ranks),
    the stale hidden state there (projected: the trajectories' --hidden-dims),
    the tokens committed at the positions within 3 of it since step t - Δ (their projected embeddings),
    Δ,

and is trained on the target's recorded distribution behind step t at that position, over the candidates. It ranks
as the target draws: its log-probabilities plus step t's coupled noise at T > 0.

Reported per temperature, on the held-out requests (a quarter, by request; 95% intervals from a bootstrap over blocks):
    top1_stale, top1_refreshed   the share of commits whose token ranks first (the stale top-1; the head's)
    chain_stale, chain_refreshed the engine's walk replayed with the true commit order (a perfect order model) and
                                 the stale or the head's tokens: commits per verify forward at each budget, to set
                                 beside bench/drafter_replay.py's order_oracle_top1 and the engine's ceiling
                                 (budget + 1)

Prints one JSON line (a table on stderr).

Usage: spot-eval collect --out DIR --prompts 256 --temperatures 0,1 --seed 7 --gen-length 128 --hidden-dims 64
       python bench/token_refresh.py --trajectories DIR [--budgets 4+8] [--steps 3000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from spot.drafters.order_examples import RecordedBlock
from spot.drafters.refresh_training import (
    RefreshTrainConfig,
    block_examples,
    concat,
    drawn,
    heldout_split,
    train_refresh,
)


def replay(blocks: list[RecordedBlock], right: dict[tuple[int, int, int], bool], budget: int) -> torch.Tensor:
    """[B, 2] per block (steps, forwards) of the engine's walk along the true commit order (as bench/drafter_replay.py's
    order_oracle_top1): at root s the node committing step s + a - 1 is Δ = a stale, accepted while it is `right`."""
    out = []
    for index, b in enumerate(blocks):
        n_steps, s, steps, forwards = b.states.shape[0] - 1, 0, 0, 0
        while s < n_steps:
            accepted = 1
            if s > 0:
                while accepted <= budget and s + accepted <= n_steps - 1 and right.get((index, s + accepted - 1, accepted), False):
                    accepted += 1
            s, steps, forwards = s + accepted, steps + accepted, forwards + 1
        out.append((steps, forwards))
    return torch.tensor(out, dtype=torch.float64)


def interval(per_block: torch.Tensor, resamples: int, seed: int = 0) -> tuple[float, float, float]:
    """(ratio of sums, 2.5th, 97.5th percentile) of per-block [B, 2] (numerator, denominator) over a bootstrap of blocks."""
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(per_block), (resamples, len(per_block)), generator=g)
    sums = per_block[picks].sum(1)  # [R, 2]
    low, high = torch.quantile(sums[:, 0] / sums[:, 1], torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    total = per_block.sum(0)
    return float(total[0] / total[1]), low, high


def main() -> None:
    from spot_eval.training.trajectories import read_blocks, read_projections

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", required=True, help="a directory `spot-eval collect --hidden-dims` wrote")
    parser.add_argument("--budgets", default="4+8")
    parser.add_argument("--steps", type=int, default=3000, help="training steps")
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    started = time.perf_counter()
    blocks = read_blocks(args.trajectories, policy="single")
    projections = read_projections(args.trajectories)
    config = RefreshTrainConfig(seed=args.seed, steps=args.steps)
    per_block = [block_examples(b, config.head.max_staleness) for b in blocks]
    head, report = train_refresh(concat([e for e in per_block if e is not None]), projections["token_coords"], config)
    held = heldout_split(torch.tensor([b.request for b in blocks]), config.heldout_fraction, config.seed).tolist()
    right: dict[str, dict[tuple[int, int, int], bool]] = {"stale": {}, "refreshed": {}}
    counts: dict[tuple[str, float, int], dict[int, list[float]]] = {}  # (name, T, Δ) -> {held-out block: [hits, commits]}
    with torch.no_grad():
        for index, (b, rows) in enumerate(zip(blocks, per_block, strict=True)):
            if not held[index] or rows is None:
                continue
            committed = rows.token >= 0
            for name, lp in (("stale", rows.inputs.lp), ("refreshed", head(rows.inputs))):
                hits = drawn(lp, rows) == rows.token
                for t, delta, hit in zip(rows.step[committed].tolist(), rows.inputs.staleness[committed].tolist(),
                                         hits[committed].tolist(), strict=True):
                    right[name][(index, t, delta)] = hit
                    tally = counts.setdefault((name, b.temperature, delta), {}).setdefault(index, [0.0, 0.0])
                    tally[0], tally[1] = tally[0] + hit, tally[1] + 1
    out = []
    for temperature in sorted({b.temperature for b in blocks}):
        mine = [i for i, b in enumerate(blocks) if held[i] and b.temperature == temperature]
        row = {"temperature": temperature, "blocks": len(mine)}
        for delta in range(1, config.head.max_staleness + 1):
            for name in right:
                if tallies := counts.get((name, temperature, delta)):
                    row[f"top1_{name}_delta{delta}"] = interval(torch.tensor(list(tallies.values()), dtype=torch.float64),
                                                                args.resamples)
        for budget in map(int, args.budgets.split("+")):
            for name, lookup in right.items():
                row[f"chain_{name}_budget{budget}"] = interval(replay(blocks, lookup, budget)[mine], args.resamples)
        out.append(row)
        print(f"T = {temperature:g}, {len(mine)} held-out blocks:", file=sys.stderr)
        for key, value in row.items():
            if isinstance(value, tuple):
                print(f"  {key} {value[0]:.3f} [{value[1]:.3f}, {value[2]:.3f}]", file=sys.stderr)
    print(json.dumps({"bench": "token_refresh", "trajectories": args.trajectories, "examples": report["examples"],
                      "held_out_requests": sum(1 for r in {b.request: h for b, h in zip(blocks, held, strict=True)}.values() if r),
                      "seconds": round(time.perf_counter() - started, 1), "results": out}))


if __name__ == "__main__":
    main()
