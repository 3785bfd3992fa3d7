"""The speculative engine: draft, verify in one forward, accept, commit.

Every block of a request is decoded by one loop, `_decode_block`:

    while the block is not finished:
        tree <- draft(state)                the drafter's candidate future states, the current one as root
        out  <- verify(tree)                one target forward over every node (its logits at each)
        path <- walk(tree, out)             the target's own steps through them (spot.verify): >= 1
        commit(path)                        the block's trajectory, and the drafter's next inputs

Budget 0 *is* the draft-free decoder: the tree is the root alone, the walk takes the one step the root's
logits give, and nothing else changes. Every method therefore runs this one loop. Two thin layers sit
around it: budget=auto (spot.sizing) decides the drafter's mode and tree size once per block and cuts each
tree to the prefix that pays most; cross_block verifies the next block's first state behind a drafted node
that finishes the block, so that the next block's first step needs no forward.

Batching: a request's decoding is a generator that yields each tree it needs drafted (`_Draft`) and each
verify it needs (`Call`), and resumes with their outputs; `generations` runs up to B of them at once, every
round one `draft_batch` call per drafter over all the requests drafting and one `Target.verify_batch`
forward over all their calls, and admits the next waiting request as soon as one finishes (continuous
batching). What a request decodes depends on its own inputs only (bit for bit in the exact layout; the
drafters' models are row-invariant), so `generate`, one request, is batching at B = 1.

Glossary (see also spot.verify and spot.policy):
    node           a candidate block state in the draft tree; node 0 is the current state.
    piece          a node's full copy of the block in the verify forward.
    finished       a block is finished when no mask precedes the first EOS or the generation end.
    stale logits   the logits behind the block's last step, which the drafter reads for the next tree.

Shapes: K block length, V vocabulary, N draft nodes.
"""

from __future__ import annotations

import copy
import math
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import torch

from spot.acceptance import Acceptance, acceptance_of
from spot.config import DecodeConfig
from spot.drafters.base import DraftContext, Drafter, checked, draft_all
from spot.noise import block_noise, silent
from spot.policy import Proposal, topk_logprobs
from spot.sizing import ForwardTiming, Plan, Sizing
from spot.stopping import cut_at_stop
from spot.targets.base import Call, Stream, Target
from spot.tree import DraftTree
from spot.verify import Step, StepRule, walk


@dataclass(frozen=True)
class BlockTrace:
    """The trajectory of one block: states[s] is the state before step s.

    states: [S + 1, K] int64; row 0 the initial state, the last row the finished block.
    topk_logprobs, topk_ids: [S, K, k] the top-k of log-softmax of the logits at states[s] (the
        logits step s was decided on; the mask token excluded), with record_topk=k > 0.
    proposals: per step, the proposal it was decided on, token margins included (with
        record_margins=True): how near each decision came to another outcome (`spot.policy.Margins`),
        which tells a numerics tie from a bug when another run of the same request diverges.
    hidden: [S, K, d] the target's last hidden states (its LM-head inputs) at states[s], behind the
        logits of step s (with record_hidden=True; on the CPU, in the target's dtype).
    """

    block: int
    states: torch.Tensor
    topk_logprobs: torch.Tensor | None = None
    topk_ids: torch.Tensor | None = None
    proposals: tuple[Proposal, ...] | None = None
    hidden: torch.Tensor | None = None


@dataclass(frozen=True)
class DecodeStats:
    forwards: int  # target forwards this request took part in (the prompt's and finished blocks' KV ride along)
    steps: int  # policy steps (commit steps) taken
    accepted_lengths: tuple[int, ...]  # steps advanced per verify forward (>= 1 each)
    seconds: float  # from the request's admission to its end (at batch B > 1, shared with the others)
    timings: tuple[ForwardTiming, ...]  # every verify forward, with its draft (budget=auto refits its costs by them)

    @property
    def draft_nodes(self) -> int:
        """Draft nodes verified, root pieces excluded."""
        return sum(t.pieces - 1 for t in self.timings)

    @property
    def target_seconds(self) -> float:
        return sum(t.verify_seconds for t in self.timings)

    @property
    def drafter_seconds(self) -> float:
        return sum(t.draft_seconds for t in self.timings)

    @property
    def other_seconds(self) -> float:
        return self.seconds - self.target_seconds - self.drafter_seconds

    @property
    def mean_tree_size(self) -> float:
        """Draft nodes per verify forward (budget=auto chooses it step by step)."""
        return self.draft_nodes / max(len(self.accepted_lengths), 1)


