"""Can a drafter refresh its stale tokens? A small head re-ranks the stale top-k at a position from what the drafted
path committed since (the tokens at its neighbours), the stale hidden state there and the staleness Δ, trained to
match the target's fresh distribution at that position; measured on held-out requests, without running the target.

Every drafter here takes a node's token from the last forward's distribution, d + 1 steps stale at depth d
(bench/token_drift.py: at T = 0 the stale top-1 is the token the target writes for 0.83 of commits at Δ = 1 and
0.46 at Δ = 8). A path's node is accepted only when every node above it was right, so a head may read the path's
own commits as if they were the target's: the head below reads, for the position the target commits at step t,

    the stale top-k log-probabilities and ids behind step t - Δ (the candidates it re-ranks),
    the stale hidden state there (projected: the trajectories' --hidden-dims),
    the tokens committed at the positions within 3 of it since step t - Δ (their projected embeddings),
    Δ,

and is trained (soft cross-entropy) on the target's recorded distribution behind step t at that position, over the
candidates. At T > 0 it ranks as the target draws: its log-probabilities plus step t's coupled noise.

Reported per temperature, on the held-out requests (a quarter, by request; 95% intervals from a bootstrap over blocks):
    top1_stale, top1_refreshed   the share of commits whose token ranks first (the stale top-1; the head's)
    chain_stale, chain_refreshed the engine's walk replayed with the true commit order (a perfect order model) and
                                 the stale or the head's tokens: commits per verify forward at each budget, to set
                                 beside bench/drafter_replay.py's order_oracle_top1 and the engine's ceiling
                                 (budget + 1)

Prints one JSON line (a table on stderr).

Usage: spot-eval collect --out DIR --prompts 64 --temperatures 0,1 --seed 7 --gen-length 128 --hidden-dims 64
       python bench/token_refresh.py --trajectories DIR [--staleness 8] [--budgets 4+8] [--steps 3000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from torch import nn

from spot.drafters.order_examples import RecordedBlock
from spot.drafters.order_model import step_noise_at_topk

OFFSETS = (-3, -2, -1, 1, 2, 3)  # the neighbours whose new tokens the head reads


def examples(blocks: list[RecordedBlock], max_staleness: int) -> dict[str, torch.Tensor]:
    """One row per (block, step t, Δ <= max_staleness, position committed at t): what the head reads and the fresh
    distribution it is trained on. N rows: ids, lp, noise, fresh [N, k]; hidden [N, R]; nb_tok, nb_new [N, 6]."""
    rows = []
    for index, b in enumerate(blocks):
        n_steps, positions = b.states.shape[0] - 1, b.states.shape[1]
        for t in range(1, n_steps):
            for p in (b.states[t + 1] != b.states[t]).nonzero().flatten().tolist():
                fresh_lp, fresh_ids = b.topk_logprobs[t, p].float(), b.topk_ids[t, p].long()  # [k]
                for delta in range(1, min(max_staleness, t) + 1):
                    s = t - delta
                    ids = b.topk_ids[s, p].long()  # [k] the candidates
                    # the fresh log-probability of each candidate (below the fresh top-k's least where it left it)
                    same = ids[:, None] == fresh_ids[None, :]  # [k, k]
                    fresh = torch.where(same.any(1), (same.float() * fresh_lp).sum(1), fresh_lp.min() - 1.0)
                    noise = (step_noise_at_topk(b.seed, b.request, b.block, t, b.topk_ids[s].long())[p].float()
                             if b.temperature > 0 else torch.zeros(len(ids)))
                    near = [p + o for o in OFFSETS]
                    new = [0 <= q < positions and bool(b.states[t, q] != b.states[s, q]) for q in near]
                    rows.append({
                        "block": index, "step": t, "delta": delta, "temperature": b.temperature,
                        "label": int(b.states[t + 1, p]), "ids": ids, "lp": b.topk_logprobs[s, p].float(), "noise": noise,
                        "fresh": fresh, "hidden": b.hidden[s, p].float(),
                        "nb_tok": torch.tensor([int(b.states[t, q]) if n else 0 for q, n in zip(near, new, strict=True)]),
                        "nb_new": torch.tensor(new, dtype=torch.float32),
                    })
    return {k: (torch.stack([r[k] for r in rows]) if isinstance(rows[0][k], torch.Tensor) else torch.tensor([r[k] for r in rows]))
            for k in rows[0]}


class RefreshHead(nn.Module):
    """Candidate scores: a · stale log-probability + rank bias + <candidate's embedding, z>, where z mixes the stale
    hidden state, the neighbours' new tokens (a map per offset) and Δ."""

    def __init__(self, token_coords: torch.Tensor, hidden_dims: int, topk: int, max_staleness: int, width: int = 64):
        super().__init__()
        self.register_buffer("coords", token_coords.float())  # [V, E] the projected token embeddings
        e = token_coords.shape[1]
        self.neighbour = nn.Parameter(torch.zeros(len(OFFSETS), e, e))
        self.delta = nn.Embedding(max_staleness + 1, 8)
        self.mix = nn.Sequential(nn.Linear(hidden_dims + e + 8, width), nn.GELU(), nn.Linear(width, e))
        self.scale = nn.Parameter(torch.ones(()))
        self.rank = nn.Parameter(torch.zeros(topk))

    def forward(self, x: dict[str, torch.Tensor]) -> torch.Tensor:
        """[N, k] log-probability-like scores of the candidates."""
        near = torch.einsum("no,noe,oef->nf", x["nb_new"], self.coords[x["nb_tok"]], self.neighbour)  # [N, E]
        z = self.mix(torch.cat([x["hidden"], near, self.delta(x["delta"])], -1))  # [N, E]
        return self.scale * x["lp"] + torch.einsum("nke,ne->nk", self.coords[x["ids"]], z) + self.rank


