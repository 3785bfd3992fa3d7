"""Does a state's verdict depend on the verify forward it sits in? Pieces of a P-piece verify
against one-piece forwards of the same states, for the packed (default) and the exact layout.

States come from real draft-free trajectories (GSM8K test prompts, chat format): for each block of
each trajectory, its states are packed P at a time (cycled where a block has fewer than P) into
one verify with the block's prefix in the cache, and every piece is then scored alone in a
one-piece verify on the same cache. Per (layout, P, policy) this prints one JSON line: the largest
|logit difference| over every piece, position and token (delta), the fraction of states whose next
state differs (the decision flip rate), the smallest and largest margin of the decision that
flipped (spot_eval.harness.lossless.flip, on the one-piece logits), and how many flips no logit
error of delta could explain (`Margins.within`; any is a bug). One more line per (layout, P) gives
the median seconds of a P-piece verify (the layouts timed alternately, so that drift in the
machine's state falls on both).

Usage: python bench/verify_exactness.py [--target DIR] [--dtype bfloat16] [--device cpu]
           [--prompts 8] [--gen 128] [--pieces 2+9+21] [--temperature 0] [--threshold 0.9]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from spot import DecodeConfig, Sampling, generate
from spot.noise import gumbel, step_key
from spot.policy import Margins, decide
from spot.targets import BlockCausalTarget
from spot_eval.checkpoints.shipped import EMBEDDED_TARGET
from spot_eval.checkpoints.target import encode_prompt
from spot_eval.data.datasets import load
from spot_eval.harness.lossless import flip

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
POLICIES = ("single", "threshold")


def contexts(target: BlockCausalTarget, prompts: int, gen: int) -> list[tuple[torch.Tensor, int, torch.Tensor]]:
    """(prefix [L], block index, the block's states [S, K]) for every block of every trajectory."""
    k, out = target.block_length, []
    for doc in load("gsm8k_test")[:prompts]:
        ids = torch.tensor(encode_prompt(target, doc["question"], chat=True))
        g = generate(target, ids.tolist(), DecodeConfig(block_length=k, gen_length=gen), record=True)
        tokens = ids
        for trace in g.trajectory:
            start = trace.block * k
            out.append((tokens[:start], trace.block, trace.states[:-1]))  # the last state is finished: never scored
            tokens = torch.cat([tokens[:start], trace.states[-1]])
    return out


def scored_alone(target: BlockCausalTarget, prefix: torch.Tensor, states: torch.Tensor, start: int) -> torch.Tensor:
    """[P, K, V]: each state's logits from a one-piece verify with `prefix` cached."""
    target.start(prefix)
    target.verify(states[:1], start)  # the prefix's KV rides along here; the cache holds it from now on
    return torch.stack([target.verify(states[r : r + 1], start)[0] for r in range(len(states))])


def compare(target: BlockCausalTarget, cases, pieces: int, configs: dict[str, DecodeConfig], noise_key) -> list[dict]:
    worst, n = 0.0, 0
    flips: dict[str, list[tuple[float, Margins]]] = {policy: [] for policy in configs}
    k, mask = target.block_length, target.mask_id
    for prefix, block, states in cases:
        order = torch.arange(pieces) % len(states)
        packed = states[order]  # [P, K]
        start = block * k
        alone = scored_alone(target, prefix, packed, start)  # [P, K, V]
        together = target.verify(packed, start)  # same cache, P pieces in one forward
        worst = max(worst, float((together - alone).abs().max()))
        for r in range(pieces):
            step = int(order[r])
            noise = noise_key(block, step)
            for policy, config in configs.items():
                after, proposal = decide(packed[r], alone[r], noise, config, mask, step, margins=True)
                other, _ = decide(packed[r], together[r], noise, config, mask, step)
                if not torch.equal(after, other):
                    _, margin = flip(packed[r], after, other, proposal, config, mask, step)
                    flips[policy].append((margin, Margins.of(packed[r], after, proposal, config, mask, step)))
        n += pieces
    rows = []
    for policy, found in flips.items():
        margins = [m for m, _ in found]
        temperature = configs[policy].sampling.temperature
        rows.append({
            "policy": policy, "states": n, "max_abs_logit_diff": worst, "flips": len(found), "flip_rate": len(found) / n,
            "smallest_flipped_margin": min(margins, default=None), "largest_flipped_margin": max(margins, default=None),
            "unexplained_flips": sum(not step.within(worst, temperature) for _, step in found),
        })
    return rows


def verify_seconds(targets: dict[str, BlockCausalTarget], case, pieces: int, repeats: int) -> dict[str, float]:
    prefix, block, states = case
    packed = states[torch.arange(pieces) % len(states)]
    times: dict[str, list[float]] = {name: [] for name in targets}
    for _ in range(repeats):
        for name, target in targets.items():  # alternately, so that drift falls on both
            target.start(prefix)
            target.verify(packed[:1], block * target.block_length)
            if target.device.type == "cuda":
                torch.cuda.synchronize(target.device)
            t = time.perf_counter()
            target.verify(packed, block * target.block_length)  # synchronises on CUDA itself
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(EMBEDDED_TARGET))
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--gen", type=int, default=128)
    parser.add_argument("--pieces", default="2+9+21")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--repeats", type=int, default=7, help="timed verifies per layout and P")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    exact = BlockCausalTarget.from_pretrained(args.target, device=args.device, dtype=DTYPES[args.dtype], exact=True)
    packed = BlockCausalTarget(exact.model, exact.mask_id, exact.eos_ids, exact.block_length, exact.tokenizer, exact.name)
    targets = {"default": packed, "exact": exact}
    cases = contexts(exact, args.prompts, args.gen)
    sampling = Sampling(temperature=args.temperature)
    configs = {p: DecodeConfig(policy=p, threshold=args.threshold, block_length=exact.block_length, sampling=sampling)
               for p in POLICIES}

    def noise_key(block: int, step: int) -> torch.Tensor | None:
        if args.temperature == 0:
            return None
        return gumbel(step_key(0, 0, block, step), exact.block_length, exact.vocab_size, exact.device)

    common = {"bench": "verify_exactness", "target": args.target, "dtype": args.dtype, "device": args.device,
              "torch": torch.__version__, "temperature": args.temperature, "threshold": args.threshold}
    for pieces in (int(p) for p in args.pieces.split("+")):
        seconds = verify_seconds(targets, max(cases, key=lambda c: c[0].numel()), pieces, args.repeats)
        for layout, target in targets.items():
            for row in compare(target, cases, pieces, configs, noise_key):
                print(json.dumps({**common, "layout": layout, "pieces": pieces, **row}), flush=True)
            print(json.dumps({**common, "layout": layout, "pieces": pieces, "verify_seconds": seconds[layout],
                              "exact_over_default": seconds["exact"] / seconds["default"]}), flush=True)


if __name__ == "__main__":
    main()