@dataclass(frozen=True)
class Generation:
    token_ids: tuple[int, ...]  # new tokens, cut before EOS / a stop string / at gen_length; every one with stop_at_eos=False
    text: str | None  # the decoded tokens before the first EOS and stop string (when a decode function was given)
    finish_reason: str  # "eos" | "stop" | "length"
    stats: DecodeStats
    trajectory: tuple[BlockTrace, ...] | None  # with record=True


def finished(state: torch.Tensor, lo: int, hi: int, mask_id: int, eos_ids: frozenset[int]) -> bool:
    """True when the output of this block is settled: scanning generated positions lo..hi-1 in
    order, an EOS comes before any mask, or no mask remains."""
    for token in state[lo:hi].tolist():
        if token == mask_id:
            return False
        if token in eos_ids:
            return True
    return True


@dataclass(frozen=True)
class Request:
    """One prompt to decode, and how: what `generate` takes beside the target, for `generations`."""

    prompt_ids: Sequence[int] | torch.Tensor
    config: DecodeConfig
    drafter: Drafter | None = None
    number: int = 0  # the request's number in the noise key (spot.noise.step_key): `generate`'s `request`
    sizing: Sizing | None = None


@dataclass(frozen=True)
class _Draft:
    """What a decoding waits on before its verify: `drafter`'s tree for `ctx`."""

    drafter: Drafter
    ctx: DraftContext


@dataclass(frozen=True)
class _Drafted:
    """What a decoding resumes with after its _Draft: the tree (as the drafter returned it, until `_draft` checked it)
    and the drafting call's seconds; `drafted`: the nodes the drafter returned, of which budget=auto may verify fewer."""

    tree: DraftTree | object
    seconds: float
    drafted: int = 0


@dataclass(frozen=True)
class _Reply:
    """What a decoding resumes with after its Call: the call's outputs and the forward's seconds."""

    logits: torch.Tensor  # [P + C, K, V]
    hidden: torch.Tensor  # [P + C, K, d]
    seconds: float


def generate(
    target: Target,
    prompt_ids: list[int] | torch.Tensor,
    config: DecodeConfig,
    drafter: Drafter | None = None,
    request: int = 0,
    decode: Callable[[list[int]], str] | None = None,
    record: bool = False,
    record_topk: int = 0,
    record_margins: bool = False,
    record_hidden: bool = False,
    sizing: Sizing | None = None,
) -> Generation:
    """Decode one request; the output depends only on (target, prompt, config minus budget, request)
    under the default exact acceptance (config.acceptance "max_commit" is lossy: spot.acceptance).

    sizing: budget=auto (spot.sizing): config.budget is then the cap; each block drafts in the mode and
    at the tree size expected to pay most on this device (none at all when none pays), and verifies the best-first
    prefix of it that maximises the expected steps per second. The drafter must give reach probabilities.

    record: keep the trajectory (`Generation.trajectory`); record_topk: also keep the top-k
    log-probabilities of the logits behind every step (what drafters are trained on);
    record_margins: also keep every step's proposal with its token margins (`BlockTrace.proposals`);
    record_hidden: also keep the hidden states behind every step (`BlockTrace.hidden`, what SPOT-Sets' set
    model reads).
    """
    only = Request(prompt_ids, config, drafter, request, sizing)
    return next(generations(target, [only], 1, decode, record, record_topk, record_margins, record_hidden))[1]


