"""Training material for the target and the drafters, built from training splits only.

Speedups and accuracies are measured on GSM8K test, MATH500, HumanEval and MBPP test, so no test item may
enter training. Pairs come only from GSM8K train, MATH train and MBPP's prompt/validation/train task_ids,
and any candidate whose question or reference answer has the fingerprint of a test item's question or
reference answer is dropped (in the shipped data: MBPP task_ids 569, 602, 608, 704, 872 and 928).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache

from spot_eval.data.datasets import MBPP_SPLITS, load, mbpp_split

SOURCES = ("gsm8k", "math", "mbpp")


@dataclass(frozen=True)
class Pair:
    source: str
    prompt: str
    answer: str


def fingerprint(text: str) -> str:
    """sha256 of the text lowercased with whitespace runs collapsed to one space (and trimmed)."""
    return hashlib.sha256(" ".join(text.lower().split()).encode("utf-8")).hexdigest()


def _mbpp_prompt(record: dict) -> str:
    return "\n".join([record["text"], *record["test_list"]])


def _test_texts() -> Iterator[str]:
    """Each test item's question/prompt and reference answer, in every form training could carry it."""
    for r in load("gsm8k_test"):
        yield from (r["question"], r["answer"])
    for r in load("math500_test"):
        yield from (r["problem"], r["solution"])
    for r in load("humaneval_test"):
        yield from (r["prompt"], r["canonical_solution"], r["prompt"] + r["canonical_solution"])
    for r in mbpp_split("test"):
        yield from (r["text"], _mbpp_prompt(r), r["code"])
    for r in mbpp_split("test", sanitized=True):
        yield from (r["prompt"], r["code"])


@cache
def _test_fingerprints() -> frozenset[str]:
    return frozenset(fingerprint(t) for t in _test_texts())


def test_fingerprints() -> set[str]:
    """Fingerprints of every test item's question/prompt and reference answer across the four test sets."""
    return set(_test_fingerprints())


test_fingerprints.__test__ = False  # a library function, not a pytest test


def _candidates(source: str) -> Iterator[tuple[Pair, tuple[str, ...]]]:
    """(pair, extra texts to screen) for every training record of one source: an MBPP prompt appends the
    asserts to the task text, so the bare text is screened too."""
    if source == "gsm8k":
        for r in load("gsm8k_train"):
            yield Pair(source, r["question"], r["answer"]), ()
    elif source == "math":
        for r in load("math_train"):
            yield Pair(source, r["problem"], r["solution"]), ()
    elif source == "mbpp":
        ids = set(MBPP_SPLITS["prompt"]) | set(MBPP_SPLITS["validation"]) | set(MBPP_SPLITS["train"])
        for r in load("mbpp_full"):
            if r["task_id"] in ids:
                # upstream code uses CRLF (and a few stray CR) line endings; train on plain newlines
                yield Pair(source, _mbpp_prompt(r), "\n".join(r["code"].splitlines())), (r["text"],)
    else:
        raise ValueError(f"unknown training source {source!r}; known: {', '.join(SOURCES)}")


def training_pairs(sources: Iterable[str] = SOURCES) -> list[Pair]:
    """Prompt -> answer pairs from the training splits of `sources`, with test-item collisions dropped."""
    banned = _test_fingerprints()
    return [
        pair
        for source in sources
        for pair, extra in _candidates(source)
        if not any(fingerprint(t) in banned for t in (pair.prompt, pair.answer, *extra))
    ]
