"""`spot-eval check-method`: does a method keep every output the draft-free decoder's, and does its drafter keep the
contract, across the grid the built-in methods' property tests use? And how many forwards does it save beside
FreeDave and SPOT?

The grid's factors are those the engine's property tests cross (tests/test_engine.py): the policy (single,
threshold, static, dynamic), the temperature (0, and 1 with the coupled noise), the dtype (float32, bfloat16), the
batch size (1, 3), the verify layout (exact, packed) and cross_block (off, on), with seeds and budgets cycling
over the cells. The full grid is every combination; `quick` is a set of cells that holds every pair of factor
values at least once (`pairwise`), which finds the defects that two settings together cause.

On every cell the method decodes the same prompts as the draft-free decoder at the same settings, through the
engine as a run would, with its drafter watched (`_Probe`):
    lossless        every output token-identical to draft-free's;
    no exception    the drafter raised nothing (the first exception with its cell);
    trees           every tree well formed: root the state, within the budget, parents a tree, tokens in the
                    vocabulary, only masked positions filled (spot.tree.defect, which the engine applies);
    deterministic   a second draft of the same context gives the same tree;
    untouched       the context's tensors, config and noise are as the engine handed them after the draft;
    draft_batch     where it has one, each tree equals what `draft` gives for its context alone.
Whatever a drafter does, the engine keeps the output exact (spot.drafters.base); these checks say where the
drafter breaks the contract all the same (a write into its inputs corrupts its own later drafts).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from spot import DecodeConfig, Generation, Request, Sampling, generate_batch
from spot.drafters.base import DraftContext, DraftError, name_of
from spot.tree import DraftTree
from spot_eval import registry
from spot_eval.checkpoints.shipped import EMBEDDED_TARGET
from spot_eval.checkpoints.target import load_target
from spot_eval.harness.methods import MethodSpec, build_drafter
from spot_eval.method import Method, PluginError

FACTORS: dict[str, tuple] = {
    "policy": ("single", "threshold", "static", "dynamic"),
    "temperature": (0.0, 1.0),
    "dtype": ("float32", "bfloat16"),
    "batch": (1, 3),
    "exact": (True, False),
    "cross_block": (False, True),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SEEDS = (0, 1, 2)
BUDGETS = (2, 4, 8)  # cycled over the cells
RIVALS = ("freedave", "spot")  # what the forwards saved are shown beside
RANK_BUDGET = 8
THRESHOLD = 0.9  # threshold and dynamic's tau (the decoder's default)

LOSSLESS, RAISES, TREES, DETERMINISTIC, UNTOUCHED, BATCH = (
    "outputs equal draft-free's", "drafter raises nothing", "trees well formed", "same context, same tree",
    "context left untouched", "draft_batch equals draft")
CHECKS = (LOSSLESS, RAISES, TREES, DETERMINISTIC, UNTOUCHED, BATCH)


@dataclass(frozen=True)
class Cell:
    """One setting of the grid."""

    policy: str
    temperature: float
    dtype: str
    batch: int
    exact: bool
    cross_block: bool
    seed: int
    budget: int

    def __str__(self) -> str:
        return (f"{self.policy}, T = {self.temperature:g}, {self.dtype}, batch {self.batch}, "
                f"{'exact' if self.exact else 'packed'} layout, cross_block {'on' if self.cross_block else 'off'}, "
                f"seed {self.seed}, budget {self.budget}")


@dataclass(frozen=True)
class Check:
    """One check over the cells: on how many it ran, and the first counterexample (None: it held on every one)."""

    name: str
    cells: int
    counterexample: str | None = None

    @property
    def passed(self) -> bool:
        return self.counterexample is None


@dataclass(frozen=True)
class Saved:
    """Forwards saved (draft-free forwards / the method's, summed over the prompts) at one budget, T and policy."""

    label: str
    forward_ratio: float | None  # None: the method could not run here (the reason in `note`)
    note: str = ""


@dataclass(frozen=True)
class MethodReport:
    """What `check_method` found: each check, the drafter's seconds per draft (median and 90th percentile) beside
    the verify forward's, and the forwards saved beside the rivals'."""

    method: str
    origin: str
    quick: bool
    cells: tuple[Cell, ...]
    checks: tuple[Check, ...]
    draft_seconds: tuple[float, float] | None
    verify_seconds: float | None
    saved: tuple[Saved, ...]
    prompts: int
    skipped: tuple[str, ...] = ()
    seconds: float = 0.0
    target: str = "the embedded target"

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def table(self) -> str:
        """One table a person reads at a glance: each check pass/fail with its first counterexample, the drafter's
        time per draft, and the forwards saved beside FreeDave and SPOT."""
        width = max(len(c.name) for c in self.checks)
        lines = [f"spot-eval check-method {self.method} ({self.origin}): {len(self.cells)} "
                 f"{'quick ' if self.quick else ''}cells of the grid x {self.prompts} prompts on {self.target}, "
                 f"{self.seconds:.0f} s", ""]
        for c in self.checks:
            verdict = "n/a " if c.cells == 0 else ("pass" if c.passed else "FAIL")
            lines.append(f"  {c.name:<{width}}  {verdict}  {c.cells:>3} cells" + (f"  first: {c.counterexample}" if c.counterexample else ""))
        if self.draft_seconds is not None:
            median, p90 = self.draft_seconds
            beside = f"; a verify forward {1e3 * self.verify_seconds:.2f} ms" if self.verify_seconds else ""
            lines.append(f"  {'time per draft':<{width}}  {1e3 * median:.2f} ms median, {1e3 * p90:.2f} ms p90{beside}")
        lines += [f"  {s}" for s in self.skipped]
        if self.saved:
            shown = "   ".join(f"{s.label} {s.forward_ratio:.2f}x" if s.forward_ratio is not None else f"{s.label} ({s.note})"
                               for s in self.saved)
            lines += ["", f"forwards saved (draft-free's / the method's), single commit, T = 0, budget {RANK_BUDGET}, "
                          f"{self.prompts} prompts:", f"  {shown}"]
        lines += ["", "PASS: every output equals draft-free's and the drafter keeps the contract" if self.passed else
                  "FAIL: see the first counterexample of each failed check"]
        return "\n".join(lines)


def pairwise(factors: dict[str, tuple]) -> list[dict]:
    """Rows (factor -> value) that hold every pair of values of every two factors at least once: greedily, each
    row the candidate that covers the most pairs still missing (the first such in product order), so the result is
    the same on every machine."""
    names = list(factors)
    missing = {((a, va), (b, vb)) for a, b in itertools.combinations(names, 2) for va in factors[a] for vb in factors[b]}
    candidates = [dict(zip(names, values, strict=True)) for values in itertools.product(*factors.values())]

    def covers(row: dict) -> set:
        return {((a, row[a]), (b, row[b])) for a, b in itertools.combinations(names, 2)} & missing

    rows = []
    while missing:
        best = max(candidates, key=lambda row: len(covers(row)))
        missing -= covers(best)
        rows.append(best)
    return rows


def grid(quick: bool, budgets: Sequence[int] = BUDGETS) -> tuple[Cell, ...]:
    """The cells: every pair of factor values (`quick`) or every combination, seeds and budgets cycling."""
    rows = pairwise(FACTORS) if quick else [dict(zip(FACTORS, v, strict=True)) for v in itertools.product(*FACTORS.values())]
    return tuple(Cell(**row, seed=SEEDS[i % len(SEEDS)], budget=budgets[i % len(budgets)]) for i, row in enumerate(rows))


def prompts(target, count: int) -> list[list[int]]:
    """`count` prompts as the benchmark's tasks ask them, in turn GSM8K, MBPP and HumanEval test items, in the chat
    template where the tokenizer has one: what a method meets in a run."""
    from spot_eval.data.datasets import load, mbpp_split

    gsm8k, mbpp, humaneval = load("gsm8k_test"), mbpp_split("test"), load("humaneval_test")
    texts = []
    for i in range(count):
        which, n = i % 3, i // 3
        if which == 0:
            texts.append(gsm8k[n]["question"])
        elif which == 1:
            texts.append(mbpp[n]["text"] + "\n" + "\n".join(mbpp[n]["test_list"]))
        else:
            texts.append("Write a solution to the following problem and make sure that it passes the tests:\n"
                         f"```python\n{humaneval[n]['prompt']}\n```\n")
    tokenizer = target.tokenizer
    if getattr(tokenizer, "chat_template", None):
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)
                 for t in texts]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def check_method(method: str | Method, path: str | None = None, quick: bool = False, checkpoint=EMBEDDED_TARGET,
                 progress: Callable[[str], None] | None = None) -> MethodReport:
    """Run `method` (a registered name, or a Method) over the grid on `checkpoint` (a target's folder; default: the
    embedded target); see the module docstring.

    path: the method's file (a learned method; default: the shipped one for a built-in). `quick`: the pairwise
    cells, 3 prompts and 48 new tokens (about a minute on a CPU); else every cell, 6 prompts and 96 tokens.
    """
    started = time.perf_counter()
    say = progress or (lambda line: None)
    method, origin = _resolve(method)
    gen_length, count = (48, 3) if quick else (96, 6)
    cells = grid(quick)
    targets: dict[tuple[str, bool], object] = {}
    probe_log = _Log()
    references: dict[tuple, list[Generation]] = {}
    ran: dict[str, int] = dict.fromkeys(CHECKS, 0)
    found: dict[str, str] = {}
    skipped: list[str] = []
    ids = None
    for n, cell in enumerate(cells, start=1):
        key = (cell.dtype, cell.exact)
        if key not in targets:
            targets[key] = load_target(checkpoint, None, "cpu", cell.exact, DTYPES[cell.dtype])
        target = targets[key]
        ids = ids or prompts(target, count)
        config = _config(cell, target.block_length, gen_length)
        ref_key = (key, cell.policy, cell.temperature, cell.seed, cell.batch)
        if ref_key not in references:
            references[ref_key] = generate_batch(target, [Request(p, config, number=i) for i, p in enumerate(ids)], cell.batch)
        say(f"cell {n}/{len(cells)}: {cell}")
        try:
            drafters = _drafters(method, origin, target, cell, path, references[ref_key], ids, config)
        except (ValueError, FileNotFoundError) as err:  # a built-in's file for this policy does not ship
            skipped.append(f"skipped {cell}: {err}")
            continue
        probes = [_Probe(d, probe_log, str(cell)) for d in drafters]
        requests = [Request(p, replace(config, budget=cell.budget, acceptance=method.acceptance), probes[i % len(probes)], number=i)
                    for i, p in enumerate(ids)]
        for name in (LOSSLESS, RAISES, TREES, DETERMINISTIC, UNTOUCHED):
            ran[name] += 1
        ran[BATCH] += int(getattr(drafters[0], "draft_batch", None) is not None and cell.batch > 1)
        try:
            got = generate_batch(target, requests, cell.batch)
        except DraftError as err:
            found.setdefault(RAISES if err.__cause__ is not None else TREES, f"{cell}: {err}")
            continue
        if cell.batch == 1 and cell.dtype == "float32":  # a verify forward's own seconds, for scale
            probe_log.verify += [t.verify_seconds for g in got for t in g.stats.timings]
        for i, (mine, theirs) in enumerate(zip(got, references[ref_key], strict=True)):
            if mine.token_ids != theirs.token_ids and not method.lossy:
                at = next((j for j, (a, b) in enumerate(zip(mine.token_ids, theirs.token_ids, strict=False)) if a != b),
                          min(len(mine.token_ids), len(theirs.token_ids)))
                found.setdefault(LOSSLESS, f"{cell}, prompt {i}: first differs at new token {at}")
    for name, said in (("written", UNTOUCHED), ("unstable", DETERMINISTIC), ("batch", BATCH)):
        if getattr(probe_log, name) is not None:
            found.setdefault(said, getattr(probe_log, name))
    checks = tuple(Check(name, ran[name], found.get(name)) for name in CHECKS)
    say("forwards saved beside the rivals")
    fp32 = targets.get(("float32", False)) or load_target(checkpoint, None, "cpu", False, torch.float32)
    saved = _saved(method, origin, path, fp32, ids, gen_length)
    draft = None
    if probe_log.seconds:
        ordered = sorted(probe_log.seconds)
        draft = (statistics.median(ordered), ordered[int(0.9 * (len(ordered) - 1))])
    return MethodReport(method.name, origin, quick, cells, checks, draft,
                        statistics.median(probe_log.verify) if probe_log.verify else None, saved, count, tuple(skipped),
                        time.perf_counter() - started, "the embedded target" if str(checkpoint) == str(EMBEDDED_TARGET) else str(checkpoint))