def generate_batch(target: Target, requests: Sequence[Request], batch_size: int, **options) -> list[Generation]:
    """`generations` in the requests' order (options: `generations`' decode and record flags)."""
    out: list[Generation | None] = [None] * len(requests)
    for i, generation in generations(target, requests, batch_size, **options):
        out[i] = generation
    return out


def generations(
    target: Target,
    requests: Sequence[Request],
    batch_size: int,
    decode: Callable[[list[int]], str] | None = None,
    record: bool = False,
    record_topk: int = 0,
    record_margins: bool = False,
    record_hidden: bool = False,
) -> Iterator[tuple[int, Generation]]:
    """Decode the requests up to `batch_size` at a time, one verify forward per round for all of them; yields
    (index in `requests`, its Generation) as each finishes, and admits the next waiting request in its place.
    Each request's Generation is what `generate` gives for it alone (the module docstring); its
    `stats.forwards` counts the forwards it took part in."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    waiting = deque(enumerate(requests))
    running: dict[int, tuple[Generator, Call | _Draft]] = {}  # index -> (its decoding, what it waits on)

    def advance(i: int, decoding: Generator, reply: _Reply | _Drafted | None) -> Generation | None:
        try:
            running[i] = (decoding, decoding.send(reply))
            return None
        except StopIteration as done:
            running.pop(i, None)
            return done.value

    while waiting or running:
        while waiting and len(running) < batch_size:
            i, r = waiting.popleft()
            decoding = _decoding(target, r, decode, _Keep(record, record_topk, record_margins, record_hidden))
            advance(i, decoding, None)  # to its first draft or call: every request takes at least one forward
        drafting: dict[int, list[int]] = {}  # id(drafter) -> the requests it drafts for this round
        for i, (_, waits) in running.items():
            if isinstance(waits, _Draft):
                drafting.setdefault(id(waits.drafter), []).append(i)
        for group in drafting.values():
            drafter = running[group[0]][1].drafter
            t = time.perf_counter()
            trees = draft_all(drafter, [running[i][1].ctx for i in group])
            seconds = time.perf_counter() - t
            for i, tree in zip(group, trees, strict=True):
                advance(i, running[i][0], _Drafted(tree, seconds))  # on to its verify call, once `_draft` checked the tree
        order = list(running)
        t = time.perf_counter()
        verified = target.verify_batch([running[i][1] for i in order])
        seconds = time.perf_counter() - t
        for i, v in zip(order, verified, strict=True):
            done = advance(i, running[i][0], _Reply(v.logits, v.hidden, seconds))
            if done is not None:
                yield i, done


def _decoding(
    target: Target, r: Request, decode: Callable[[list[int]], str] | None, keep: _Keep
) -> Generator[Call | _Draft, _Reply | _Drafted, Generation]:
    """One request's decoding: yields its drafts and verify calls, resumes with their outputs, returns its Generation."""
    canvas = _Canvas.of(target, r)
    config = _admitted(target, r, canvas)
    t0 = time.perf_counter()
    run = _Run(target, target.open(canvas.prompt[: canvas.start(canvas.first)], canvas.positions), config, r.drafter,
               r.number, r.sizing, acceptance_of(config, target.mask_id),
               target.eos_ids if config.stop_at_eos else frozenset())  # without stop_at_eos an EOS ends nothing
    out: list[int] = []
    traces: list[BlockTrace] = []
    finish, ahead = "length", None
    for b in range(canvas.first, canvas.blocks):
        prefix = None if r.drafter is None else torch.cat([canvas.prompt, torch.tensor(out, dtype=torch.long)])[: canvas.start(b)]
        block = _Block.open(run, canvas, b, ahead, keep, prefix)
        ahead = yield from _decode_block(run, block)
        if keep.record:
            traces.append(block.recorder.trace(block.states))
        written = len(out)
        out += block.state[block.lo : block.hi].tolist()
        if config.stop_at_eos:
            eos_at = _first_eos(out, target.eos_ids, written)  # the blocks before had none
            if eos_at is not None:
                out, finish = out[:eos_at], "eos"
                break
            if config.stop_strings and decode is not None and cut_at_stop(out, config.stop_strings, decode) is not None:
                finish = "stop"
                break
        run.stream.commit(block.state)
    answer = out  # the tokens before the first EOS: with stop_at_eos=False, `out` also keeps the padding after it
    if not config.stop_at_eos and (eos_at := _first_eos(out, target.eos_ids)) is not None:
        answer, finish = out[:eos_at], "eos"
    text = None
    if decode is not None:
        cut = cut_at_stop(answer, config.stop_strings, decode) if config.stop_strings else None
        answer, text = (answer, decode(answer)) if cut is None else cut
    stats = DecodeStats(
        forwards=len(run.timings),  # one timing per verify forward
        steps=sum(run.lengths),
        accepted_lengths=tuple(run.lengths),
        seconds=time.perf_counter() - t0,
        timings=tuple(run.timings),
    )
    return Generation(tuple(answer if config.stop_at_eos else out), text, finish, stats, tuple(traces) if keep.record else None)


