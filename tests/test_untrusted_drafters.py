"""An untrusted drafter can cost speed, never the output: the engine's guard against drafters (spot.drafters.base).

A drafter may come from a plugin. Whatever well-formed trees it returns, the tokens are the draft-free decoder's;
whatever it writes into what it was handed (the noise, the state, the config, the logits and hidden states, a tree it
returned before), the outputs, trajectories and recorded hidden states are the draft-free decoder's bit for bit; and
whatever malformed answer it gives, or whatever it raises, ends the decoding with a DraftError naming it and the defect.
Checked on tiny real targets in both verify layouts, at T = 0 and T = 1, under `single` and `threshold`, at batch 1
and 3; then `spot.tree.defect` alone on literal trees.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from types import SimpleNamespace

import pytest
import torch
from conftest import MASK_ID, VOCAB, tiny_target

from spot import DecodeConfig, Request, Sampling, engine, generate, generate_batch
from spot.drafters import RandomDrafter
from spot.drafters.base import DraftContext, DraftError
from spot.drafters.freedave import FreeDaveDrafter
from spot.engine import Generation
from spot.targets import BlockCausalTarget
from spot.tree import DraftTree, defect

BUDGET = 6
BATCHES = (1, 3)


def _prompt(seed: int, length: int) -> list[int]:
    return torch.randint(0, VOCAB - 2, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


# One request per batch slot. The first prompt fills one block and 5 positions of the next, so the first block
# decoded starts with 5 prompt (never masked) positions, which the malformed trees below overwrite.
PROMPTS = (_prompt(0, 21), _prompt(1, 10), _prompt(2, 30))


@dataclass(frozen=True)
class Point:
    """One point of the grid: the verify layout, the temperature and the policy."""

    exact: bool
    temperature: float
    policy: str

    def config(self, budget: int = BUDGET) -> DecodeConfig:
        return DecodeConfig(policy=self.policy, threshold=0.6, block_length=16, gen_length=36, budget=budget,
                            sampling=Sampling(self.temperature), seed=7)

    def __str__(self) -> str:
        return f"{'exact' if self.exact else 'packed'}-T{self.temperature:g}-{self.policy}"


GRID = [Point(exact, temperature, policy) for exact in (False, True) for temperature in (0.0, 1.0)
        for policy in ("single", "threshold")]


@functools.cache
def target(exact: bool) -> BlockCausalTarget:
    return tiny_target(16, seed=1, exact=exact)


def decode(point: Point, drafter, batch: int, budget: int = BUDGET) -> list[Generation]:
    """The three requests with `drafter` at `budget`, `batch` to a forward, every trajectory and hidden state kept."""
    requests = [Request(prompt, point.config(budget), drafter, number) for number, prompt in enumerate(PROMPTS)]
    return generate_batch(target(point.exact), requests, batch, record=True, record_hidden=True)


@functools.cache
def draft_free(point: Point) -> tuple[Generation, ...]:
    return tuple(decode(point, None, 1, budget=0))


@functools.cache
def honest(point: Point, batch: int) -> tuple[Generation, ...]:
    """FreeDave's decodings: the trees every hostile drafter below returns, so their forwards are these bit for bit."""
    return tuple(decode(point, FreeDaveDrafter(), batch))


def assert_draft_free(got: list[Generation], point: Point) -> None:
    """The tokens and every block's states are the draft-free decoder's; in the exact layout the hidden states too
    (in the packed one they move by rounding with the pieces in a forward, spot.targets.block_causal)."""
    for g, f in zip(got, draft_free(point), strict=True):
        assert (g.token_ids, g.finish_reason) == (f.token_ids, f.finish_reason)
        for a, b in zip(g.trajectory, f.trajectory, strict=True):
            assert torch.equal(a.states, b.states)
            assert not point.exact or torch.equal(a.hidden, b.hidden)


def assert_identical(got: list[Generation], twin: tuple[Generation, ...]) -> None:
    """Tokens, states and hidden states equal bit for bit, in either layout."""
    for g, t in zip(got, twin, strict=True):
        assert g.token_ids == t.token_ids
        for a, b in zip(g.trajectory, t.trajectory, strict=True):
            assert torch.equal(a.states, b.states) and torch.equal(a.hidden, b.hidden)


# -- a. random well-formed trees -----------------------------------------------------------------------------------