def _resolve(method: str | Method) -> tuple[Method, str]:
    if isinstance(method, Method):
        known = registry.entries().get(method.name)
        return method, str(known.origin) if known is not None and known.method is method else "given as a Method"
    entry = registry.entry(method)
    return entry.method, str(entry.origin)


def _config(cell: Cell, block_length: int, gen_length: int) -> DecodeConfig:
    steps = block_length // 4 if cell.policy in ("static", "dynamic") else None  # k_s = 4: several commits a step
    return DecodeConfig(policy=cell.policy, threshold=THRESHOLD, steps=steps, block_length=block_length, gen_length=gen_length,
                        sampling=Sampling(temperature=cell.temperature), seed=cell.seed, cross_block=cell.cross_block)


def _drafters(method: Method, origin: str, target, cell: Cell, path: str | None, references: list[Generation],
              ids: list[list[int]], config: DecodeConfig) -> list:
    """The method's drafter for the cell (one per prompt for a method that reads each request's draft-free decode)."""
    if method.needs_reference:
        recorded = [generate_batch(target, [Request(p, config, number=i)], 1, record=True)[0] for i, p in enumerate(ids)]
        return [_build(method, origin, target, cell, path, r) for r in recorded]
    return [_build(method, origin, target, cell, path)]


def _build(method: Method, origin: str, target, cell: Cell, path: str | None, reference: Generation | None = None):
    known = registry.entries().get(method.name)
    if known is not None and known.method is method:
        return build_drafter(MethodSpec(method.name, cell.budget, path), target, cell.policy, reference, THRESHOLD)
    from spot_eval.method import Build

    try:
        return method.build(Build(target, cell.policy, cell.budget, False, path, reference, THRESHOLD))
    except Exception as err:
        raise PluginError(f"method {method.name} ({origin}) failed to build its drafter: {type(err).__name__}: {err}") from err


