"""What spreading a target costs per decode: accelerate's hooks, disk offload and a split over GPUs, beside the
whole target; and that the spread target decodes the same tokens with the same forwards.

Prints one JSON line. The embedded target (or --pretrained) decodes the same prompts, interleaved round by round
so that drift on the machine hits every layout alike, under layouts loaded side by side in one process:

  whole        the target on one device (no hooks)
  hooks        the same device, every module under accelerate's hooks (dispatch_model, force_hooks): the cost
               of the hooks alone, what a split over several GPUs adds before any transfer between them
  on the CPU:  half_disk (every other decoder layer offloaded to disk, read in before each of its forwards) and
               disk (every decoder layer offloaded)
  on CUDA:     two_gpus (every other layer on cuda:1) where two GPUs are visible, else one_gpu_map (an explicit
               device_map with every module on cuda:0, loaded through from_pretrained's device_map)

For each layout and method (draft-free, FreeDave at --budget): the median seconds per decode over prompts and
repeats; its ratio to the whole target's, decode by decode (the same prompt in the same round), as the median and
interquartile range of those ratios; whether tokens and forwards equal the whole target's on every prompt
(they must where the kernels are the same: the hooks move data, they compute nothing), and on CUDA the MiB of
weights each layout put on each GPU.

Usage: python bench/placement_overhead.py [--device cpu|cuda] [--dtype float32] [--prompts 6] [--repeats 3]
           [--temperature 0] [--budget 8] [--gen-length 128]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import replace

import torch
from accelerate import dispatch_model

from spot import DecodeConfig, Sampling, generate
from spot.drafters.freedave import FreeDaveDrafter
from spot.targets import Placement, from_pretrained
from spot_eval.checkpoints.shipped import EMBEDDED_TARGET
from spot_eval.checkpoints.target import encode_prompt, read_target
from spot_eval.data.datasets import load


def layouts(path: str, folder: str, device: str, dtype: torch.dtype) -> tuple[dict, dict]:
    """The layouts by name, and the MiB of weights each put on each GPU."""
    checkpoint = read_target(path)
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    home = "cuda:0" if device == "cuda" else "cpu"
    names = None
    loaded, weights = {}, {}

    def load(name: str, placement: Placement | None = None, hooks: bool = False) -> None:
        nonlocal names
        before = [torch.cuda.memory_allocated(i) for i in range(gpus)]
        target = from_pretrained(checkpoint, device=home, dtype=dtype, placement=placement)
        if names is None:  # the modules a map places: the model's children but its layers, and each layer
            model = target.model
            names = [f"model.{n}" for n, _ in model.model.named_children() if n != "layers"]
            names += [n for n, _ in model.named_children() if n != "model"]
            names += [f"model.layers.{i}" for i in range(model.config.num_hidden_layers)]
        if hooks:
            dispatch_model(target.model, dict.fromkeys(names, 0 if gpus else "cpu"), force_hooks=True)
        loaded[name] = target
        weights[name] = {f"cuda:{i}": round((torch.cuda.memory_allocated(i) - before[i]) / 2**20, 1) for i in range(gpus)}

    def spread(where) -> Placement:
        return Placement(tuple((n, where(n)) for n in names), offload_folder=folder)

    def odd(name: str) -> bool:
        return name.startswith("model.layers.") and int(name.rsplit(".", 1)[1]) % 2 == 1

    load("whole")
    load("hooks", hooks=True)
    if device == "cpu":
        load("half_disk", spread(lambda n: "disk" if odd(n) else "cpu"))
        load("disk", spread(lambda n: "disk" if n.startswith("model.layers.") else "cpu"))
    elif gpus >= 2:
        load("two_gpus", spread(lambda n: 1 if odd(n) else 0))
    else:
        load("one_gpu_map", spread(lambda n: 0))
    return loaded, weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pretrained", default=str(EMBEDDED_TARGET))
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--prompts", type=int, default=6, help="GSM8K test questions, from the 50th on")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--budget", type=int, default=8)
    parser.add_argument("--gen-length", type=int, default=128)
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="spot-offload-") as folder:
        targets, weights = layouts(args.pretrained, folder, args.device, getattr(torch, args.dtype))
        whole = targets["whole"]
        questions = [row["question"] for row in load("gsm8k_test")[50:50 + args.prompts]]
        prompts = [encode_prompt(whole, q, chat=bool(whole.tokenizer.chat_template)) for q in questions]
        config = DecodeConfig(block_length=whole.block_length, gen_length=args.gen_length,
                              sampling=Sampling(args.temperature))
        methods = {"draft_free": (0, None), f"freedave@{args.budget}": (args.budget, FreeDaveDrafter)}
        seconds = {(layout, m): [] for layout in targets for m in methods}
        outputs: dict[tuple[str, str], list] = {key: [] for key in seconds}
        for repeat in range(args.repeats):
            for i, prompt in enumerate(prompts):
                for method, (budget, drafter) in methods.items():
                    for layout, target in targets.items():
                        run = replace(config, budget=budget)
                        if args.device == "cuda":
                            torch.cuda.synchronize()
                        start = time.perf_counter()
                        result = generate(target, prompt, run, drafter=drafter() if drafter else None, request=i)
                        if args.device == "cuda":
                            torch.cuda.synchronize()
                        seconds[layout, method].append(time.perf_counter() - start)
                        if repeat == 0:
                            outputs[layout, method].append((result.token_ids, result.stats.forwards))
    figures = {}
    for (layout, method), times in seconds.items():
        # each decode against the whole target's decode of the same prompt in the same round: prompts differ in length
        paired = sorted(t / w for t, w in zip(times, seconds["whole", method], strict=True))
        quartiles = statistics.quantiles(paired, n=4, method="inclusive") if len(paired) > 1 else [paired[0]] * 3
        figures.setdefault(layout, {})[method] = {
            "median_seconds": round(statistics.median(times), 4),
            "ratio_to_whole": round(quartiles[1], 3),
            "ratio_iqr": [round(quartiles[0], 3), round(quartiles[2], 3)],
            "same_tokens_and_forwards": outputs[layout, method] == outputs["whole", method]}
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(json.dumps({"bench": "placement_overhead", "target": args.pretrained, "device": device, "dtype": args.dtype,
                      "threads": torch.get_num_threads(), "prompts": len(prompts), "repeats": args.repeats,
                      "temperature": args.temperature, "gen_length": args.gen_length, "layouts": figures,
                      "weights_mib_by_gpu": weights}))


if __name__ == "__main__":
    main()