class RandomParents:
    """Random well-formed trees of random size within the budget: each node fills a random subset of its first
    parent's masked positions with random tokens (the mask and EOS among them) or the stale argmax, and has one or
    two random earlier nodes as parents (a Spiffy graph). Its `draft_batch` takes the batched path of `draft_all`."""

    name = "random-parents"

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def draft(self, ctx: DraftContext) -> DraftTree:
        g = self.generator
        states, parents = [ctx.state], [()]
        for node in range(1, int(torch.randint(ctx.budget + 1, (1,), generator=g)) + 1):
            chosen = torch.randperm(node, generator=g)[: int(torch.randint(1, 3, (1,), generator=g))].tolist()
            child = states[chosen[0]].clone()
            fill = torch.nonzero(child == ctx.mask_id)[:, 0]
            fill = fill[torch.rand(fill.numel(), generator=g) < 0.5]
            child[fill] = torch.randint(VOCAB, (fill.numel(),), generator=g)
            if ctx.stale_logits is not None and bool(torch.rand(1, generator=g) < 0.5):
                child[fill] = ctx.stale_logits[fill].argmax(-1)
            states.append(child)
            parents.append(tuple(sorted(chosen)))
        return DraftTree(torch.stack(states), tuple(parents))

    def draft_batch(self, ctxs: list[DraftContext]) -> list[DraftTree]:
        return [self.draft(ctx) for ctx in ctxs]


@pytest.mark.parametrize("point", GRID, ids=str)
@pytest.mark.parametrize("make", [lambda: RandomDrafter(VOCAB, seed=2), lambda: RandomParents(seed=2)],
                         ids=["random", "random-parents"])
def test_random_well_formed_trees_give_the_draft_free_decoding(point, make):
    for batch in BATCHES:
        got = decode(point, make(), batch)
        assert sum(g.stats.draft_nodes for g in got) > 0
        assert_draft_free(got, point)


# -- b. hostile drafters: an honest chain, and a write into what they were handed ----------------------------------


class Hostile:
    """FreeDave's chain drafted on the request's own config (the trees `honest` verifies), then `write` into what the
    engine handed over; `writes` counts the writes that changed a value, so that a writer that wrote nothing fails."""

    def __init__(self, config: DecodeConfig) -> None:
        self.name, self.config = f"hostile-{type(self).__name__.lower()}", config
        self.chain, self.writes = FreeDaveDrafter(), 0

    def draft(self, ctx: DraftContext) -> DraftTree:
        tree = self.chain.draft(replace(ctx, config=self.config))
        self.write(ctx, tree)
        return tree

    def changed(self, tensor: torch.Tensor | None, write) -> None:
        if tensor is not None:
            before = tensor.clone()
            write(tensor)
            self.writes += not torch.equal(before, tensor)

    def write(self, ctx: DraftContext, tree: DraftTree) -> None:
        raise NotImplementedError


class Noise(Hostile):
    """Gumbel-max scores built in place into the noise of every step the walk may take from this tree."""

    def write(self, ctx, tree):
        for step in range(ctx.step, ctx.step + ctx.budget + 1):
            z = ctx.gumbel(step)
            before = z.clone()
            z += ctx.stale_logits if ctx.stale_logits is not None else z
            self.writes += not torch.equal(before, z)


class State(Hostile):
    """The state, the state behind the stale logits and the prefix, written without a clone."""

    def write(self, ctx, tree):
        for tensor in (ctx.state, ctx.stale_state, ctx.prefix):
            self.changed(tensor, lambda t: t.fill_(0))


class Forcer(Hostile):
    """A config field forced in place past the frozen dataclass: `writes` counts one a request exactly when every
    request has a config of its own."""

    def forced(self, ctx) -> tuple[object, str, object]:
        raise NotImplementedError

    def write(self, ctx, tree):
        owner, name, value = self.forced(ctx)
        self.writes += getattr(owner, name) != value
        object.__setattr__(owner, name, value)


class Threshold(Forcer):
    def forced(self, ctx):
        return ctx.config, "threshold", 0.01


class Temperature(Forcer):
    """The nested Sampling's temperature (which a shallow copy of the config would share)."""

    def forced(self, ctx):
        return ctx.config.sampling, "temperature", 0.0 if self.config.sampling.temperature else 1.0