def _saved(method: Method, origin: str, path: str | None, target, ids: list[list[int]], gen_length: int) -> tuple[Saved, ...]:
    """Forwards saved at RANK_BUDGET, single commit, T = 0, by the method and each rival."""
    config = DecodeConfig(block_length=target.block_length, gen_length=gen_length)
    base = sum(g.stats.forwards for g in generate_batch(target, [Request(p, config, number=i) for i, p in enumerate(ids)], 1))
    cell = Cell("single", 0.0, "float32", 1, False, False, 0, RANK_BUDGET)
    out = []
    for name in dict.fromkeys((method.name, *RIVALS)):
        try:
            entry = method if name == method.name else registry.entry(name).method
            drafter = _build(entry, origin if name == method.name else "built in", target, cell, path if name == method.name else None)
            got = generate_batch(target, [Request(p, replace(config, budget=RANK_BUDGET), drafter, number=i)
                                          for i, p in enumerate(ids)], 1)
            out.append(Saved(f"{name}@{RANK_BUDGET}", base / sum(g.stats.forwards for g in got)))
        except (DraftError, PluginError, ValueError, FileNotFoundError) as err:
            reason = str(err).splitlines()[0]
            out.append(Saved(f"{name}@{RANK_BUDGET}", None, "did not run: " + (reason if len(reason) <= 100 else reason[:99] + "…")))
    return tuple(out)