def _decode_block(run: _Run, block: _Block) -> Generator[Call | _Draft, _Reply | _Drafted, _Verified | None]:
    """Advance one block until it is finished: draft, verify in one forward, accept (spot.verify), commit.
    Returns the next block's first state's outputs where the forward that finished this one verified it too
    (cross_block), else None."""
    while not block.done(block.state):
        if block.carried is not None:  # the previous block's last forward verified this state: no forward needed
            tree, out = DraftTree.root_only(block.state), block.carried
        else:
            drafted = yield from _draft(run, block)
            tree = drafted.tree
            out = yield from _verify(run, block, drafted)
        path = walk(tree.states, out.logits[: tree.size + 1], block.rule, block.step, block.done, run.accept)
        block.commit(tree, out, path, run)
    return block.handed


def _draft(run: _Run, block: _Block) -> Generator[_Draft, _Drafted, _Drafted]:
    """The tree to verify: the root alone at budget 0, else the drafter's, checked, and cut to the size that
    budget=auto expects to pay most (spot.sizing)."""
    budget = run.config.budget if block.stale is None else block.plan.nodes
    if budget <= 0:
        return _Drafted(DraftTree.root_only(block.state), 0.0)
    # The drafter's own copies of the states, config and noise (spot.drafters.base): a write reaches nothing of ours.
    stale_state = None if block.stale_state is None else block.stale_state.clone()  # under max_commit, a state we keep
    ctx = DraftContext(block.state.clone(), block.stale, stale_state, block.prior, run.drafter_config,
                       run.target.mask_id, run.request, block.index, block.step, budget, block.drafter_noise,
                       block.plan.mode, block.stale_hidden, run.target.logits_dtype, block.prefix)
    drafted = yield _Draft(run.drafter, ctx)
    tree = checked(run.drafter, drafted.tree, block.state, budget, run.target.vocab_size, run.target.mask_id)
    size = tree.size
    if run.sizing is not None and tree.size:
        if tree.reach is None:
            raise ValueError(f"budget=auto needs reach probabilities, and drafter {run.drafter.name!r} gives none: "
                             "use a calibrated drafter (spot-eval calibrate-reach) or a fixed budget")
        tree = tree.prefix(run.sizing.size(tree.reach[1:], block.start))
    return _Drafted(tree, drafted.seconds, size)


def _verify(run: _Run, block: _Block, drafted: _Drafted) -> Generator[Call, _Reply, _Verified]:
    """One target forward over the tree's states (and, with cross_block, the next block's first state behind
    the first drafted node that finishes this block), its timing kept."""
    tree = drafted.tree
    cross = None if block.following is None else _cross_piece(tree, block.following, block.lo, block.hi, run.target.mask_id,
                                                               run.eos)
    reply = yield Call(run.stream, tree.states, block.start, cross)
    pieces = tree.size + 1 + (0 if cross is None else 2)  # a cross piece holds two blocks' rows
    run.timings.append(ForwardTiming(pieces, block.start, reply.seconds, drafted.drafted,
                                     block.plan.mode if drafted.drafted else None, drafted.seconds))
    # One sum is finite exactly when every logit is (accumulated in fp32: fp16 sums overflow), at a
    # twentieth of the cost of isfinite(logits).all(), which took 3% of a draft-free step on the CPU.
    if not bool(torch.isfinite(reply.logits.sum(dtype=torch.float32))):
        raise RuntimeError(
            f"the target's forward {len(run.timings)} ({block.rule.where}step {block.step}) returned "
            "non-finite logits: check the weights and the dtype (fp16 can overflow; try bfloat16 or float32)"
        )
    return _Verified(reply.logits, reply.hidden, cross)


