"""`spot-eval check-target`: does a checkpoint's target keep the invariants the engine's exactness rests on? Meant
for a target plugin's family (spot_eval.checkpoints.model_types), and it holds for the built-in ones.

Every check runs the checkpoint's target as `load_target` loads it (on the CPU, in float32, in the exact verify
layout), at its block size K, on fixed random token ids (never the mask or an EOS), and compares two ways of
computing the same logits:

    cached = uncached   The active block's logits after two blocks were committed one at a time through the
                        stream's cache, against a fresh stream opened on the whole prefix. Block-causal targets: the
                        KV of a completed block never changes, so they agree; the attention kernel may round a
                        row whose keys the fresh forward masks otherwise (on AVX2 CPUs the softmax of a short
                        block runs through a scalar tail loop: 2e-6 at K = 4, 0 at K = 16), so they must agree bit
                        for bit or to ROUNDING of the largest |logit|; a model that ignores the mask, the positions
                        or the cache is off by far more. Bidirectional targets (the frozen-cache decoder,
                        spot.targets.dual_cache) are approximate by design: committing a block changes every
                        position's KV, and no cache equals the uncached forward. What they must keep is that the
                        decoder's cache holds nothing but its definition: the block-start forward over the committed
                        canvas and the KV it freezes, so a later step through a stream that committed two blocks
                        equals the same step of a fresh stream opened on that canvas, bit for bit.
    pieces              A verify of P pieces against P one-piece verifies of the same states: bit for bit, at the
                        block start (the prefix riding along, or the canvas forward) and against the cache.
    batch               One verify_batch over three streams (different prompts, different cache states, a cross
                        piece where the target takes them) against each stream's verify alone: bit for bit.
    cross pieces        Block-causal targets: a cross piece's next-block logits against the next block's own verify
                        once the finished block is committed (what DecodeConfig.cross_block relies on): bit for bit.
    reference           spot.generate at budget 0 against the plugin's own generate (ModelType.reference), token for
                        token; skipped, and said so, where the family gives none.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from spot import DecodeConfig, generate
from spot.targets.base import Call, LoadedTarget, Stream, Verified
from spot.targets.checkpoint import load_weights
from spot_eval.checkpoints import model_types
from spot_eval.checkpoints.target import load_target, read_target

ROUNDING = 1e-4  # cached = uncached on a block-causal target: |difference| within this fraction of the largest |logit|
PIECES = 5  # pieces per verify in the pieces check
LOGIT_AXES = ("piece", "position", "token")
HIDDEN_AXES = ("piece", "position", "dim")

CACHED, PIECEWISE, BATCH, CROSS, REFERENCE = (
    "cached logits equal uncached", "pieces equal one-piece verifies", "a batch of 3 equals each alone",
    "cross pieces equal the next block's verify", "draft-free decode equals the reference")


@dataclass(frozen=True)
class TargetCheck:
    """One invariant: what it compares and to what tolerance (`compares`), what the comparison found where it held
    (`note`), and the first counterexample with its numbers (None: it held). `skipped`: why it did not run (it then
    neither passed nor failed)."""

    name: str
    compares: str
    counterexample: str | None = None
    note: str = ""
    skipped: str | None = None

    @property
    def passed(self) -> bool:
        return self.counterexample is None

    @property
    def verdict(self) -> str:
        return "skip" if self.skipped else ("pass" if self.passed else "FAIL")


@dataclass(frozen=True)
class TargetReport:
    """What `check_target` found on one checkpoint directory."""

    path: str
    model_type: str
    origin: str  # "built in", or "package NAME VERSION"
    attention: str  # "block_causal" or "bidirectional"
    block_length: int
    cache: str | None  # a bidirectional target's frozen-cache decoder; None for a block-causal one
    checks: tuple[TargetCheck, ...]
    seconds: float

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def table(self) -> str:
        """One table a person reads at a glance: each check, pass/FAIL/skip, and its first counterexample (or what
        held, or why it was skipped)."""
        decoder = "block-causal" if self.cache is None else f"bidirectional, cache {self.cache}"
        width = max(len(c.name) for c in (*self.checks, TargetCheck("check", "")))
        lines = [f"spot-eval check-target {self.path}: model_type {self.model_type} ({self.origin}), {decoder}, "
                 f"K = {self.block_length}, CPU float32, {self.seconds:.1f} s", "",
                 f"  {'check':<{width}}  result  first counterexample"]
        for c in self.checks:
            lines.append(f"  {c.name:<{width}}  {c.verdict:<6}  {c.counterexample or c.skipped or c.note}".rstrip())
        lines += ["", "PASS: the target keeps every invariant the engine relies on" if self.passed else
                  "FAIL: see the first counterexample of each failed check"]
        return "\n".join(lines)


@dataclass(frozen=True)
class _Verify:
    """A verify call: pieces [P, K] (row 0 the current state) at the active block's `start`, cross pieces [C, 2K]."""

    pieces: torch.Tensor
    start: int
    ahead: torch.Tensor | None = None


