"""The speculative engine: draft, verify in one forward, follow the target, commit.

Budget 0 *is* the draft-free decoder: the tree is the root alone, the walk takes the one step the
root's logits give, and nothing else changes. Every method therefore runs this one loop.

Batching: a request's decoding is a generator that yields each tree it needs drafted (`_Draft`) and each
verify it needs (`Call`), and resumes with their outputs; `generations` runs up to B of them at once, every
round one `draft_batch` call per drafter over all the requests drafting and one `Target.verify_batch`
forward over all their calls, and admits the next waiting request as soon as one finishes (continuous
batching). What a request decodes depends on its own inputs only (bit for bit in the exact layout; the
drafters' models are row-invariant), so `generate`, one request, is batching at B = 1.

Glossary (see also spot.policy):
    node           a candidate block state in the draft tree; node 0 is the current state.
    piece          a node's full copy of the block in the verify forward.
    accepted path  the nodes the walk moves through: each equals the state the target itself
                   reaches from the previous one with that step's noise (under the lossy, opt-in
                   max_commit acceptance, or a drafted subset of that step: spot.acceptance).
    free step      the step the last accepted node's logits give; every forward yields >= 1 step.
    finished       a block is finished when no mask precedes the first EOS or the generation end.

Shapes: K block length, V vocabulary, N draft nodes.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, replace

import torch

from spot.acceptance import max_commit
from spot.config import DecodeConfig
from spot.drafters.base import DraftContext, Drafter, draft_all
from spot.noise import gumbel, step_key
from spot.policy import Proposal, decide, topk_logprobs
from spot.sizing import ForwardTiming, Plan, Sizing
from spot.stopping import cut_at_stop
from spot.targets.base import Call, Stream, Target
from spot.tree import DraftTree


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
    """What a decoding resumes with after its _Draft: the tree and the drafting call's seconds."""

    tree: DraftTree
    seconds: float


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
            decoding = _decoding(target, r, decode, record, record_topk, record_margins, record_hidden)
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
                advance(i, running[i][0], _Drafted(tree, seconds))  # on to its verify call
        order = list(running)
        t = time.perf_counter()
        verified = target.verify_batch([running[i][1] for i in order])
        seconds = time.perf_counter() - t
        for i, v in zip(order, verified, strict=True):
            done = advance(i, running[i][0], _Reply(v.logits, v.hidden, seconds))
            if done is not None:
                yield i, done


