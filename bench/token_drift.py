"""How fast stale tokens go stale: the share of the target's commits whose token a distribution recorded
Δ steps earlier already draws, on recorded draft-free blocks, without running the target.

Every drafter that takes its tokens from the last forward's logits (FreeDave's chain, SPOT's tree, the lookup
plugin) drafts the node at depth d with logits d + 1 steps stale: the target has committed d + 1 positions since.
At step t the target commits position p_t with token v_t (the free step, Δ = 0, by definition). For Δ = 1 .. N
this counts, over every step t > Δ - 1 of every block, where v_t ranks under the distribution recorded behind
step t - Δ, ranked as the target draws at step t (by logits at T = 0; by logits / T + step t's coupled noise at
T > 0), among that distribution's recorded top-k:

    top1, top2, top4    the share with v_t at rank 1, within 2, within 4 (what token branching can reach)
    top1_adjacent       top1 where p_t neighbours the position committed at step t - 1 (the context that
    top1_far            changed most) and where it does not
    chain_bound         1 + sum_j prod_{Δ <= j} top1(Δ), j = 1 .. N: commits per verify forward of a chain with
                        the true order and stale top-1 tokens, if the depths were independent (compare with
                        bench/drafter_replay.py's order_oracle_top1, the same chain replayed)

Each share comes with its 95% interval from a bootstrap over blocks (`--resamples`; *_low, *_high in the JSON).
Under a set policy a step that commits several positions counts each of them.

Prints one JSON line (a table on stderr).

Usage: python bench/token_drift.py --trajectories DIR [DIR ...] [--policy single] [--staleness 8] [--max-blocks 1000]
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from spot.drafters.order_examples import RecordedBlock


def committed_ranks(block: RecordedBlock, step: int, staleness: int) -> list[tuple[int, int]]:
    """(position, rank) of each position step `step` commits, its token's rank under the distribution recorded
    behind step `step - staleness` (RecordedBlock.token_rank)."""
    changed = (block.states[step + 1] != block.states[step]).nonzero().flatten().tolist()
    return [(p, block.token_rank(step - staleness, step, p)) for p in changed]


FIELDS = ("commits", "top1", "top2", "top4", "adjacent", "top1_adjacent")


def block_counts(block: RecordedBlock, max_staleness: int) -> torch.Tensor:
    """[max_staleness, len(FIELDS)] one block's counts: row Δ - 1 over the commits of its steps t >= Δ."""
    counts = torch.zeros(max_staleness, len(FIELDS), dtype=torch.long)
    steps = block.states.shape[0] - 1
    committed = [(block.states[t + 1] != block.states[t]).nonzero().flatten().tolist() for t in range(steps)]
    for t in range(1, steps):
        for staleness in range(1, min(max_staleness, t) + 1):
            for p, rank in committed_ranks(block, t, staleness):
                adjacent = any(abs(p - q) == 1 for q in committed[t - 1])
                counts[staleness - 1] += torch.tensor([1, rank == 0, rank < 2, rank < 4, adjacent, adjacent and rank == 0])
    return counts


def shares(counts: torch.Tensor) -> dict[str, torch.Tensor]:
    """The shares and the chain bound of summed counts [..., Δ, len(FIELDS)] (each [..., Δ])."""
    c = dict(zip(FIELDS, counts.double().unbind(-1), strict=True))
    top1 = c["top1"] / c["commits"]
    far = c["commits"] - c["adjacent"]
    return {"top1": top1, "top2": c["top2"] / c["commits"], "top4": c["top4"] / c["commits"],
            "top1_adjacent": c["top1_adjacent"] / c["adjacent"], "top1_far": (c["top1"] - c["top1_adjacent"]) / far,
            "chain_bound": 1 + top1.cumprod(-1).cumsum(-1)}


def drift(blocks: list[RecordedBlock], max_staleness: int, resamples: int = 0, seed: int = 0) -> list[dict]:
    """One row per (temperature, Δ): the shares above over every block's steps; with `resamples`, each share's 95%
    interval from a bootstrap over blocks (a block's steps share a prompt, so blocks are the units)."""
    rows = []
    for temperature in sorted({b.temperature for b in blocks}):
        per_block = torch.stack([block_counts(b, max_staleness) for b in blocks if b.temperature == temperature])  # [B, Δ, F]
        total = per_block.sum(0)
        point = shares(total)
        spread = None
        if resamples:
            g = torch.Generator().manual_seed(seed)
            picks = torch.randint(len(per_block), (resamples, len(per_block)), generator=g)  # [R, B]
            drawn = shares(per_block[picks].sum(1))  # [R, Δ] each
            spread = {k: torch.nanquantile(v, torch.tensor([0.025, 0.975], dtype=v.dtype), dim=0) for k, v in drawn.items()}
        for d in range(max_staleness):
            if total[d, 0] == 0:
                break
            row = {"temperature": temperature, "staleness": d + 1, "blocks": len(per_block), "commits": int(total[d, 0])}
            for name, value in point.items():
                row[name] = None if value[d].isnan() else float(value[d])
                if spread is not None:
                    row[f"{name}_low"], row[f"{name}_high"] = (float(spread[name][0, d]), float(spread[name][1, d]))
            rows.append(row)
    return rows


def main() -> None:
    from spot_eval.training.trajectories import read_blocks

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", nargs="+", required=True, help="directories `spot-eval collect` wrote")
    parser.add_argument("--policy", default="single", help="the policy the trajectories were recorded with")
    parser.add_argument("--staleness", type=int, default=8, help="the largest Δ (a budget-N tree reaches Δ = N)")
    parser.add_argument("--max-blocks", type=int, default=1000)
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples over blocks for the intervals")
    args = parser.parse_args()
    blocks = [b for d in args.trajectories for b in read_blocks(d, policy=args.policy)][: args.max_blocks]
    rows = drift(blocks, args.staleness, args.resamples)
    for row in rows:
        print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items() if not k.endswith(("_low", "_high"))),
              file=sys.stderr)
    print(json.dumps({"bench": "token_drift", "trajectories": args.trajectories, "blocks": len(blocks), "rows": rows}))


if __name__ == "__main__":
    main()