@dataclass(frozen=True)
class _Commit:
    block: torch.Tensor  # [K] a finished block


@dataclass(frozen=True)
class _Request:
    """A stream opened on `prefix` ([L], a canvas of `positions`) and taken through `steps`, then its `final` verify
    (the one compared)."""

    prefix: torch.Tensor
    positions: int
    steps: tuple[_Verify | _Commit, ...]
    final: _Verify


def check_target(path: str | Path, block_length: int | None = None, cache: str | None = None) -> TargetReport:
    """Check the target in a checkpoint directory (see the module docstring), at `block_length` (default: the
    checkpoint's) and, for a bidirectional family, under the frozen-cache decoder `cache` (default dual).

    Raises:
        FileNotFoundError / ValueError (bad input): not a model directory, a model_type that no family or installed
        plugin declares, too few positions for the checks at this block length, a cache for a block-causal target.
    """
    started = time.perf_counter()
    checkpoint = read_target(path)
    k = checkpoint.info.block_size if block_length is None else block_length
    needed = 6 * k + 3  # the longest request below (the batch's third): 3 blocks of prompt and 3, a partial one
    if checkpoint.info.max_positions < needed:
        raise ValueError(f"{path}: the checks need {needed} positions at block length {k}, and the model has "
                         f"{checkpoint.info.max_positions}; pass a smaller --block-length")
    target = load_target(checkpoint, block_length, "cpu", exact=True, dtype=torch.float32, cache=cache)
    ids = _Ids(target)
    checks = [_cached(target, ids), _piecewise(target, ids), _batch(target, ids), _cross(target, ids)]
    reference = model_types.reference(checkpoint.info.model_type)
    if reference is None:
        checks.append(TargetCheck(REFERENCE, "spot.generate at budget 0 vs ModelType.reference, token for token",
                                  skipped="the family gives no reference generate function (ModelType.reference)"))
    else:
        prompt = ids.tokens(k + 3, seed=7).tolist()  # a partial block
        first = len(prompt) if target.blocks_at_prompt_end else 0  # where the blocks are counted from
        gen_length = 2 * k + (first - len(prompt) - 2 * k) % k  # the canvas ends on a whole block
        config = DecodeConfig(block_length=k, gen_length=gen_length, stop_at_eos=False)
        ours = list(generate(target, prompt, config).token_ids)
        del target  # the reference's model loads beside it otherwise
        checks.append(_reference(reference, load_weights(checkpoint, torch.float32).eval(), prompt, config, ours))
    attention = checkpoint.family.attention
    return TargetReport(str(path), checkpoint.info.model_type, model_types.origin(checkpoint.info.model_type), attention,
                        k, cache or ("dual" if attention == "bidirectional" else None), tuple(checks),
                        time.perf_counter() - started)


class _Ids:
    """Fixed random token ids and block states for one target: never the mask or an EOS, within the tokenizer's
    vocabulary where it is smaller than the model's (padded) one."""

    def __init__(self, target: LoadedTarget) -> None:
        self.k, self.mask = target.block_length, target.mask_id
        size = min(target.vocab_size, len(target.tokenizer)) if target.tokenizer is not None else target.vocab_size
        allowed = torch.arange(size)
        self.allowed = allowed[~torch.isin(allowed, torch.tensor([target.mask_id, *target.eos_ids]))]  # [n]
        self.at_prompt_end = target.blocks_at_prompt_end

    def tokens(self, n: int, seed: int) -> torch.Tensor:
        """[n] token ids."""
        g = torch.Generator().manual_seed(seed)
        return self.allowed[torch.randint(len(self.allowed), (n,), generator=g)]

    def states(self, n: int, seed: int) -> torch.Tensor:
        """[n, K] block states, each with a different share of its positions still masked (row 0: every one)."""
        g = torch.Generator().manual_seed(seed)
        states = self.tokens(n * self.k, seed).view(n, self.k).clone()
        masked = torch.rand(n, self.k, generator=g) < torch.linspace(1.0, 0.2, n)[:, None]
        states[masked] = self.mask
        states[0] = self.mask
        return states

    def prefix(self, blocks: int, seed: int) -> torch.Tensor:
        """A prompt of `blocks` whole blocks, and a partial one where blocks start at the prompt's end (the cache of a
        block-causal target holds whole blocks only)."""
        return self.tokens(blocks * self.k + (3 if self.at_prompt_end else 0), seed)