def drawn(scores: torch.Tensor, x: dict[str, torch.Tensor]) -> torch.Tensor:
    """[N] the token each row's scores rank first, as the target draws (with the step's noise at T > 0)."""
    hot = (x["temperature"] > 0)[:, None]
    return x["ids"].gather(1, torch.where(hot, scores + x["noise"], scores).argmax(-1, keepdim=True))[:, 0]


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
    from spot_eval.training.trajectories import read_blocks

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", required=True, help="a directory `spot-eval collect --hidden-dims` wrote")
    parser.add_argument("--staleness", type=int, default=8, help="the largest Δ (a budget-N chain reaches Δ = N)")
    parser.add_argument("--budgets", default="4+8")
    parser.add_argument("--steps", type=int, default=3000, help="training steps of 512 rows")
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    blocks = read_blocks(args.trajectories, policy="single")
    if blocks[0].hidden is None:
        raise SystemExit(f"{args.trajectories} holds no hidden states: collect with --hidden-dims 64")
    coords = torch.load(f"{args.trajectories}/projections.pt", weights_only=True)["token_coords"]
    data = examples(blocks, args.staleness)
    requests = sorted({b.request for b in blocks})
    held = set(torch.tensor(requests)[torch.randperm(len(requests))[: len(requests) // 4]].tolist())
    test = torch.tensor([blocks[i].request in held for i in data["block"].tolist()])
    train = {k: v[~test] for k, v in data.items()}
    head = RefreshHead(coords, data["hidden"].shape[1], data["ids"].shape[1], args.staleness)
    optimizer = torch.optim.Adam(head.parameters(), lr=3e-3)
    for _ in range(args.steps):
        rows = torch.randint(len(train["label"]), (512,))
        batch = {k: v[rows] for k, v in train.items()}
        loss = nn.functional.cross_entropy(head(batch), batch["fresh"].softmax(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    held_rows = {k: v[test] for k, v in data.items()}
    with torch.no_grad():
        right = {"stale": drawn(held_rows["lp"], held_rows) == held_rows["label"],
                 "refreshed": drawn(head(held_rows), held_rows) == held_rows["label"]}
    keys = list(zip(held_rows["block"].tolist(), held_rows["step"].tolist(), held_rows["delta"].tolist(), strict=True))
    out = []
    for temperature in sorted({b.temperature for b in blocks}):
        mine = [i for i, b in enumerate(blocks) if b.request in held and b.temperature == temperature]
        row = {"temperature": temperature, "blocks": len(mine)}
        at_t = held_rows["temperature"] == temperature
        for delta in range(1, args.staleness + 1):
            rows = at_t & (held_rows["delta"] == delta)
            for name, hits in right.items():
                per_block = torch.stack([torch.stack([hits[rows & (held_rows["block"] == i)].sum(), (rows & (held_rows["block"] == i)).sum()])
                                         for i in mine]).double()
                kept = per_block[per_block[:, 1] > 0]
                row[f"top1_{name}_delta{delta}"] = interval(kept, args.resamples)
        for budget in map(int, args.budgets.split("+")):
            for name, hits in right.items():
                lookup = {key: bool(h) for key, h in zip(keys, hits.tolist(), strict=True)}
                per_block = replay(blocks, lookup, budget)[mine]
                row[f"chain_{name}_budget{budget}"] = interval(per_block, args.resamples)
        out.append(row)
        print(f"T = {temperature:g}, {len(mine)} held-out blocks:", file=sys.stderr)
        for key, value in row.items():
            if isinstance(value, tuple):
                print(f"  {key} {value[0]:.3f} [{value[1]:.3f}, {value[2]:.3f}]", file=sys.stderr)
    print(json.dumps({"bench": "token_refresh", "trajectories": args.trajectories, "rows": len(data["label"]),
                      "held_out_requests": len(held), "seconds": round(time.perf_counter() - started, 1), "results": out}))


if __name__ == "__main__":
    main()