class Hidden(Hostile):
    def write(self, ctx, tree):
        with torch.inference_mode():  # the target's outputs are inference tensors
            self.changed(ctx.stale_hidden, lambda t: t.fill_(0.0))


class Logits(Hostile):
    def write(self, ctx, tree):
        with torch.inference_mode():
            for tensor in (ctx.stale_logits, ctx.prior_logits):
                self.changed(tensor, lambda t: t.neg_())


class KeptTree(Hostile):
    """Keeps the tree it returned for each request and overwrites it on its next call for that request."""

    def __init__(self, config: DecodeConfig) -> None:
        super().__init__(config)
        self.kept: dict[int, DraftTree] = {}

    def write(self, ctx, tree):
        if ctx.request in self.kept:
            self.changed(self.kept[ctx.request].states, lambda t: t.fill_(0))
        self.kept[ctx.request] = tree


HOSTILES = {cls.__name__.lower(): cls for cls in (Noise, State, Threshold, Temperature, Hidden, Logits, KeptTree)}
# Each writer at both temperatures, in both layouts and under both policies, on half the grid: the points where
# layout and policy agree, or (every other writer) where they differ, so that every combination meets a writer.
# At T = 0 no noise is handed over (ctx.gumbel gives None): the noise writer has nothing to write.
CASES = [(point, kind) for k, kind in enumerate(HOSTILES) for point in GRID
         if (point.exact == (point.policy == "threshold")) == (k % 2 == 0) and not (kind == "noise" and point.temperature == 0)]


@pytest.mark.parametrize("point, kind", CASES, ids=[f"{p}-{k}" for p, k in CASES])
def test_a_hostile_drafters_writes_reach_no_output(point, kind):
    for batch in BATCHES:
        drafter = HOSTILES[kind](point.config())
        got = decode(point, drafter, batch)
        assert (drafter.writes == len(PROMPTS)) if isinstance(drafter, Forcer) else (drafter.writes > 0)
        twin = honest(point, batch)
        assert sum(g.stats.forwards for g in twin) < sum(f.stats.forwards for f in draft_free(point))  # drafts accepted
        assert_identical(got, twin)
        assert_draft_free(got, point)


@pytest.mark.parametrize("kind, guard, unguarded", [
    ("noise", "_copies", lambda noise: noise),
    ("threshold", "copy", SimpleNamespace(deepcopy=lambda config: config)),
], ids=["noise", "config"])
def test_without_the_engines_copies_the_hostile_writes_change_the_tokens(monkeypatch, kind, guard, unguarded):
    """The writers above can fail their test: with the engine handing over its own noise (or config), they do."""
    point = Point(False, 1.0, "threshold")
    monkeypatch.setattr(engine, guard, unguarded)
    got = decode(point, HOSTILES[kind](point.config()), 1)
    assert [g.token_ids for g in got] != [f.token_ids for f in draft_free(point)]


# -- c. malformed answers and raising drafters ----------------------------------------------------------------------


def forged(states, parents) -> DraftTree:
    """A DraftTree built around its own __post_init__, as a drafter may."""
    tree = object.__new__(DraftTree)
    for name, value in (("states", states), ("parents", parents), ("scores", None), ("reach", None)):
        object.__setattr__(tree, name, value)
    return tree


def chain(ctx: DraftContext, nodes: int, token: int = 0) -> torch.Tensor:
    """[nodes + 1, K]: the state, then each node the one before with its first masked position set to `token`."""
    states = [ctx.state]
    for position in torch.nonzero(ctx.state == ctx.mask_id)[:nodes, 0].tolist():
        states.append(states[-1].clone())
        states[-1][position] = token
    return torch.stack(states)


def links(n: int) -> tuple[tuple[int, ...], ...]:
    return ((),) + tuple((i,) for i in range(n - 1))


def overwriting(ctx: DraftContext) -> DraftTree:
    states = chain(ctx, 1)
    states[1, 0] = (int(ctx.state[0]) + 1) % (VOCAB - 2)  # position 0 holds a prompt token
    return DraftTree(states, links(2))


def foreign_root(ctx: DraftContext) -> DraftTree:
    states = chain(ctx, 1)
    return DraftTree(states[1:].clone(), links(1))


