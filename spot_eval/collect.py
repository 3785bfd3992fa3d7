"""`spot-eval collect`: record a target's draft-free trajectories on training prompts.

The plan is a seeded shuffle of every training pair (`corpus.training_pairs`, which mixes the
sources), cut to the first N: a rerun with a larger N extends the plan without changing its
prefix. Plan position i decodes pair `plan[i]` with request index `plan[i]` (so one prompt keeps
its noise key and its side of the held-out split across runs) at temperature
`temperatures[i % len(temperatures)]`, with the draft-free decoder (budget 0) and the given policy.
Shards of `shard_size` consecutive plan positions are written as they finish; a rerun skips them.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from spot import DecodeConfig, Sampling, generate
from spot_eval.corpus import SOURCES, training_pairs
from spot_eval.decode import encode_prompt, load_target
from spot_eval.drafter_checkpoint import target_fingerprint
from spot_eval.trajectories import (
    BlockRecord,
    CollectSettings,
    Manifest,
    ShardEntry,
    pack_shard,
    read_manifest,
    shard_file,
    write_manifest,
    write_shard,
)


@dataclass(frozen=True)
class CollectResult:
    out: str
    decoded: int  # requests decoded by this run
    shards_written: int
    shards_skipped: int  # finished by an earlier run
    prompts_skipped: int  # too long for the model's positions
    seconds: float


def plan(n_prompts: int, seed: int, n_pairs: int) -> list[int]:
    """Pair indices for plan positions 0..n_prompts-1: the prefix of one seeded shuffle."""
    order = list(range(n_pairs))
    random.Random(seed).shuffle(order)
    return order[:n_prompts]


def collect(
    target: str | Path,
    out: str | Path,
    policy: str,
    block_length: int | None,
    gen_length: int,
    prompts: int,
    temperatures: tuple[float, ...],
    seed: int,
    shard_size: int,
    chat: bool,
    topk: int = 32,
    threshold: float = 0.9,
    sources: tuple[str, ...] = SOURCES,
    device: str = "cpu",
    progress: Callable[[str], None] | None = None,
) -> CollectResult:
    t0 = time.perf_counter()
    if prompts < 1 or shard_size < 1 or topk < 1:
        raise ValueError(f"--prompts ({prompts}), --shard-size ({shard_size}) and topk ({topk}) must be >= 1")
    if not temperatures:
        raise ValueError("--temperatures is empty; give at least one, e.g. 0,1")
    for t in temperatures:  # validates each temperature and the policy before any weights load
        DecodeConfig(policy=policy, threshold=threshold, gen_length=gen_length, sampling=Sampling(temperature=t), seed=seed)
    pairs = training_pairs(sources)
    if prompts > len(pairs):
        raise ValueError(f"--prompts {prompts} exceeds the {len(pairs)} training prompts of {', '.join(sources)}")
    model = load_target(target, block_length, device)
    if chat and not getattr(model.tokenizer, "chat_template", None):
        raise ValueError(f"the tokenizer of {target} has no chat template; pass --no-chat to decode the raw prompts")
    settings = CollectSettings(gen_length, topk, seed, tuple(temperatures), chat, shard_size, threshold, tuple(sources))
    manifest = Manifest(target_fingerprint(model, policy), settings, model.mask_id, model.vocab_size, ())
    out = Path(out)
    if (out / "manifest.json").is_file():
        recorded = read_manifest(out)
        differences = recorded.mismatch(manifest)
        if differences:
            raise ValueError(
                f"{out} already holds trajectories of target {recorded.fingerprint} with {recorded.settings}, "
                f"not of target {manifest.fingerprint} with {settings} (differs in {'; '.join(differences)}); "
                "use another --out or the recorded settings"
            )
        manifest = recorded
    out.mkdir(parents=True, exist_ok=True)

    order = plan(prompts, seed, len(pairs))
    k = model.block_length
    earlier = {s.index: s for s in manifest.shards}
    decoded = written = skipped_shards = skipped_prompts = 0
    for index in range(math.ceil(prompts / shard_size)):
        first = index * shard_size
        count = min(shard_size, prompts - first)
        entry = earlier.get(index)
        if entry is not None and (entry.first, entry.count) == (first, count) and (out / entry.file).is_file():
            skipped_shards += 1
            continue
        t_shard = time.perf_counter()
        records: list[BlockRecord] = []
        requests = 0
        for position in range(first, first + count):
            request = order[position]
            ids = encode_prompt(model, pairs[request].prompt, chat)
            if math.ceil((len(ids) + gen_length) / k) * k > model.max_positions:
                skipped_prompts += 1
                continue
            temperature = temperatures[position % len(temperatures)]
            config = DecodeConfig(
                policy=policy,
                threshold=threshold,
                block_length=k,
                gen_length=gen_length,
                sampling=Sampling(temperature=temperature),
                seed=seed,
            )
            result = generate(model, ids, config, request=request, record=True, record_topk=topk)
            records += [
                BlockRecord(request, t.block, temperature, t.states, t.topk_logprobs, t.topk_ids) for t in result.trajectory
            ]
            requests += 1
        decoded += requests
        name = shard_file(index)
        write_shard(out / name, pack_shard(records, model.vocab_size, model.block_length, topk))
        steps = sum(r.topk_ids.shape[0] for r in records)
        entry = ShardEntry(name, index, first, count, requests, len(records), steps)
        shards = sorted([*(s for s in manifest.shards if s.index != index), entry], key=lambda s: s.index)
        manifest = replace(manifest, shards=tuple(shards))
        write_manifest(out, manifest)
        written += 1
        if progress is not None:
            progress(
                f"{name}: {requests} requests, {len(records)} blocks, {steps} steps in {time.perf_counter() - t_shard:.1f} s"
            )
    return CollectResult(str(out), decoded, written, skipped_shards, skipped_prompts, time.perf_counter() - t0)