def _first_eos(tokens: list[int], eos_ids: frozenset[int], start: int = 0) -> int | None:
    return next((i for i in range(start, len(tokens)) if tokens[i] in eos_ids), None)


# -- the records a decoding carries ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Keep:
    """What `generate`'s record flags ask each block to keep beside its states."""

    record: bool = False
    topk: int = 0
    margins: bool = False
    hidden: bool = False


@dataclass(frozen=True)
class _Canvas:
    """Where one request's blocks lie: the prompt, then gen_length positions, in whole blocks of K from `origin`
    (position 0, or the prompt's end: Target.blocks_at_prompt_end)."""

    prompt: torch.Tensor  # [P] int64
    k: int
    origin: int
    end: int  # the prompt's length plus gen_length

    @classmethod
    def of(cls, target: Target, r: Request) -> _Canvas:
        prompt = torch.as_tensor(r.prompt_ids, dtype=torch.long).flatten()
        origin = prompt.numel() if target.blocks_at_prompt_end else 0
        return cls(prompt, r.config.block_length, origin, prompt.numel() + r.config.gen_length)

    @property
    def blocks(self) -> int:
        return math.ceil((self.end - self.origin) / self.k)

    @property
    def positions(self) -> int:
        return self.origin + self.blocks * self.k

    @property
    def first(self) -> int:
        """The first block with a position to generate."""
        return (self.prompt.numel() - self.origin) // self.k

    def start(self, block: int) -> int:
        return self.origin + block * self.k


def _admitted(target: Target, r: Request, canvas: _Canvas) -> DecodeConfig:
    """The request's config once checked against the target (budget=auto's cap shrunk to what fits)."""
    config, k, n_prompt = r.config, r.config.block_length, canvas.prompt.numel()
    if target.block_length != k:
        raise ValueError(f"config.block_length {k} differs from the target's block length {target.block_length}")
    if n_prompt == 0:
        raise ValueError("the prompt is empty: a block-diffusion decoder needs at least one prompt token")
    if config.budget > 0 and r.drafter is None:
        raise ValueError(f"budget {config.budget} needs a drafter; use budget 0 for draft-free decoding")
    if canvas.positions > target.max_positions:
        raise ValueError(
            f"a {n_prompt}-token prompt plus gen_length {config.gen_length} needs {canvas.positions} positions "
            f"(whole blocks of {k}); the model has {target.max_positions}. Shorten the prompt or gen_length."
        )
    if config.cross_block and not target.cross_block:
        raise ValueError("cross_block needs a target whose completed blocks never change (block-causal: SDAR, LLaDA2.0); "
                         "this target re-reads the canvas at each block's start, so turn cross_block off")
    if config.budget > 0:
        room = target.max_pieces(canvas.positions) - (2 if config.cross_block else 0)  # a cross piece holds two blocks
        if r.sizing is not None:  # budget=auto: the cap shrinks to what fits
            return replace(config, budget=min(config.budget, max(room - 1, 0)))
        if config.budget + 1 > room:
            raise ValueError(
                f"budget {config.budget} needs {config.budget + 1} pieces of {k} positions in one verify forward; "
                f"with {canvas.positions} positions of context the free device memory holds about {room} now. "
                f"Use a budget of at most {max(room - 1, 0)}" + (" (or a device with more memory)." if room > 1 else ": none fits; free memory or use a larger device.")
            )
    return config