class Returns:
    """A drafter that answers `answer(ctx)`."""

    name = "liar"

    def __init__(self, answer) -> None:
        self.answer = answer

    def draft(self, ctx: DraftContext) -> object:
        return self.answer(ctx)


MALFORMED = {
    "over-budget": (lambda ctx: DraftTree(chain(ctx, 3), links(4)), r"returned 3 nodes for budget 2"),
    "narrow": (lambda ctx: DraftTree(ctx.state[None, :-1].clone(), ((),)),
               r"returned states of shape \(1, 15\); a tree's states are \[N \+ 1, 16\], one row per node of a "
               r"16-position block"),
    "float": (lambda ctx: DraftTree(chain(ctx, 1).float(), links(2)), r"returned torch\.float32 states; token ids are torch\.int64"),
    "out-of-vocabulary": (lambda ctx: DraftTree(chain(ctx, 1, token=VOCAB), links(2)),
                          rf"returned token {VOCAB} at node 1, position 5, outside the vocabulary \(0\.\.{VOCAB - 1}\)"),
    "negative-token": (lambda ctx: DraftTree(chain(ctx, 2, token=-1), links(3)),
                       rf"returned token -1 at node 1, position 5, outside the vocabulary \(0\.\.{VOCAB - 1}\)"),
    "foreign-root": (foreign_root, r"returned a root \(node 0\) that is not the current block state"),
    "filled-prompt": (overwriting, r"returned node 1 changing position 0, which is not masked in the current state "
                                   r"\(a node only fills masked positions\)"),
    "not-a-tree": (lambda ctx: forged(chain(ctx, 2), ((), (2,), (0,))),
                   r"returned parents \(2,\) for node 1; the root has none and every other node has >= 1 among the "
                   r"earlier nodes"),
    "root-with-parent": (lambda ctx: forged(chain(ctx, 1), ((0,), (0,))), r"returned parents \(0,\) for node 0; .*"),
    "none": (lambda ctx: None, r"returned a NoneType, not a spot\.tree\.DraftTree"),
    "list": (lambda ctx: [DraftTree.root_only(ctx.state)], r"returned a list, not a spot\.tree\.DraftTree"),
}


@pytest.mark.parametrize("answer, message", MALFORMED.values(), ids=MALFORMED)
def test_a_malformed_answer_ends_the_decoding_with_a_draft_error_naming_the_drafter(answer, message):
    with pytest.raises(DraftError) as caught:
        generate(target(False), PROMPTS[0], GRID[0].config(budget=2), drafter=Returns(answer))
    assert caught.value.drafter == "liar" and re.fullmatch(message, caught.value.defect)
    assert str(caught.value) == f"drafter 'liar' {caught.value.defect}"


@pytest.mark.parametrize("error, message", [(KeyError("stale"), r"raised KeyError: 'stale'"),
                                            (ValueError("no logits yet"), r"raised ValueError: no logits yet")],
                         ids=["KeyError", "ValueError"])
def test_a_drafter_that_raises_ends_the_decoding_with_its_error_as_the_cause(error, message):
    def answer(ctx):
        raise error

    with pytest.raises(DraftError) as caught:
        generate(target(False), PROMPTS[0], GRID[0].config(), drafter=Returns(answer))
    assert caught.value.drafter == "liar" and re.fullmatch(message, caught.value.defect)
    assert caught.value.__cause__ is error


class Short:
    """A batched drafter whose draft_batch answers `answer(trees)` for one tree per context."""

    name = "short"

    def __init__(self, answer) -> None:
        self.answer = answer

    def draft(self, ctx: DraftContext) -> DraftTree:
        return DraftTree.root_only(ctx.state)

    def draft_batch(self, ctxs: list[DraftContext]) -> object:
        return self.answer([self.draft(ctx) for ctx in ctxs])


@pytest.mark.parametrize("answer, message", [
    (lambda trees: trees[1:], r"returned 2 trees from draft_batch for 3 contexts \(one tree per context\)"),
    (lambda trees: iter(trees), r"returned a list_iterator from draft_batch for 3 contexts \(one tree per context\)"),
], ids=["too-few", "iterator"])
def test_a_draft_batch_without_one_tree_per_context_is_a_draft_error(answer, message):
    with pytest.raises(DraftError) as caught:
        decode(GRID[0], Short(answer), 3)
    assert caught.value.drafter == "short" and re.fullmatch(message, caught.value.defect)


