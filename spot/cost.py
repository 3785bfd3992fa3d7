"""Measuring what a verify forward and a drafted tree cost on this device (for budget=auto).

A short, bounded probe: for a few context lengths L and piece counts P, the median seconds of
`target.verify` over P pieces after L positions of cache, over interleaved rounds. The
result is plain data (`spot.sizing.VerifyCost`); spot_eval caches it per device, target, dtype and
block length. The drafter's seconds per tree are measured the same way on a probe state.

Both are timed as the engine runs them: each timed call follows the work that precedes it in a
decode (a verify forward is followed by the policy's step on its logits, a draft by a verify
forward and that step), not back to back. Back to back, the caches stay warm with the one
operation being timed, and on the 2-core CPU that understated a piece's cost (c(2)/c(1) 1.1-1.3
measured, 1.34 inside decoding) and halved the drafter's (2.4 ms against 4.6 ms per tree inside
decoding).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch

from spot.config import DecodeConfig
from spot.drafters.base import DraftContext, Drafter
from spot.noise import block_noise, silent
from spot.policy import decide
from spot.sizing import VerifyCost
from spot.targets.base import Target

PIECES = (1, 2, 3, 5, 9, 21)  # the curve's knots: where a budget 0, 1, 2, 4, 8, 20 tree sits
REPEATS = 3


def probe_contexts(target: Target, gen_length: int = 256) -> tuple[int, ...]:
    """Two context lengths, in whole blocks: a short prompt, and one as long as a prompt of two
    blocks plus `gen_length` (the far end of a typical request)."""
    k = target.block_length
    far = min(-(-(2 * k + gen_length) // k) * k, (target.max_positions // k - 1) * k)
    return tuple(sorted({k, max(far, k)}))


def probe_prefix(target: Target, context: int) -> torch.Tensor:
    """[context] a fixed prefix of ordinary tokens (never the mask): the timing does not depend on the
    values, only on the shapes."""
    ids = torch.arange(context, dtype=torch.long) % max(target.vocab_size - 1, 1)
    return torch.where(ids == target.mask_id, ids + 1, ids)


def measure_verify(
    target: Target,
    contexts: Sequence[int],
    pieces: Sequence[int] = PIECES,
    repeats: int = REPEATS,
    time_limit: float = 2.0,
    max_rounds: int = 15,
) -> VerifyCost:
    """The median verify seconds on the grid contexts x pieces, over rounds that each time every point
    once (so that a drift of the machine's speed spreads over all points alike): at least `repeats`
    rounds, more while the probe has run under `time_limit` seconds, at most `max_rounds`. Piece
    counts past what fits in memory (`target.max_pieces`) are left out."""
    started = time.perf_counter()
    k = target.block_length
    fits = [p for p in pieces if p <= max(min(target.max_pieces(c) for c in contexts), 1)]
    state = torch.full((k,), target.mask_id, dtype=torch.long)
    times: dict[tuple[int, int], list[float]] = {(c, p): [] for c in contexts for p in fits}
    config = DecodeConfig(block_length=k)
    rounds = 0
    while rounds < repeats or (rounds < max_rounds and time.perf_counter() - started < time_limit):
        for context in contexts:
            target.start(probe_prefix(target, context), context + k)
            target.verify(state[None], context)  # builds the prefix cache (and warms up)
            for p in fits:
                t = time.perf_counter()
                logits = target.verify(state.expand(p, k).clone(), context)  # [P, K, V]
                times[context, p].append(time.perf_counter() - t)
                decide(state, logits[0], None, config, target.mask_id)  # what follows a forward in decoding
        rounds += 1
    seconds = tuple(tuple(statistics.median(times[c, p]) for p in fits) for c in contexts)
    return VerifyCost(tuple(fits), tuple(contexts), seconds)


def measure_drafter(drafter: Drafter, target: Target, config: DecodeConfig, mode: str | None = None, repeats: int = 7) -> float:
    """The median seconds of one `drafter.draft` at `config.budget` in `mode`, on a probe state of the
    first block after one block of context, a step into the block (so there are stale logits to read)."""
    k = target.block_length
    target.start(probe_prefix(target, k), 2 * k)
    root = torch.full((k,), target.mask_id, dtype=torch.long)
    stale = target.verify(root[None], k)[0]  # [K, V]
    hidden = target.hidden[0]  # [K, d] behind it, what a drafter reading hidden states (SPOT-R) drafts from
    state = root.clone()
    state[0] = int(stale[0].argmax())

    noise = block_noise(config.seed, 0, 1, k, target.vocab_size, target.device) if config.noisy else silent
    ctx = DraftContext(state, stale, root, stale, config, target.mask_id, 0, 1, 1, config.budget, noise, mode, hidden,
                       model_dtype=target.logits_dtype)
    drafter.draft(ctx)  # warm-up
    times = []
    for _ in range(repeats):
        logits = target.verify(state[None], k)  # what precedes a draft in decoding: a forward and a step
        decide(state, logits[0], noise(1), config, target.mask_id, 1, model_dtype=target.logits_dtype)
        t = time.perf_counter()
        drafter.draft(ctx)
        times.append(time.perf_counter() - t)
    return statistics.median(times)