def _decoding(
    target: Target,
    r: Request,
    decode: Callable[[list[int]], str] | None,
    record: bool,
    record_topk: int,
    record_margins: bool,
    record_hidden: bool,
) -> Generator[Call | _Draft, _Reply | _Drafted, Generation]:
    """One request's decoding: yields its drafts and verify calls, resumes with their outputs, returns its Generation."""
    config, drafter, request, sizing = r.config, r.drafter, r.number, r.sizing
    prompt = torch.as_tensor(r.prompt_ids, dtype=torch.long).flatten()
    k, n_prompt = config.block_length, prompt.numel()
    if target.block_length != k:
        raise ValueError(f"config.block_length {k} differs from the target's block length {target.block_length}")
    if n_prompt == 0:
        raise ValueError("the prompt is empty: a block-diffusion decoder needs at least one prompt token")
    if config.budget > 0 and drafter is None:
        raise ValueError(f"budget {config.budget} needs a drafter; use budget 0 for draft-free decoding")
    end = n_prompt + config.gen_length
    # Blocks tile the canvas from `origin`: position 0, or the prompt's end (Target.blocks_at_prompt_end).
    origin = n_prompt if target.blocks_at_prompt_end else 0
    n_blocks = math.ceil((end - origin) / k)
    n_positions = origin + n_blocks * k
    if n_positions > target.max_positions:
        raise ValueError(
            f"a {n_prompt}-token prompt plus gen_length {config.gen_length} needs {n_positions} positions "
            f"(whole blocks of {k}); the model has {target.max_positions}. Shorten the prompt or gen_length."
        )
    if config.cross_block and not target.cross_block:
        raise ValueError("cross_block needs a target whose completed blocks never change (block-causal: SDAR, LLaDA2.0); "
                         "this target re-reads the canvas at each block's start, so turn cross_block off")
    if config.budget > 0:
        room = target.max_pieces(n_positions) - (2 if config.cross_block else 0)  # a cross piece holds two blocks
        if sizing is not None:  # budget=auto: the cap shrinks to what fits
            config = replace(config, budget=min(config.budget, max(room - 1, 0)))
        elif config.budget + 1 > room:
            raise ValueError(
                f"budget {config.budget} needs {config.budget + 1} pieces of {k} positions in one verify forward; "
                f"with {n_positions} positions of context the free device memory holds about {room} now. "
                f"Use a budget of at most {max(room - 1, 0)}" + (" (or a device with more memory)." if room > 1 else ": none fits; free memory or use a larger device.")
            )
    t0, timings = time.perf_counter(), []
    first = (n_prompt - origin) // k  # the first block with a position to generate
    stream = target.open(prompt[: origin + first * k], n_positions)
    out: list[int] = []
    lengths: list[int] = []
    traces: list[BlockTrace] = []
    finish = "length"
    ahead = None
    for block in range(first, n_blocks):
        start = origin + block * k
        state = torch.full((k,), target.mask_id, dtype=torch.long)
        state[: max(n_prompt - start, 0)] = prompt[start:n_prompt]  # a partial prompt block is never masked
        lo, hi = max(n_prompt - start, 0), min(end - start, k)
        recorder = _Recorder(block, record_topk, record_margins, record_hidden, target.mask_id)
        following = torch.full((k,), target.mask_id, dtype=torch.long) if config.cross_block and block + 1 < n_blocks else None
        states, ahead = yield from _decode_block(target, stream, state, start, block, lo, hi, config, drafter, request, lengths,
                                                 timings, recorder, sizing, ahead, following)
        if record:
            traces.append(recorder.trace(states))
        written = len(out)
        out += states[-1][lo:hi].tolist()
        if config.stop_at_eos:
            eos_at = _first_eos(out, target.eos_ids, written)  # the blocks before had none
            if eos_at is not None:
                out, finish = out[:eos_at], "eos"
                break
            if config.stop_strings and decode is not None and cut_at_stop(out, config.stop_strings, decode) is not None:
                finish = "stop"
                break
        stream.commit(states[-1])
    answer = out  # the tokens before the first EOS: with stop_at_eos=False, `out` also keeps the padding after it
    if not config.stop_at_eos and (eos_at := _first_eos(out, target.eos_ids)) is not None:
        answer, finish = out[:eos_at], "eos"
    text = None
    if decode is not None:
        cut = cut_at_stop(answer, config.stop_strings, decode) if config.stop_strings else None
        answer, text = (answer, decode(answer)) if cut is None else cut
    stats = DecodeStats(
        forwards=len(timings),  # one timing per verify forward
        steps=sum(lengths),
        accepted_lengths=tuple(lengths),
        seconds=time.perf_counter() - t0,
        timings=tuple(timings),
    )
    return Generation(tuple(answer if config.stop_at_eos else out), text, finish, stats, tuple(traces) if record else None)


def _first_eos(tokens: list[int], eos_ids: frozenset[int], start: int = 0) -> int | None:
    return next((i for i in range(start, len(tokens)) if tokens[i] in eos_ids), None)


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
        if self.hidden:
            self.hiddens.append(hidden.cpu())

    def trace(self, states: list[torch.Tensor]) -> BlockTrace:
        proposals = tuple(self.proposals) if self.margins else None
        hidden = torch.stack(self.hiddens) if self.hidden else None  # [S, K, d]
        values, ids = zip(*self.tops, strict=True) if self.tops else (None, None)
        return BlockTrace(self.block, torch.stack(states), None if values is None else torch.stack(values),
                          None if ids is None else torch.stack(ids), proposals, hidden)  # [S, K, k]


@dataclass(frozen=True)
class _Ahead:
    """The next block's first state as a cross piece of the forward that finished a block verified it
    (DecodeConfig.cross_block): its logits [K, V] and hidden states [K, d]."""

    logits: torch.Tensor
    hidden: torch.Tensor


def _cross_piece(tree: DraftTree, following: torch.Tensor, lo: int, hi: int, mask_id: int, eos: frozenset[int]) -> torch.Tensor | None:
    """[1, 2K]: [the first drafted node that completes the block without an EOS | the next block's first
    state], or None when no node does (a block that ends in EOS ends the request: nothing follows it)."""
    for node in tree.states[1:]:
        written = node[lo:hi].tolist()
        if mask_id not in written and not eos.intersection(written):
            return torch.cat([node, following])[None]
    return None