# -- d. spot.tree.defect on literal trees (K = 4, V = 8, the mask 7) -------------------------------------------------

K4_MASK, K4_VOCAB = 7, 8
ROOT = torch.tensor([1, 7, 7, 3])
STATES = torch.tensor([[1, 7, 7, 3], [1, 2, 7, 3], [1, 2, 5, 3], [1, 7, 0, 3]])
PARENTS = ((), (0,), (1,), (0, 2))


def with_row(node: int, position: int, token: int) -> torch.Tensor:
    states = STATES.clone()
    states[node, position] = token
    return states


def forged_tree(states=STATES, parents=PARENTS, scores=None, reach=None) -> DraftTree:
    tree = forged(states, parents)
    object.__setattr__(tree, "scores", scores)
    object.__setattr__(tree, "reach", reach)
    return tree


@pytest.mark.parametrize("tree, budget", [
    (DraftTree(STATES, PARENTS), 3),
    (DraftTree(STATES, PARENTS, scores=(0.0, -0.1, -0.5, -2.0), reach=(1.0, 0.5, 0.25, 0.0)), 5),
    (DraftTree.root_only(ROOT), 0),
    (forged_tree(STATES, [[], [0], [1], [0, 2]]), 3),  # lists where tuples are expected: still a tree
], ids=["tree", "scored", "root-only", "lists"])
def test_defect_finds_nothing_wrong_with_a_well_formed_tree(tree, budget):
    assert defect(tree, ROOT, budget, K4_VOCAB, K4_MASK) is None


SHAPE = r"; a tree's states are \[N \+ 1, 4\], one row per node of a 4-position block"
PARENTHOOD = r"; the root has none and every other node has >= 1 among the earlier nodes"
DEFECTS = {
    "list": ([DraftTree(STATES, PARENTS)], r"a list, not a spot\.tree\.DraftTree"),
    "none": (None, r"a NoneType, not a spot\.tree\.DraftTree"),
    "narrow": (DraftTree(STATES[:, :3], PARENTS), r"states of shape \(4, 3\)" + SHAPE),
    "one-dimensional": (forged_tree(ROOT, ((),)), r"states of shape \(4,\)" + SHAPE),
    "no-rows": (forged_tree(STATES[:0], ()), r"states of shape \(0, 4\)" + SHAPE),
    "not-a-tensor": (forged_tree(STATES.tolist()), r"states of type list; a tree.s states are a torch\.Tensor with values"),
    "float": (DraftTree(STATES.float(), PARENTS), r"torch\.float32 states; token ids are torch\.int64"),
    "int32": (DraftTree(STATES.int(), PARENTS), r"torch\.int32 states; token ids are torch\.int64"),
    "over-budget": (DraftTree(torch.cat([STATES, STATES[2:]]), PARENTS + ((2,), (3,))), r"5 nodes for budget 3"),
    "too-few-parents": (forged_tree(parents=PARENTS[:3]), r"3 parent entries for 4 nodes"),
    "parents-not-a-sequence": (forged_tree(parents=None), r"NoneType parent entries for 4 nodes"),
    "root-with-parent": (forged_tree(parents=((0,), (0,), (1,), (0,))), r"parents \(0,\) for node 0" + PARENTHOOD),
    "orphan": (forged_tree(parents=((), (), (1,), (0,))), r"parents \(\) for node 1" + PARENTHOOD),
    "later-parent": (forged_tree(parents=((), (2,), (1,), (0,))), r"parents \(2,\) for node 1" + PARENTHOOD),
    "own-parent": (forged_tree(parents=((), (0,), (2,), (0,))), r"parents \(2,\) for node 2" + PARENTHOOD),
    "negative-parent": (forged_tree(parents=((), (-1,), (1,), (0,))), r"parents \(-1,\) for node 1" + PARENTHOOD),
    "bool-parent": (forged_tree(parents=((), (False,), (1,), (0,))), r"parents \(False,\) for node 1" + PARENTHOOD),
    "bare-int-parent": (forged_tree(parents=((), 0, (1,), (0,))), r"parents 0 for node 1" + PARENTHOOD),
    "out-of-vocabulary": (DraftTree(with_row(2, 2, 8), PARENTS),
                          r"token 8 at node 2, position 2, outside the vocabulary \(0\.\.7\)"),
    "negative-token": (DraftTree(with_row(3, 1, -1), PARENTS),
                       r"token -1 at node 3, position 1, outside the vocabulary \(0\.\.7\)"),
    "foreign-root": (DraftTree(with_row(0, 1, 2), PARENTS), r"a root \(node 0\) that is not the current block state"),
    "overwrite": (DraftTree(with_row(2, 3, 4), PARENTS),
                  r"node 2 changing position 3, which is not masked in the current state \(a node only fills masked positions\)"),
    "short-scores": (forged_tree(scores=(0.0, -1.0)), r"scores that is not one number per node"),
    "short-reach": (forged_tree(reach=(1.0,)), r"reach that is not one number per node"),
    "reach-above-one": (DraftTree(STATES, PARENTS, reach=(1.0, 1.5, 0.5, 0.5)), r"reach probabilities outside \[0, 1\]"),
    "reach-nan": (DraftTree(STATES, PARENTS, reach=(1.0, float("nan"), 0.5, 0.5)), r"reach probabilities outside \[0, 1\]"),
    "reach-text": (DraftTree(STATES, PARENTS, reach=(1.0, "high", 0.5, 0.5)), r"reach probabilities outside \[0, 1\]"),
}