@dataclass
class _Run:
    """One request's decoding: what every block reads, and the per-forward figures it adds to."""

    target: Target
    stream: Stream
    config: DecodeConfig  # budget=auto's cap shrunk to what fits
    drafter: Drafter | None
    request: int  # the noise key's request number
    sizing: Sizing | None
    accept: Acceptance
    eos: frozenset[int]  # the tokens that finish a block early (none without stop_at_eos)
    timings: list[ForwardTiming] = field(default_factory=list)  # one per verify forward
    lengths: list[int] = field(default_factory=list)  # steps advanced per verify forward
    drafter_config: DecodeConfig | None = field(init=False, default=None)  # the drafter's own copy (it may force a field)

    def __post_init__(self) -> None:
        if self.drafter is not None:
            self.drafter_config = copy.deepcopy(self.config)


@dataclass(frozen=True)
class _Verified:
    """A verify's outputs for one request: logits [N + 1 (+ 1 with a cross piece), K, V], hidden [.., K, d], and
    the cross piece [1, 2K] it held, if any. Also the next block's first state's outputs ([1, K, V], [1, K, d])
    that the forward finishing a block verified behind it (DecodeConfig.cross_block), handed to the next block."""

    logits: torch.Tensor
    hidden: torch.Tensor
    cross: torch.Tensor | None = None


@dataclass
class _Block:
    """One block's decoding state, from forward to forward: its trajectory, the last forward's outputs behind
    it (what a drafter reads, spot.drafters.base.DraftContext) and the cross-block hand-over."""

    index: int
    start: int  # its first position on the canvas
    lo: int  # generated positions lo..hi-1 (a partial prompt block is never masked)
    hi: int
    rule: StepRule
    plan: Plan  # budget=auto's mode and tree size, decided once per block from the context
    recorder: _Recorder
    eos: frozenset[int]
    states: list[torch.Tensor]  # [K] each: the state before each step, then the current one
    stale: torch.Tensor | None = None  # [K, V] the logits behind the last step
    stale_state: torch.Tensor | None = None  # [K] the state they were computed at
    stale_hidden: torch.Tensor | None = None  # [K, d]
    prior: torch.Tensor | None = None  # [K, V] the logits behind the step before
    carried: _Verified | None = None  # this block's first state, verified by the previous block's last forward
    following: torch.Tensor | None = None  # [K] the next block's first state (cross_block), None for the last block
    handed: _Verified | None = None  # the next block's, once this block's last forward verified it
    prefix: torch.Tensor | None = None  # [start] the tokens before the block (DraftContext.prefix), with a drafter
    drafter_noise: Callable[[int], torch.Tensor | None] = silent  # the rule's noise, a copy per call (DraftContext.gumbel)

    @classmethod
    def open(cls, run: _Run, canvas: _Canvas, index: int, carried: _Verified | None, keep: _Keep,
             prefix: torch.Tensor | None = None) -> _Block:
        target, config, k = run.target, run.config, canvas.k
        start, n_prompt = canvas.start(index), canvas.prompt.numel()
        prompt_here = max(n_prompt - start, 0)  # a partial prompt block's prompt positions are never masked
        state = torch.full((k,), target.mask_id, dtype=torch.long)
        state[:prompt_here] = canvas.prompt[start:n_prompt]
        noise = (block_noise(config.seed, run.request, index, target.block_length, target.vocab_size, target.device)
                 if config.noisy else silent)
        span = partial(target.ranked_span, start, canvas.positions) if config.tie_break == "topk" else None
        rule = StepRule(config, target.mask_id, noise, keep.margins, where=f"request {run.request}, block {index}, ",
                        model_dtype=target.logits_dtype, span=span)
        plan = Plan(None, config.budget) if run.sizing is None else run.sizing.plan(start, config.budget)
        following = (torch.full((k,), target.mask_id, dtype=torch.long)
                     if config.cross_block and index + 1 < canvas.blocks else None)
        return cls(index, start, prompt_here, min(canvas.end - start, k), rule, plan,
                   _Recorder(index, keep.topk, keep.margins, keep.hidden, target.mask_id), run.eos, [state],
                   carried=carried, following=following, prefix=prefix,
                   drafter_noise=silent if noise is silent else _copies(noise))

    @property
    def state(self) -> torch.Tensor:
        return self.states[-1]

    @property
    def step(self) -> int:
        return len(self.states) - 1

    def done(self, state: torch.Tensor) -> bool:
        return finished(state, self.lo, self.hi, self.rule.mask_id, self.eos)

    def commit(self, tree: DraftTree, out: _Verified, path: tuple[Step, ...], run: _Run) -> None:
        """Take the walk's steps: the trajectory, the outputs behind its last two steps (the drafter's next
        inputs), the forward's accepted length, and the next block's first state where this forward verified it."""
        for step in path:
            self.states.append(step.state)
            self.recorder.add(out.logits[step.node], step.proposal, out.hidden[step.node])
        last = path[-1].node
        self.prior = out.logits[path[-2].node] if len(path) > 1 else self.stale
        self.stale, self.stale_state, self.stale_hidden = out.logits[last], tree.states[last], out.hidden[last]
        if self.carried is None:
            run.lengths.append(len(path))
        else:  # the carried step belongs to the forward that verified it
            run.lengths[-1] += len(path)
            self.carried = None
        if len(path) == 1 and self.prior is not None and run.config.budget > 0:
            self.prior = self.prior.clone()  # a row of the previous forward's logits: keep the row, free the rest
        if out.cross is not None and self.done(self.state) and torch.equal(out.cross[0, : len(self.state)], self.state):
            self.handed = _Verified(out.logits[-1:], out.hidden[-1:])  # verified behind this block's last state


