"""The example method plugin, examples/prompt-lookup: its n-gram lookup on literal token lists, the tree its drafter
grows on hand-made contexts (well formed under every policy and temperature, the lookup's token beside the stale
chain's where the policy's runner-up names it). The conformance check runs on it installed, as a user runs it
(tests/test_plugins.py), and on a Method object in tests/test_plugins.py's worked example.

The example need not be pip-installed here: its folder goes on the import path, and the Method object itself is
checked, not a registered name."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

from spot_eval.plugin import DecodeConfig, DraftContext, Sampling, tree_defect

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "prompt-lookup"
MASK = 3  # the hand-made contexts' mask token
VOCAB = 16
BLOCK = 4


@pytest.fixture
def lookup(monkeypatch):
    """The example's package, imported from its folder (installed or not)."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    return importlib.import_module("spot_eval_lookup")


@pytest.fixture
def ngram(lookup):
    return importlib.import_module("spot_eval_lookup.ngram")


def tokens(*ids: int) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.int64)


def test_continuation_copies_what_followed_the_last_ngram(ngram):
    assert ngram.continuation(tokens(10, 11, 12, 13, 10, 11), 4).tolist() == [12, 13, 10, 11]


def test_continuation_prefers_the_longest_ngram(ngram):
    # "5 1 2" occurred once (then 8); the shorter "1 2" last occurred before 9: the trigram wins.
    assert ngram.continuation(tokens(5, 1, 2, 8, 6, 1, 2, 9, 5, 1, 2), 1).tolist() == [8]


def test_continuation_takes_the_latest_occurrence(ngram):
    assert ngram.continuation(tokens(1, 2, 7, 1, 2, 8, 1, 2), 1).tolist() == [8]


def test_continuation_runs_into_the_text_it_predicts(ngram):
    # "4 5" occurred just before the end: the copy continues the repetition past what the context holds.
    assert ngram.continuation(tokens(4, 5, 4, 5), 5).tolist() == [4, 5, 4, 5, 4]


def test_continuation_needs_a_long_enough_match(ngram):
    assert ngram.continuation(tokens(1, 2, 3, 1), 2) is None  # only the one token "1" repeats
    assert ngram.continuation(tokens(1, 2, 3, 1), 2, min_ngram=1).tolist() == [2, 3]
    assert ngram.continuation(tokens(7), 3) is None


def context(state: torch.Tensor, logits: torch.Tensor, prefix: torch.Tensor, config: DecodeConfig, budget: int,
            noisy: bool = False) -> DraftContext:
    """A drafter's view of one block as the engine hands it over: `logits` [K, V] the stale ones."""

    def gumbel(step: int) -> torch.Tensor | None:
        if not noisy:
            return None
        u = torch.rand(logits.shape, generator=torch.Generator().manual_seed(step), dtype=torch.float64)
        return -torch.log(-torch.log(u))

    return DraftContext(state=state, stale_logits=logits, stale_state=state.clone(), prior_logits=None, config=config,
                        mask_id=MASK, request=0, block=0, step=1, budget=budget, gumbel=gumbel, prefix=prefix)


def test_the_lookup_token_stands_beside_the_chain_where_it_is_the_runner_up(lookup):
    # The prefix ends "10 11", which was followed by "12 13 10 11": the lookup's guess for the block.
    prefix = tokens(10, 11, 12, 13, 10, 11)
    logits = torch.zeros(BLOCK, VOCAB)
    logits[0, 12] = 10.0  # the surest position, and the lookup's token: no sibling needed
    logits[1, 7], logits[1, 13] = 6.0, 5.9  # torn between 7 and the lookup's 13: the lookup's node beside the chain's
    logits[2, 9] = 2.0  # the lookup's 10 is nowhere near: the chain's token alone
    logits[3, 11] = 1.0
    root = torch.full((BLOCK,), MASK)
    config = DecodeConfig(block_length=BLOCK, gen_length=BLOCK)
    tree = lookup.LookupDrafter().draft(context(root, logits, prefix, config, budget=4))
    assert tree_defect(tree, root, 4, VOCAB, MASK) is None
    assert tree.states.tolist() == [[MASK] * 4, [12, MASK, MASK, MASK], [12, 7, MASK, MASK], [12, 13, MASK, MASK],
                                    [12, 7, 9, MASK]]
    assert tree.parents == ((), (0,), (1,), (1,), (2,))  # the lookup's node a leaf beside the chain's


def test_without_a_lookup_the_tree_is_the_stale_chain(lookup):
    logits = torch.zeros(BLOCK, VOCAB)
    logits[torch.arange(BLOCK), torch.tensor([5, 6, 7, 8])] = torch.tensor([4.0, 3.0, 2.0, 1.0])
    root = torch.full((BLOCK,), MASK)
    config = DecodeConfig(block_length=BLOCK, gen_length=BLOCK)
    tree = lookup.LookupDrafter().draft(context(root, logits, tokens(1, 2, 9), config, budget=8))
    assert tree.states.tolist() == [[MASK] * 4, [5, MASK, MASK, MASK], [5, 6, MASK, MASK], [5, 6, 7, MASK], [5, 6, 7, 8]]


@pytest.mark.parametrize("policy", ["single", "threshold", "static", "dynamic"])
@pytest.mark.parametrize("noisy", [False, True])
def test_trees_are_well_formed_under_every_policy(lookup, policy, noisy):
    block = 8
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(block, VOCAB, generator=generator) * 3  # [K, V]
    root = torch.tensor([12, MASK, 4, MASK, MASK, MASK, 9, MASK])  # some positions committed out of order
    prefix = torch.randint(4, VOCAB, (40,), generator=generator)
    prefix = torch.cat([prefix, prefix[:5], root[:1]])  # a repetition, so that the lookup has something to copy
    steps = block // 2 if policy in ("static", "dynamic") else None
    config = DecodeConfig(policy=policy, steps=steps, block_length=block, gen_length=block,
                          sampling=Sampling(temperature=1.0 if noisy else 0.0))
    for budget in (1, 3, 8):
        tree = lookup.LookupDrafter().draft(context(root, logits, prefix, config, budget, noisy))
        assert tree_defect(tree, root, budget, VOCAB, MASK) is None