def _alone(target: LoadedTarget, request: _Request) -> Verified:
    """The final verify of `request` in a forward of its own."""
    return target.verify_batch([_call(target, request)])[0]


def _call(target: LoadedTarget, request: _Request) -> Call:
    """A fresh stream taken through the request's steps, and its final call."""
    stream: Stream = target.open(request.prefix, request.positions)
    for step in request.steps:
        if isinstance(step, _Commit):
            stream.commit(step.block)
        else:
            target.verify_batch([Call(stream, step.pieces, step.start, step.ahead)])
    final = request.final
    return Call(stream, final.pieces, final.start, final.ahead)


def _difference(got: torch.Tensor, want: torch.Tensor, axes: Sequence[str], got_is: str, want_is: str) -> tuple[float, str] | None:
    """None where `got` equals `want` bit for bit; else (the largest |difference|, where it is with both values)."""
    if got.shape != want.shape:
        return float("inf"), f"shapes {list(got.shape)} {got_is}, {list(want.shape)} {want_is}"
    if torch.equal(got, want):
        return None
    diff = (got.double() - want.double()).abs().nan_to_num(nan=float("inf"))
    at = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
    where = ", ".join(f"{axis} {i}" for axis, i in zip(axes, at, strict=True))
    return diff[at].item(), (f"{where}: {got[at].item():.9g} {got_is}, {want[at].item():.9g} {want_is} "
                             f"(max |difference| {diff[at].item():.3g})")


def _cached(target: LoadedTarget, ids: _Ids) -> TargetCheck:
    k = ids.k
    prefix = ids.prefix(1, seed=1)
    blocks = ids.tokens(2 * k, seed=2).view(2, k)
    start, positions = prefix.numel() + 2 * k, prefix.numel() + 4 * k
    states = ids.states(3, seed=3)
    opening = (_Verify(states[:1], start),)  # the block's first forward: the cache built, or the canvas frozen
    steps: list[_Verify | _Commit] = []
    for j, block in enumerate(blocks):  # each block verified (twice: a step against the frozen canvas), then committed
        at = prefix.numel() + j * k
        steps += [_Verify(states[:1], at), _Verify(states[1:2], at), _Commit(block)]
    cached = _alone(target, _Request(prefix, positions, (*steps, *opening), _Verify(states, start))).logits
    fresh = _alone(target, _Request(torch.cat([prefix, blocks.flatten()]), positions, opening, _Verify(states, start))).logits
    found = _difference(cached, fresh, LOGIT_AXES, "through the cache", "from a fresh stream")
    if target.cache is not None:  # a bidirectional target: its own recomputation, bit for bit
        compares = ("a step against the frozen cache after 2 blocks committed one at a time vs the same step of a "
                    "fresh stream opened on the committed canvas: bit for bit")
        return TargetCheck(CACHED, compares, found[1] if found else None, "bit for bit")
    compares = ("the active block's logits after 2 blocks committed one at a time through the cache vs a fresh "
                f"stream opened on the whole prefix: bit for bit, or within {ROUNDING:g} x the largest |logit|")
    if found is None:
        return TargetCheck(CACHED, compares, note="bit for bit")
    bound = ROUNDING * fresh.abs().max().item()
    if found[0] <= bound:
        return TargetCheck(CACHED, compares, note=f"to rounding: max |difference| {found[0]:.3g} <= {bound:.3g}")
    return TargetCheck(CACHED, compares, found[1])


def _piecewise(target: LoadedTarget, ids: _Ids) -> TargetCheck:
    prefix = ids.prefix(2, seed=4)
    start, positions = prefix.numel(), prefix.numel() + 2 * ids.k
    states = ids.states(PIECES, seed=5)
    built = (_Verify(states[:1], start),)  # the cache built (block-causal), the canvas frozen (bidirectional)
    compares = f"a verify of {PIECES} pieces vs {PIECES} one-piece verifies, at block start and against the cache: bit for bit"
    for case, history in (("at block start", ()), ("against the cache", built)):
        together = _alone(target, _Request(prefix, positions, history, _Verify(states, start))).logits
        for r in range(PIECES):
            # A bidirectional target's block start is row 0's canvas forward; the other rows go against what it froze.
            before = built if target.cache is not None and not history and r else history
            alone = _alone(target, _Request(prefix, positions, before, _Verify(states[r : r + 1], start))).logits
            found = _difference(together[r], alone[0], LOGIT_AXES[1:], f"among {PIECES}", "alone")
            if found:
                return TargetCheck(PIECEWISE, compares, f"{case}, piece {r} of {PIECES}, {found[1]}")
    return TargetCheck(PIECEWISE, compares, note="bit for bit")


