"""The verify-cost curve c(P)/c(1): seconds of one verify forward with P pieces over one with a single
piece, at a fixed context, for each layout (packed and exact). What decides whether a draft tree of a
given size pays off on a device: nearly flat on a GPU at batch 1 for small P, nearly linear on a CPU.

Models: `embedded` (the shipped target), `sdar-8b` (the shape of SDAR-8B-Chat from
tests/fixtures/sdar-8b-chat/config.json, random weights) or `llada2-mini` (LLaDA2.0-mini's shape, the
defaults of spot.targets.llada2.LLaDA2Config: 20 layers, 256 experts, top-8 and a shared one; random
weights). `--layers` and `--width-divisor` cut a shaped model down to fit a device's time or memory, and
the JSON says so. Prints one JSON line per (layout, P).

Usage: python bench/verify_cost.py --model sdar-8b --layers 12 --device cuda --dtype bfloat16
           [--pieces 1+2+3+5+9+13+17+21] [--context 512] [--repeats 9]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import Qwen3ForCausalLM

from spot.targets import BlockCausalTarget, read_checkpoint
from spot.targets.llada2 import LLaDA2Config, LLaDA2ForCausalLM
from spot_eval.checkpoints.shipped import EMBEDDED_TARGET

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SDAR_8B = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "sdar-8b-chat"


def sdar_shaped(device: str, dtype: torch.dtype, layers: int | None, divisor: int, block: int) -> tuple[BlockCausalTarget, dict]:
    """SDAR-8B-Chat's architecture with random weights (seeded), optionally fewer layers and narrower."""
    checkpoint = read_checkpoint(SDAR_8B)
    config, info = checkpoint.config, checkpoint.info
    if layers is not None:
        config.num_hidden_layers = layers
        config.layer_types = config.layer_types[:layers]
    if divisor > 1:
        for field in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads"):
            setattr(config, field, max(getattr(config, field) // divisor, 1))
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(dtype)
    shape = {k: getattr(config, k) for k in ("num_hidden_layers", "hidden_size", "intermediate_size",
                                              "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size")}
    return BlockCausalTarget(model, info.mask_id, info.eos_ids, block, name="sdar-8b-shaped"), shape


def llada2_shaped(device: str, dtype: torch.dtype, layers: int | None, divisor: int, block: int) -> tuple[BlockCausalTarget, dict]:
    """LLaDA2.0-mini's architecture with random weights (seeded), optionally fewer layers and narrower. Its
    mask and EOS ids are the published tokenizer's [SRC: inclusionAI/LLaDA2.0-mini, method notes]."""
    config = LLaDA2Config()
    if layers is not None:
        config.num_hidden_layers = layers
    if divisor > 1:
        for field in ("hidden_size", "intermediate_size", "moe_intermediate_size", "num_attention_heads", "num_key_value_heads"):
            setattr(config, field, max(getattr(config, field) // divisor, 1))
    torch.manual_seed(0)
    with torch.device(device):
        model = LLaDA2ForCausalLM(config).to(dtype)
    shape = {k: getattr(config, k) for k in ("num_hidden_layers", "hidden_size", "moe_intermediate_size", "num_experts",
                                              "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size")}
    return BlockCausalTarget(model, 156895, frozenset({156892}), block, name="llada2-mini-shaped"), shape


def seconds(target: BlockCausalTarget, prefix: torch.Tensor, pieces: torch.Tensor, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        target.start(prefix)
        target.verify(pieces[:1], prefix.numel())  # the prefix's KV, cached before the timed forward
        t = time.perf_counter()
        target.verify(pieces, prefix.numel())  # synchronises on CUDA itself
        times.append(time.perf_counter() - t)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["embedded", "sdar-8b", "llada2-mini"], default="embedded")
    parser.add_argument("--layers", type=int, default=None, help="sdar-8b, llada2-mini: keep this many layers")
    parser.add_argument("--width-divisor", type=int, default=1, help="sdar-8b, llada2-mini: divide widths and heads by this")
    parser.add_argument("--block", type=int, default=32, help="sdar-8b, llada2-mini: the block length (both publish 32)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--pieces", default="1+2+3+5+9+13+17+21")
    parser.add_argument("--context", type=int, default=512, help="cached positions before the active block")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    dtype = DTYPES[args.dtype]
    if args.model == "embedded":
        packed, shape = BlockCausalTarget.from_pretrained(EMBEDDED_TARGET, device=args.device, dtype=dtype), {}
    else:
        shaped = sdar_shaped if args.model == "sdar-8b" else llada2_shaped
        packed, shape = shaped(args.device, dtype, args.layers, args.width_divisor, args.block)
    exact = BlockCausalTarget(packed.model, packed.mask_id, packed.eos_ids, packed.block_length, packed.tokenizer, packed.name, exact=True)
    k = packed.block_length
    context = args.context // k * k
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, packed.vocab_size, (context,), generator=g)
    counts = [int(p) for p in args.pieces.split("+")]
    states = torch.randint(0, packed.vocab_size, (max(counts), k), generator=g)
    states[torch.rand(max(counts), k, generator=g) < 0.5] = packed.mask_id
    base = {"bench": "verify_cost", "model": args.model, "shape": shape, "device": args.device,
            "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
            "dtype": args.dtype, "context": context, "block": k, "repeats": args.repeats}
    for layout, target in (("default", packed), ("exact", exact)):
        single = None
        for p in counts:
            s = seconds(target, prefix, states[:p], args.repeats)
            single = s if p == counts[0] else single
            print(json.dumps({**base, "layout": layout, "pieces": p, "seconds": s, "cost_ratio": s / single}), flush=True)


if __name__ == "__main__":
    main()