@dataclass
class _Log:
    """What the probes saw, over every cell: the drafter's seconds per draft, and the first breach of each kind."""

    seconds: list[float] = field(default_factory=list)
    verify: list[float] = field(default_factory=list)
    written: str | None = None
    unstable: str | None = None
    batch: str | None = None


_TENSORS = ("state", "stale_logits", "stale_state", "prior_logits", "stale_hidden", "prefix")


class _Probe:
    """A drafter under observation: each draft timed, its context compared before and after, drafted again on a copy
    of the same context (determinism), and `draft_batch`'s trees compared with `draft`'s. Breaches go to the log
    with the cell; the trees pass on unchanged, for the engine to check and verify."""

    def __init__(self, inner: object, log: _Log, cell: str) -> None:
        self.inner, self.log, self.cell = inner, log, cell
        self.name = name_of(inner)

    def __getattr__(self, attribute: str) -> object:
        return getattr(self.inner, attribute)

    def draft(self, ctx: DraftContext) -> DraftTree:
        kept = _Kept.of(ctx)
        seen, watched = _watched(ctx)
        t = time.perf_counter()
        tree = self.inner.draft(watched)
        self.log.seconds.append(time.perf_counter() - t)
        self._compare(kept, ctx, seen)
        again = self.inner.draft(kept.fresh())
        if self.log.unstable is None and not _same(tree, again):
            self.log.unstable = f"{self.cell}: block {ctx.block}, step {ctx.step}: two drafts of one context differ"
        return tree

    @property
    def draft_batch(self) -> Callable[[Sequence[DraftContext]], list] | None:
        batch = getattr(self.inner, "draft_batch", None)
        if batch is None:
            return None

        def observed(ctxs: Sequence[DraftContext]) -> list:
            kept = [_Kept.of(c) for c in ctxs]
            pairs = [_watched(c) for c in ctxs]
            t = time.perf_counter()
            trees = batch([w for _, w in pairs])
            seconds = time.perf_counter() - t
            self.log.seconds += [seconds / max(len(ctxs), 1)] * len(ctxs)
            for k, c, (seen, _) in zip(kept, ctxs, pairs, strict=True):
                self._compare(k, c, seen)
            if isinstance(trees, (list, tuple)) and len(trees) == len(ctxs):
                for i, (k, tree) in enumerate(zip(kept, trees, strict=True)):
                    if self.log.batch is None and not _same(tree, self.inner.draft(k.fresh())):
                        self.log.batch = f"{self.cell}: context {i} of {len(ctxs)}: its draft_batch tree differs from draft's"
            return trees

        return observed

    def _compare(self, kept: _Kept, ctx: DraftContext, seen: list) -> None:
        if self.log.written is None:
            what = kept.changed(ctx) or next((f"the noise of step {s}" for s, got, copy_ in seen if not torch.equal(got, copy_)), None)
            if what is not None:
                self.log.written = f"{self.cell}: block {ctx.block}, step {ctx.step}: the drafter wrote into {what}"


