"""`spot-eval collect`: record a target's draft-free trajectories on training prompts.

The plan is a seeded shuffle of every training pair (`corpus.training_pairs`, which mixes the
sources), cut to the first N: a rerun with a larger N extends the plan without changing its
prefix. Plan position i decodes pair `plan[i]` with request index `plan[i]` (so one prompt keeps
its noise key and its side of the held-out split across runs) at temperature
`temperatures[i % len(temperatures)]`, with the draft-free decoder (budget 0) and the given policy.
Shards of `shard_size` consecutive plan positions are written as they finish; a rerun skips them.
With `workers` > 1 the shards are decoded by a pool of processes (one torch thread each by
default): on a few CPU cores, processes scale far better than torch's threads for a model this
small. A request's records do not depend on which process decoded it, only, in the last bits of
float arithmetic, on the torch thread count.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import os
import random
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from spot import DecodeConfig, Sampling, generate
from spot.drafters.set_model import Projection
from spot.targets.base import LoadedTarget
from spot_eval.checkpoints.fingerprint import check_fingerprint, target_fingerprint
from spot_eval.checkpoints.refresh_head import FIX, RefreshFile, load_refresh, same_projections
from spot_eval.checkpoints.target import encode_prompt, load_target
from spot_eval.training.corpus import SOURCES, Pair, training_pairs
from spot_eval.training.trajectories import (
    PROJECTIONS,
    BlockRecord,
    CollectSettings,
    Manifest,
    ShardEntry,
    pack_shard,
    read_manifest,
    read_projections,
    shard_file,
    write_manifest,
    write_projections,
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
    dtype: torch.dtype | None = None,
    progress: Callable[[str], None] | None = None,
    workers: int = 1,
    threads: int | None = None,
    cache: str | None = None,
    hidden_dims: int = 0,
    embedding_dims: int = 32,
    projections_from: str | Path | None = None,
) -> CollectResult:
    """hidden_dims > 0 also records the hidden states behind every step, projected on a basis fitted on the
    first shard's (what SPOT-Sets' set model reads; spot_eval.training.trajectories); or, with projections_from (a
    SPOT-R drafter file), on that drafter's own projections, so that what it reads can be fitted on these
    trajectories (SPOT-RS's rule: spot-eval fit-sets --refresh)."""
    t0 = time.perf_counter()
    if min(prompts, shard_size, topk, workers) < 1:
        raise ValueError(
            f"--prompts ({prompts}), --shard-size ({shard_size}), --topk ({topk}) and --workers ({workers}) must be >= 1"
        )
    if hidden_dims < 0 or (hidden_dims and embedding_dims < 1):
        raise ValueError(f"--hidden-dims ({hidden_dims}) must be >= 0 and --embedding-dims ({embedding_dims}) >= 1")
    if not temperatures:
        raise ValueError("--temperatures is empty; give at least one, e.g. 0,1")
    for t in temperatures:  # validates each temperature and the policy before any weights load
        DecodeConfig(policy=policy, threshold=threshold, gen_length=gen_length, sampling=Sampling(temperature=t), seed=seed)
    pairs = training_pairs(sources)
    if prompts > len(pairs):
        raise ValueError(f"--prompts {prompts} exceeds the {len(pairs)} training prompts of {', '.join(sources)}")
    drafter = None if projections_from is None else _drafter_projections(projections_from, hidden_dims, embedding_dims)
    model = load_target(target, block_length, device, dtype=dtype, cache=cache)
    given = None
    if drafter is not None:  # the projections are the target's, whichever policy the drafter decodes
        check_fingerprint(drafter.fingerprint, target_fingerprint(model, drafter.fingerprint["policy"]),
                          what=f"SPOT-R drafter {projections_from} was trained", fix=FIX)
        given = drafter.hidden, drafter.embedding
    if chat and not getattr(model.tokenizer, "chat_template", None):
        raise ValueError(f"the tokenizer of {target} has no chat template; pass --no-chat to decode the raw prompts")
    settings = CollectSettings(gen_length, topk, seed, tuple(temperatures), chat, shard_size, threshold, tuple(sources),
                               hidden_dims, embedding_dims if hidden_dims else 0)
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

    shards = [
        (index, index * shard_size, min(shard_size, prompts - index * shard_size))
        for index in range(math.ceil(prompts / shard_size))
    ]
    earlier = {s.index: s for s in manifest.shards}

    def finished(index: int, first: int, count: int) -> bool:
        entry = earlier.get(index)
        return entry is not None and (entry.first, entry.count) == (first, count) and (out / entry.file).is_file()

    todo = [shard for shard in shards if not finished(*shard)]
    skipped_shards = len(shards) - len(todo)
    decoder = ShardDecoder(plan(prompts, seed, len(pairs)), pairs, settings, policy)
    decoded = written = skipped_prompts = 0
    here: list = []
    if hidden_dims:
        decoder, here, todo = _with_projections(out, model, decoder, todo, given)
    decoded_shards = _decode_shards(todo, decoder, model, target, block_length, device, dtype, cache, workers, threads)
    for index, first, count, shard, seconds in itertools.chain(here, decoded_shards):
        decoded += shard.requests
        skipped_prompts += shard.skipped_prompts
        name = shard_file(index)
        write_shard(out / name, pack_shard(shard.records, model.vocab_size, model.block_length, topk))
        steps = sum(r.topk_ids.shape[0] for r in shard.records)
        entry = ShardEntry(name, index, first, count, shard.requests, len(shard.records), steps)
        kept = sorted([*(s for s in manifest.shards if s.index != index), entry], key=lambda s: s.index)
        manifest = replace(manifest, shards=tuple(kept))
        write_manifest(out, manifest)
        written += 1
        if progress is not None:
            progress(f"{name}: {shard.requests} requests, {len(shard.records)} blocks, {steps} steps in {seconds:.1f} s")
    return CollectResult(str(out), decoded, written, skipped_shards, skipped_prompts, time.perf_counter() - t0)


@dataclass(frozen=True)
class DecodedShard:
    records: list[BlockRecord]
    requests: int
    skipped_prompts: int  # too long for the model's positions


@dataclass(frozen=True)
class ShardDecoder:
    """Decodes plan positions first..first+count-1 draft-free. A request's records depend only on
    its plan position and the settings (the noise is keyed by request and seed), so shards can be
    decoded in any order and by any process."""

    order: list[int]  # plan position -> pair index (= request index)
    pairs: list[Pair]
    settings: CollectSettings
    policy: str
    hidden: Projection | None = None  # records the hidden states projected on it (settings.hidden_dims)
    raw_hidden: bool = False  # records them unprojected (to fit the projection on)

    def __call__(self, model: LoadedTarget, first: int, count: int) -> DecodedShard:
        s, k = self.settings, model.block_length
        records: list[BlockRecord] = []
        requests = skipped = 0
        for position in range(first, first + count):
            request = self.order[position]
            ids = encode_prompt(model, self.pairs[request].prompt, s.chat)
            if math.ceil((len(ids) + s.gen_length) / k) * k > model.max_positions:
                skipped += 1
                continue
            temperature = s.temperatures[position % len(s.temperatures)]
            config = DecodeConfig(
                policy=self.policy,
                threshold=s.threshold,
                block_length=k,
                gen_length=s.gen_length,
                sampling=Sampling(temperature=temperature),
                seed=s.seed,
            )
            hidden = self.raw_hidden or self.hidden is not None
            result = generate(model, ids, config, request=request, record=True, record_topk=s.topk, record_hidden=hidden)
            records += [
                BlockRecord(request, t.block, temperature, t.states, t.topk_logprobs, t.topk_ids,
                            t.hidden if self.raw_hidden else None if self.hidden is None else self.hidden(t.hidden).half())
                for t in result.trajectory
            ]
            requests += 1
        return DecodedShard(records, requests, skipped)


def _drafter_projections(path: str | Path, hidden_dims: int, embedding_dims: int) -> RefreshFile:
    """The SPOT-R file whose projections a collect records on, checked to project on the dims asked (before the target
    loads; its fingerprint is checked against the target once loaded)."""
    loaded = load_refresh(path)
    dims = (loaded.hidden.dims, loaded.embedding.dims)
    if (hidden_dims, embedding_dims) != dims:
        raise ValueError(f"--projections-from {path} projects on {dims[0]} hidden and {dims[1]} embedding components; pass "
                         f"--hidden-dims {dims[0]} --embedding-dims {dims[1]}")
    return loaded


FIT_ROWS = 50_000  # hidden-state rows the projection is fitted on at most (a seeded sample; 50 MB at d = 256)


def _with_projections(out: Path, model, decoder: ShardDecoder, todo: list,
                      given: tuple[Projection, Projection] | None = None) -> tuple[ShardDecoder, list, list]:
    """(the decoder that records projected hidden states, shards decoded here, shards left to decode).
    Without projections.pt yet, shard 0 is decoded first, unprojected; the projections are fitted on its
    hidden states and on the target's embeddings and written, and shard 0 is then projected like the rest.
    `given` (hidden, embedding) projections are written instead of fitted."""
    s = decoder.settings
    if (out / PROJECTIONS).is_file():
        recorded = read_projections(out)
        if given is not None and not same_projections(recorded, *given):
            raise ValueError(f"{out} holds trajectories recorded in other projections than the drafter's of --projections-from; "
                             "use another --out")
        return replace(decoder, hidden=Projection.from_dict(recorded["hidden"])), [], todo
    if given is not None:
        embeddings = model.embeddings().detach().float().cpu()  # [V, d]
        hidden, embedding = given
        write_projections(out, {"hidden": hidden.to_dict(), "embedding": embedding.to_dict(), "token_coords": embedding(embeddings)})
        return replace(decoder, hidden=hidden), [], todo
    if not todo or todo[0][0] != 0:
        raise ValueError(f"{out} has shards but no {PROJECTIONS}: delete the directory and collect again")
    index, first, count = todo[0]
    t0 = time.perf_counter()
    pilot = replace(decoder, raw_hidden=True)(model, first, count)
    rows = torch.cat([r.hidden.reshape(-1, r.hidden.shape[-1]) for r in pilot.records]).float()  # [N, d]
    if rows.shape[0] > FIT_ROWS:
        rows = rows[torch.randperm(rows.shape[0], generator=torch.Generator().manual_seed(s.seed))[:FIT_ROWS]]
    hidden = Projection.fit(rows, s.hidden_dims)
    embeddings = model.embeddings().detach().float().cpu()  # [V, d]
    embedding = Projection.fit(embeddings, s.embedding_dims)
    write_projections(out, {"hidden": hidden.to_dict(), "embedding": embedding.to_dict(), "token_coords": embedding(embeddings)})
    shard = replace(pilot, records=[replace(r, hidden=hidden(r.hidden).half()) for r in pilot.records])
    return replace(decoder, hidden=hidden), [(index, first, count, shard, time.perf_counter() - t0)], todo[1:]


def _decode_shards(todo, decoder, model, target, block_length, device, dtype, cache, workers, threads):
    """Yields (index, first, count, DecodedShard, seconds) per shard, in this process when workers
    is 1, else from a pool of `workers` processes with `threads` torch threads each (default: the
    cores shared out); the caller writes every shard, so only one process touches the directory."""
    if workers == 1 or len(todo) <= 1:
        for index, first, count in todo:
            t0 = time.perf_counter()
            yield index, first, count, decoder(model, first, count), time.perf_counter() - t0
        return
    threads = threads or max(1, (os.cpu_count() or 1) // workers)
    # spawn, not fork: a forked copy of a process that already ran torch ops can deadlock in OpenMP
    context = multiprocessing.get_context("spawn")
    init = (str(target), block_length, device, dtype, cache, threads, decoder)
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker, initargs=init) as pool:
        jobs = {pool.submit(_worker_decode, first, count): (index, first, count) for index, first, count in todo}
        for job in as_completed(jobs):
            shard, seconds = job.result()
            yield *jobs[job], shard, seconds


_WORKER: tuple[LoadedTarget, ShardDecoder] | None = None


def _start_worker(target: str, block_length: int | None, device: str, dtype, cache: str | None, threads: int,
                  decoder: ShardDecoder) -> None:
    global _WORKER
    torch.set_num_threads(threads)
    torch.set_grad_enabled(False)
    _WORKER = (load_target(target, block_length, device, dtype=dtype, cache=cache), decoder)


def _worker_decode(first: int, count: int) -> tuple[DecodedShard, float]:
    model, decoder = _WORKER
    t0 = time.perf_counter()
    return decoder(model, first, count), time.perf_counter() - t0