def _copies(noise: Callable[[int], torch.Tensor]) -> Callable[[int], torch.Tensor]:
    """`noise`, each call's tensor a copy: the walk draws from the originals, which a drafter's in-place write (a
    Gumbel-max score built as `z = gumbel(s); z += logits`) would otherwise change."""
    return lambda step: noise(step).clone()


class _Recorder:
    """What one block keeps of each step beyond its states, as `generate`'s record_* flags ask."""

    def __init__(self, block: int, topk: int, margins: bool, hidden: bool, mask_id: int) -> None:
        self.block, self.topk, self.margins, self.hidden, self.mask_id = block, topk, margins, hidden, mask_id
        self.tops: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.proposals: list[Proposal] = []
        self.hiddens: list[torch.Tensor] = []

    def add(self, logits: torch.Tensor, proposal: Proposal, hidden: torch.Tensor) -> None:
        if self.topk:
            self.tops.append(topk_logprobs(logits, self.topk, self.mask_id))
        if self.margins:
            self.proposals.append(Proposal(proposal.tokens.cpu(), proposal.confidence.cpu(), proposal.token_margin.cpu()))
        if self.hidden:  # a copy: the drafter is handed the same row as DraftContext.stale_hidden
            self.hiddens.append(hidden.detach().to("cpu", copy=True))

    def trace(self, states: list[torch.Tensor]) -> BlockTrace:
        proposals = tuple(self.proposals) if self.margins else None
        hidden = torch.stack(self.hiddens) if self.hidden else None  # [S, K, d]
        values, ids = zip(*self.tops, strict=True) if self.tops else (None, None)
        return BlockTrace(self.block, torch.stack(states), None if values is None else torch.stack(values),
                          None if ids is None else torch.stack(ids), proposals, hidden)  # [S, K, k]


def _cross_piece(tree: DraftTree, following: torch.Tensor, lo: int, hi: int, mask_id: int, eos: frozenset[int]) -> torch.Tensor | None:
    """[1, 2K]: [the first drafted node that completes the block without an EOS | the next block's first
    state], or None when no node does (a block that ends in EOS ends the request: nothing follows it)."""
    for node in tree.states[1:]:
        written = node[lo:hi].tolist()
        if mask_id not in written and not eos.intersection(written):
            return torch.cat([node, following])[None]
    return None
