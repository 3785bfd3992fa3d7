"""SPOT-RC's order temperature: forwards saved at each τ, on training prompts (so the choice is not made on the
items the comparison reports).

SPOT-RC (methods=spot_rc, spot.drafters.spot with SPOT-R's tokens in mode "stale") orders each node's positions by
c_p^(1/τ), c_p the refreshed confidence there. `spot-eval train-refresh` chooses τ by replaying SPOT-RC's trees over
the held-out requests' recorded blocks (spot.drafters.stale.fit_by_trees) unless --order-temperature is given; this
measures the choice in the decoder itself: it decodes GSM8K training prompts draft-free and with the SPOT-R file
at each τ (the head and the tree otherwise unchanged), checks every decode against draft-free, and prints one JSON
line per (T, budget, τ): the forward ratio over the prompts (sums over requests, as the reports count it).

Usage: python bench/order_temperature.py [--drafter spot_r_b32.pt] [--prompts 6] [--first 2000] [--budgets 2+8]
           [--temperatures 0+1] [--taus 0.01+0.03+0.1+0.4] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import torch

from spot import DecodeConfig, Sampling, generate
from spot.drafters.stale import StaleOrder
from spot_eval.checkpoints.shipped import EMBEDDED_TARGET, shipped_drafter
from spot_eval.checkpoints.target import encode_prompt, load_target
from spot_eval.data.datasets import load
from spot_eval.harness.methods import MethodSpec, build_drafter


def main() -> None:
    numbers = lambda kind: lambda text: [kind(v) for v in text.split("+")]  # noqa: E731
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafter", default=None, help="a SPOT-R file (default: the shipped one)")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--first", type=int, default=2000, help="the first GSM8K training item")
    parser.add_argument("--budgets", type=numbers(int), default=[2, 8])
    parser.add_argument("--temperatures", type=numbers(float), default=[0.0, 1.0])
    parser.add_argument("--taus", type=numbers(float), default=[0.01, 0.03, 0.1, 0.4])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target(str(EMBEDDED_TARGET), None)
    path = args.drafter or str(shipped_drafter("spot_r", target.block_length))
    drafter = build_drafter(MethodSpec("spot_rc", max(args.budgets), path), target, "single")
    inner = getattr(drafter, "drafter", drafter)  # the harness may wrap it (a draft watchdog)
    rows = load("gsm8k_train")[args.first:args.first + args.prompts]
    prompts = [encode_prompt(target, row["question"], chat=True) for row in rows]
    for temperature in args.temperatures:
        config = DecodeConfig(policy="single", block_length=target.block_length, gen_length=128,
                              sampling=Sampling(temperature), seed=1)
        free, forwards = 0, {(b, t): 0 for b in args.budgets for t in args.taus}
        for request, ids in enumerate(prompts):
            reference = generate(target, ids, config, request=request)
            free += reference.stats.forwards
            for budget, tau in forwards:
                inner.stale = StaleOrder(tau)
                got = generate(target, ids, replace(config, budget=budget), drafter=drafter, request=request)
                if got.token_ids != reference.token_ids:
                    raise SystemExit(f"SPOT-RC at tau {tau}, budget {budget} diverged from draft-free on prompt {request}")
                forwards[budget, tau] += got.stats.forwards
        for (budget, tau), n in forwards.items():
            print(json.dumps({"temperature": temperature, "budget": budget, "tau": tau, "prompts": len(prompts),
                              "forward_ratio": round(free / n, 3)}), flush=True)


if __name__ == "__main__":
    main()