@dataclass(frozen=True)
class _Kept:
    """A context's values as the engine handed them over."""

    ctx: DraftContext
    tensors: dict
    config: DecodeConfig

    @classmethod
    def of(cls, ctx: DraftContext) -> _Kept:
        tensors = {n: getattr(ctx, n).clone() for n in _TENSORS if getattr(ctx, n) is not None}
        return cls(ctx, tensors, copy.deepcopy(ctx.config))

    def changed(self, ctx: DraftContext) -> str | None:
        for name, value in self.tensors.items():
            now = getattr(ctx, name)
            if now.shape != value.shape or not torch.equal(now, value):
                return f"ctx.{name}"
        return "ctx.config" if ctx.config != self.config else None

    def fresh(self) -> DraftContext:
        """The same context again, in new copies."""
        return replace(self.ctx, config=copy.deepcopy(self.config), **{n: v.clone() for n, v in self.tensors.items()})


def _watched(ctx: DraftContext) -> tuple[list, DraftContext]:
    """`ctx` with its noise function keeping each tensor it hands out and a copy, to see writes into them."""
    seen: list[tuple[int, torch.Tensor, torch.Tensor]] = []

    def gumbel(step: int) -> torch.Tensor | None:
        noise = ctx.gumbel(step)
        if noise is not None:
            seen.append((step, noise, noise.clone()))
        return noise

    return seen, dataclasses.replace(ctx, gumbel=gumbel)


def _same(a: object, b: object) -> bool:
    """Whether two drafts are the same tree (anything else compares by type: the engine names a malformed one)."""
    if not (isinstance(a, DraftTree) and isinstance(b, DraftTree)):
        return type(a) is type(b)
    return (isinstance(a.states, torch.Tensor) and isinstance(b.states, torch.Tensor) and a.states.shape == b.states.shape
            and torch.equal(a.states.cpu(), b.states.cpu()) and tuple(map(tuple, a.parents)) == tuple(map(tuple, b.parents)))