@pytest.mark.parametrize("tree, message", DEFECTS.values(), ids=DEFECTS)
def test_defect_names_what_is_wrong(tree, message):
    found = defect(tree, ROOT, 3, K4_VOCAB, K4_MASK)
    assert found is not None and re.fullmatch(message, found), found


# -- trees that lie to the check ------------------------------------------------------------------------------------

HOLE_CONFIG = DecodeConfig(block_length=16, gen_length=32, budget=2)
HOLE_PROMPT = list(range(5, 15))


def wrong(root):
    """The root with its first masked position filled: not the block state."""
    root = root.clone()
    root[int((root == MASK_ID).nonzero()[0])] = 0
    return root


class TwoFaced(DraftTree):
    """A DraftTree whose `states` is the honest root at defect()'s read and another root at checked()'s copy."""

    def __getattribute__(self, name):
        d = object.__getattribute__(self, "__dict__")
        if name == "states" and "reads" in d:
            d["reads"] += 1
            return d["states"] if d["reads"] == 1 else wrong(d["states"][0])[None]
        return object.__getattribute__(self, name)


class Agreeable(torch.Tensor):
    """Int64 states that answer torch.equal with True once (the check's root comparison)."""

    lied = False

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.equal and not Agreeable.lied:
            Agreeable.lied = True
            return True
        return super().__torch_function__(func, types, args, kwargs or {})


class Answering:
    def __init__(self, name, answer):
        self.name, self.answer = name, answer

    def draft(self, ctx):
        return self.answer(ctx)


def two_faced(ctx):
    tree = TwoFaced(ctx.state[None].clone(), ((),))
    tree.__dict__["reads"] = 0  # armed: the next read is defect()'s
    return tree


def agreeable(ctx):
    Agreeable.lied = False
    return DraftTree(wrong(ctx.state)[None].as_subclass(Agreeable), ((),))


@pytest.mark.parametrize("answer", [two_faced, agreeable], ids=["subclass-toctou", "tensor-subclass"])
def test_a_tree_that_lies_to_the_check_is_refused(answer):
    """A DraftTree subclass whose reads change between the check and the copy, or states of a Tensor subclass that
    lie to torch.equal, would have the engine walk from a root that is not the block state: both are refused."""
    target = tiny_target(16, seed=1, eos_ids=frozenset())
    with pytest.raises(DraftError):
        generate(target, HOLE_PROMPT, HOLE_CONFIG, drafter=Answering("liar", answer))


@pytest.mark.parametrize("answer", [
    lambda ctx: DraftTree(ctx.state[None].clone(), ((),), scores=("high",)),
    lambda ctx: DraftTree(torch.empty((1, 16), dtype=torch.long, device="meta"), ((),)),
], ids=["text-scores", "meta-states"])
def test_every_malformed_tree_is_a_draft_error(answer):
    """Text scores and states without values are the drafter's defect too, not an error deep in the engine."""
    with pytest.raises(DraftError):
        generate(tiny_target(16, seed=1), HOLE_PROMPT, HOLE_CONFIG, drafter=Answering("liar", answer))
