"""What the engine's guard against untrusted drafters costs per draft (spot.drafters.base: checked trees, copied noise).

The engine checks every tree a drafter returns (`spot.tree.defect`) and copies it, and hands the drafter a copy of
each step's noise it asks for. Measured side by side in one process on the embedded target, FreeDave at budget 8
(spot.drafters.freedave), at T = 0 and T = 1, each figure the median over prompts and repeats:

  decode_s_guarded      seconds of one decode with the engine as it is
  decode_s_unguarded    the same decode with the guard's copies off: `spot.engine.checked` a pass-through and
                        `spot.engine._copies` the noise itself (switched off here only, to measure)
  guarded_over_unguarded  the median of the ratio of each pair of these decodes (the same prompt, back to back)
  guard_s_per_draft     (guarded - unguarded) / drafts per decode
  noise_copies_per_draft  noise tensors the drafter asked for per draft (0 at T = 0: no noise is handed over)
  check_s               one `checked` call on a 9-node tree the drafter returned
  noise_copy_s          one noise copy ([K, V] float64 clone)
  verify9_s             one verify forward of 9 pieces, for scale
  micro_guard_s_per_draft  check_s + noise_copies_per_draft * noise_copy_s: the guard's cost per draft from the
                        micro-timings (the decode difference above is within the decodes' noise on a busy machine)

The tokens of the guarded and unguarded decodes must agree (`same_tokens`): FreeDave writes nothing it is handed.
Prints one JSON line.

Usage: python bench/draft_guard.py [--prompts 2] [--gen 64] [--repeats 3] [--micro 200] [--device cpu] [--threads N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
from dataclasses import replace

import torch
from decoder_overhead import timed
from speedup import prompts_for

import spot.engine
from spot import DecodeConfig, Sampling, generate
from spot.drafters.base import DraftContext, checked
from spot.drafters.freedave import FreeDaveDrafter
from spot.noise import block_noise
from spot.tree import DraftTree
from spot_eval.checkpoints.shipped import EMBEDDED_TARGET
from spot_eval.checkpoints.target import encode_prompt, load_target

BUDGET = 8


class Counted:
    """FreeDave, counting its drafts and the noise tensors it is handed, and keeping its largest tree and its root."""

    def __init__(self) -> None:
        self.drafter, self.name = FreeDaveDrafter(), "freedave"
        self.drafts = self.copies = 0
        self.largest: tuple[DraftTree, torch.Tensor] | None = None

    def draft(self, ctx: DraftContext) -> DraftTree:
        def gumbel(step: int) -> torch.Tensor | None:
            noise = ctx.gumbel(step)
            self.copies += noise is not None
            return noise

        tree = self.drafter.draft(replace(ctx, gumbel=gumbel))
        self.drafts += 1
        if self.largest is None or tree.size > self.largest[0].size:
            self.largest = tree, ctx.state.clone()
        return tree


@contextlib.contextmanager
def unguarded():
    """The engine without the guard's copies: trees taken as returned, the noise handed over itself."""
    kept = spot.engine.checked, spot.engine._copies
    spot.engine.checked = lambda drafter, tree, *args: tree
    spot.engine._copies = lambda noise: noise
    try:
        yield
    finally:
        spot.engine.checked, spot.engine._copies = kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(EMBEDDED_TARGET))
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--gen", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--micro", type=int, default=200, help="repeats of each micro-timing")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    target = load_target(args.target, None, args.device)
    prompts = [encode_prompt(target, p, chat=True) for p in prompts_for("gsm8k", args.prompts)]
    k, vocab = target.block_length, target.vocab_size

    rows = {}
    largest = None
    for temperature in (0.0, 1.0):
        config = DecodeConfig(block_length=k, gen_length=args.gen, budget=BUDGET, sampling=Sampling(temperature))
        counted = Counted()
        for prompt in prompts:  # the drafts and noise copies of each decode (untimed), and a warm-up
            generate(target, prompt, config, drafter=counted)
        seconds: dict[bool, list[float]] = {True: [], False: []}
        tokens: dict[bool, list[tuple[int, ...]]] = {True: [], False: []}
        for repeat in range(args.repeats):
            for prompt in prompts:
                for guarded in (True, False) if repeat % 2 == 0 else (False, True):  # rotate: drift spreads evenly
                    with contextlib.nullcontext() if guarded else unguarded():
                        g = generate(target, prompt, config, drafter=FreeDaveDrafter())
                    seconds[guarded].append(g.stats.seconds)
                    tokens[guarded].append(g.token_ids)
        guarded, bare = statistics.median(seconds[True]), statistics.median(seconds[False])
        ratio = statistics.median(a / b for a, b in zip(seconds[True], seconds[False], strict=True))
        drafts = counted.drafts / len(prompts)
        rows[f"T{temperature:g}"] = {
            "decode_s_guarded": guarded,
            "decode_s_unguarded": bare,
            "guarded_over_unguarded": ratio,
            "drafts_per_decode": drafts,
            "guard_s_per_draft": (guarded - bare) / drafts,
            "noise_copies_per_draft": counted.copies / counted.drafts,
            "same_tokens": tokens[True] == tokens[False],
        }
        largest = counted.largest if largest is None or counted.largest[0].size > largest[0].size else largest

    tree, root = largest
    assert tree.size == BUDGET, f"FreeDave's largest tree has {tree.size} nodes, not {BUDGET}: decode longer (--gen)"
    check = statistics.median(timed(lambda: checked(FreeDaveDrafter(), tree, root, BUDGET, vocab, target.mask_id), device)
                              for _ in range(args.micro))
    noise = block_noise(0, 0, 0, k, vocab, device)(0)
    copy = statistics.median(timed(noise.clone, device) for _ in range(args.micro))
    start = len(prompts[0]) // k * k
    target.start(torch.tensor(prompts[0][:start]))
    pieces = tree.states.to(device)
    target.verify(pieces, start)  # builds the cache, and a warm-up
    verify = statistics.median(timed(lambda: target.verify(pieces, start), device) for _ in range(max(args.micro // 10, 5)))

    for row in rows.values():
        row["micro_guard_s_per_draft"] = check + row["noise_copies_per_draft"] * copy
        row["micro_guard_over_verify9"] = row["micro_guard_s_per_draft"] / verify
    print(json.dumps({
        "bench": "draft_guard", "target": args.target, "device": args.device, "block": k, "vocab": vocab,
        "budget": BUDGET, "prompts": len(prompts), "gen": args.gen, "repeats": args.repeats, "threads": torch.get_num_threads(),
        "decodes": rows,
        "check_s": check, "noise_copy_s": copy, "verify9_s": verify,
        "check_over_verify9": check / verify, "noise_copy_over_verify9": copy / verify,
    }))


if __name__ == "__main__":
    main()
