"""Decoder overhead per draft-free step, and the cost of one verify forward with P pieces.

Prints one JSON line. Measured side by side in one process on a ~5M-parameter Qwen3 config:

  step_overhead   median seconds of one draft-free engine step (the verify forward, the mask,
                  the policy, the bookkeeping) over the median raw model forward on the same
                  shapes (1 x K query tokens against the same cache, a prebuilt all-True mask).
  verify_cost     median seconds of one verify forward with P pieces over P = 1, P in {1, 9, 21}.

Usage: python bench/decoder_overhead.py [--block 32] [--gen 256] [--repeats 5] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

from spot import DecodeConfig, generate
from spot.targets import BlockCausalTarget


def model_5m(vocab: int = 4096) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        initializer_range=0.2,
        attn_implementation="sdpa",
    )
    return Qwen3ForCausalLM(config).eval()


def timed(fn, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t


@torch.inference_mode()
def raw_forward_seconds(model: Qwen3ForCausalLM, cache_length: int, k: int, device: torch.device, repeats: int) -> float:
    """Median seconds of the bare transformers forward of K query tokens on a cache of `cache_length`."""
    cache = DynamicCache(config=model.config)
    model.model(input_ids=torch.zeros(1, cache_length, dtype=torch.long, device=device), cache=cache, use_cache=True)
    ids = torch.zeros(1, k, dtype=torch.long, device=device)
    positions = torch.arange(cache_length, cache_length + k, device=device)[None]
    mask = torch.ones(1, 1, k, cache_length + k, dtype=torch.bool, device=device)

    def step() -> None:
        hidden = model.model(input_ids=ids, position_ids=positions, attention_mask=mask, cache=cache, use_cache=True)
        model.lm_head(hidden.last_hidden_state)
        cache.crop(-k)

    return statistics.median(timed(step, device) for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block", type=int, default=32)
    parser.add_argument("--gen", type=int, default=256)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_grad_enabled(False)
    model = model_5m().to(device)
    k = args.block
    target = BlockCausalTarget(model, mask_id=model.config.vocab_size - 1, eos_ids=frozenset(), block_length=k)
    prompt = (torch.arange(args.prompt) % 1000).tolist()
    config = DecodeConfig(block_length=k, gen_length=args.gen)

    generate(target, prompt, config)  # warm-up
    step_seconds = []
    for _ in range(args.repeats):
        g = generate(target, prompt, config)
        step_seconds.append(g.stats.seconds / g.stats.steps)
    # The raw forward on the same shapes: K query tokens against caches the decode passed through.
    lengths = range(args.prompt // k * k, args.prompt + args.gen, k)
    raw = statistics.median(raw_forward_seconds(model, n, k, device, args.repeats) for n in lengths)
    engine = statistics.median(step_seconds)

    verify = {}
    target.start(torch.tensor(prompt[: args.prompt // k * k]))
    start = args.prompt // k * k
    state = torch.full((k,), target.mask_id)
    target.verify(state[None], start)  # builds the cache
    for pieces in (1, 9, 21):
        batch = state[None].repeat(pieces, 1)
        target.verify(batch, start)  # warm-up
        verify[pieces] = statistics.median(timed(lambda b=batch: target.verify(b, start), device) for _ in range(args.repeats))

    print(
        json.dumps(
            {
                "bench": "decoder_overhead",
                "device": str(device),
                "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
                "block": k,
                "gen": args.gen,
                "prompt": args.prompt,
                "repeats": args.repeats,
                "engine_step_s_median": engine,
                "raw_forward_s_median": raw,
                "step_overhead": engine / raw - 1,
                "verify_s_median": {str(p): s for p, s in verify.items()},
                "verify_cost_vs_p1": {str(p): s / verify[1] for p, s in verify.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