def _decode_block(target, stream: Stream, state, start, block, lo, hi, config, drafter, request, lengths, timings, recorder,
                  sizing, ahead: _Ahead | None = None, following: torch.Tensor | None = None):
    """Advance one block to `finished`; returns the states after each step and, where the forward that finished
    it verified the next block's first state too (`following`, the next block's first state, with cross_block),
    that piece's outputs. Each forward's timing goes to `timings`; `ahead` is the previous block's."""
    # Without stop_at_eos an EOS ends nothing: a block is finished when no mask is left in it.
    mask_id, eos = target.mask_id, target.eos_ids if config.stop_at_eos else frozenset()
    noise: dict[int, torch.Tensor | None] = {}

    def step_noise(step: int) -> torch.Tensor | None:
        if not config.noisy:
            return None
        if step not in noise:
            key = step_key(config.seed, request, block, step)
            noise[step] = gumbel(key, target.block_length, target.vocab_size, target.device)
        return noise[step]

    states, stale, stale_state, stale_hidden, prior = [state], None, None, None, None
    # budget=auto's mode and tree size before drafting depend on the context only: one decision per block.
    plan = Plan(None, config.budget) if sizing is None else sizing.plan(start, config.budget)
    carried, handed = ahead, None
    while not finished(state, lo, hi, mask_id, eos):
        step = len(states) - 1
        tree = DraftTree.root_only(state)
        budget = config.budget if stale is None else plan.nodes
        drafted, draft_seconds = 0, 0.0
        if carried is not None:  # the last forward verified this state already: its step needs no forward
            logits, hidden, cross = carried.logits[None], carried.hidden[None], None
        elif budget > 0:
            ctx = DraftContext(state, stale, stale_state, prior, config, mask_id, request, block, step, budget, step_noise, plan.mode,
                               stale_hidden)
            reply = yield _Draft(drafter, ctx)
            tree, draft_seconds = reply.tree, reply.seconds
            drafted = tree.size
            if tree.size > budget or not torch.equal(tree.states[0].cpu(), state.cpu()):
                raise RuntimeError(f"drafter {drafter.name!r} returned {tree.size} nodes for budget {budget} or a foreign root")
            if sizing is not None and tree.size:
                if tree.reach is None:
                    raise ValueError(f"budget=auto needs reach probabilities, and drafter {drafter.name!r} gives none: "
                                     "use a calibrated drafter (spot-eval calibrate-reach) or a fixed budget")
                tree = tree.prefix(sizing.size(tree.reach[1:], start))
        if carried is None:
            cross = None if following is None else _cross_piece(tree, following, lo, hi, mask_id, eos)
            reply = yield Call(stream, tree.states, start, cross)
            logits, hidden = reply.logits, reply.hidden  # [N + 1 (+ 1 with a cross piece), K, V], [.., K, d]
            pieces = tree.size + 1 + (0 if cross is None else 2)  # a cross piece holds two blocks' rows
            timings.append(ForwardTiming(pieces, start, reply.seconds, drafted, plan.mode if drafted else None, draft_seconds))
        # One sum is finite exactly when every logit is (accumulated in fp32: fp16 sums overflow), at a
        # twentieth of the cost of isfinite(logits).all(), which took 3% of a draft-free step on the CPU.
        if carried is None and not bool(torch.isfinite(logits.sum(dtype=torch.float32))):
            raise RuntimeError(
                f"the target's forward {len(timings)} (request {request}, block {block}, step {step}) returned "
                "non-finite logits: check the weights and the dtype (fp16 can overflow; try bfloat16 or float32)"
            )
        node, advanced = 0, 0
        while True:  # follow the target down the tree
            prior, stale, stale_state, stale_hidden = stale, logits[node], tree.states[node], hidden[node]
            state, proposal = decide(stale_state.to(logits.device), stale, step_noise(step + advanced), config, mask_id,
                                     step + advanced, margins=recorder.margins)
            state = state.cpu()
            # select() commits >= 1 position unless its inputs are broken, or a timestep step's count is 0
            if torch.equal(state, stale_state.cpu()) and config.policy != "timestep":
                raise RuntimeError(
                    f"request {request}, block {block}, step {step + advanced}: the step committed no position; "
                    "the policy's confidences are not numbers (check the sampling settings and the logits)"
                )
            if config.acceptance == "max_commit":  # lossy, opt-in: a drafted subset of the step may stand in for it
                state = max_commit(tree.states, stale_state.cpu(), state, proposal, config.threshold, mask_id)
            advanced += 1
            states.append(state)
            recorder.add(stale, proposal, stale_hidden)
            if finished(state, lo, hi, mask_id, eos):
                if cross is not None and torch.equal(cross[0, : len(state)], state):
                    handed = _Ahead(logits[-1], hidden[-1])  # the next block's first state, verified behind this one
                break
            match = torch.nonzero((tree.states == state).all(dim=1))
            if match.numel() == 0:
                break
            node = int(match[0])
        if carried is None:
            lengths.append(advanced)
        else:  # the carried step belongs to the forward that verified it
            lengths[-1] += advanced
            carried = None
        if advanced == 1 and prior is not None and config.budget > 0:
            prior = prior.clone()  # a row of the previous forward's logits: keep the row, free the rest
    return states, handed