def _batch(target: LoadedTarget, ids: _Ids) -> TargetCheck:
    k = ids.k
    requests = []
    for i, blocks in enumerate((1, 2, 3)):
        prefix = ids.prefix(blocks, seed=10 + i)
        start = prefix.numel()
        states = ids.states(2 + i, seed=20 + i)
        steps: tuple[_Verify | _Commit, ...] = ()
        if i % 2:  # a block verified and committed before: its KV cached, or the canvas frozen anew
            first = ids.tokens(k, seed=30 + i)
            steps, start = (_Verify(states[:1], start), _Commit(first)), start + k
        ahead = torch.cat([states[1:2], states[:1]], dim=1) if i == 2 and target.cross_block else None  # [1, 2K]
        requests.append(_Request(prefix, prefix.numel() + 3 * k, steps, _Verify(states, start, ahead)))
    together = target.verify_batch([_call(target, r) for r in requests])
    compares = "verify_batch over 3 streams (prompts of different lengths, in different cache states) vs each alone: bit for bit"
    for i, (request, batched) in enumerate(zip(requests, together, strict=True)):
        alone = _alone(target, request)
        for what, got, want, axes in (("logits", batched.logits, alone.logits, LOGIT_AXES),
                                      ("hidden states", batched.hidden, alone.hidden, HIDDEN_AXES)):
            found = _difference(got, want, axes, "in the batch", "alone")
            if found:
                return TargetCheck(BATCH, compares, f"stream {i} ({request.prefix.numel()}-token prompt), {what}, {found[1]}")
    return TargetCheck(BATCH, compares, note="bit for bit")


def _cross(target: LoadedTarget, ids: _Ids) -> TargetCheck:
    compares = "a cross piece's next-block logits vs the next block's own verify once the finished block is committed: bit for bit"
    if not target.cross_block:
        return TargetCheck(CROSS, compares, skipped="a bidirectional target takes no cross pieces")
    k = ids.k
    prefix = ids.prefix(2, seed=40)
    start, positions = prefix.numel(), prefix.numel() + 3 * k
    states = ids.states(2, seed=41)  # row 0 the current state, row 1 the next block's first state
    finished = ids.tokens(k, seed=42)
    built = (_Verify(states[:1], start),)
    crossed = _alone(target, _Request(prefix, positions, built, _Verify(states[:1], start, torch.cat([finished, states[1]])[None])))
    following = _alone(target, _Request(prefix, positions, (*built, _Commit(finished)), _Verify(states[1:], start + k)))
    found = _difference(crossed.logits[1:], following.logits, LOGIT_AXES, "from the cross piece", "from the next verify")
    return TargetCheck(CROSS, compares, found[1] if found else None, "bit for bit")


def _reference(reference, model, prompt: list[int], config: DecodeConfig, ours: list[int]) -> TargetCheck:
    """spot-eval's draft-free tokens `ours` against the plugin's generate on `prompt` (`ModelType.reference`)."""
    compares = (f"spot.generate at budget 0 vs ModelType.reference on a {len(prompt)}-token prompt, {config.gen_length} "
                "tokens: token for token")
    try:
        with torch.inference_mode():
            out = reference(model, list(prompt), config)
        theirs = [int(t) for t in (out.tolist() if isinstance(out, torch.Tensor) else out)]
    except Exception as err:  # the plugin's function: its failure is the check's finding
        return TargetCheck(REFERENCE, compares, f"the reference raised {type(err).__name__}: {err}")
    for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):  # a length difference is reported after
        if a != b:
            return TargetCheck(REFERENCE, compares, f"token {i} of {len(ours)}: spot-eval {a}, the reference {b}")
    if len(ours) != len(theirs):
        return TargetCheck(REFERENCE, compares, f"spot-eval gave {len(ours)} tokens, the reference {len(theirs)} (the "
                                                "same up to the shorter)")
    return TargetCheck(REFERENCE, compares, note=f"the same {len(ours)} tokens")
