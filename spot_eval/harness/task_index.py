"""lm-eval's index of its own task library, kept between runs of `lm_eval --model spot`.

lm-eval 0.4.13 parses every YAML file of its task library (about 14,000) on each start to find the tasks a
run names: about 7 s of a 2-core machine's time before the first request, every run. That part of the index
depends only on those files, so it is kept as JSON under `$XDG_CACHE_HOME/spot-eval/lm-eval-index/`, keyed by
lm-eval's version and the path, size and modification time of every YAML file in the library (a stat of each,
about 0.1 s): an edited, added or removed task file or another lm-eval makes another key, and the library is
indexed again. Only the newest index is kept. The folders of `--include_path` (a user's own tasks, few and
often edited) are indexed on every run as before, and override the library's tasks as before.

JSON, not pickle, so that the cache cannot run code; an index that does not survive the round trip exactly
is not written.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from spot_eval.checkpoints.atomic_file import write_atomically

FORMAT = "spot-eval-lm-eval-index/1"


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "spot-eval" / "lm-eval-index"


def install() -> None:
    """Make lm-eval's `TaskIndex.build` read and write the cache (idempotent)."""
    from lm_eval.tasks._index import TaskIndex

    build = TaskIndex.__dict__["build"].__func__
    if getattr(build, "_spot_cached", False):
        return
    TaskIndex.build = staticmethod(cached(build))


def cached(build):
    """`TaskIndex.build` with the library's part read from the cache: each folder indexed on its own, merged in
    order as lm-eval merges them (a later folder's task overrides an earlier one's, with lm-eval's warning)."""
    log = logging.getLogger("lm_eval.tasks._index")

    @functools.wraps(build)
    def wrapper(paths, *, resolve_includes: bool = True) -> dict:
        index: dict = {}
        for root in map(Path, paths):
            if is_library(root):
                part = library_index(root, resolve_includes, build)
            else:
                part = build([root], resolve_includes=resolve_includes)
            for name, entry in part.items():
                if name in index:
                    log.warning("Task '%s' from %s overrides existing task from %s", name, entry.yaml_path, index[name].yaml_path)
                index[name] = entry
        return index

    wrapper._spot_cached = True
    return wrapper


def is_library(root: Path) -> bool:
    import lm_eval.tasks

    return root.resolve() == Path(lm_eval.tasks.__file__).resolve().parent


def library_index(root: Path, resolve_includes: bool, build) -> dict:
    file = cache_dir() / f"{key(root, resolve_includes)}.json"
    index = read(file)
    if index is None:
        index = build([root], resolve_includes=resolve_includes)
        write(file, index)
    return index


def key(root: Path, resolve_includes: bool) -> str:
    """A digest of lm-eval's version and every YAML file's path, size and modification time under `root`."""
    from lm_eval import __version__

    digest = hashlib.sha256(f"{FORMAT}\0{__version__}\0{resolve_includes}\0{root}".encode())
    for directory, files in sorted((d, sorted(f for f in names if f.endswith(".yaml"))) for d, _, names in os.walk(root)):
        for name in files:
            stat = os.stat(os.path.join(directory, name))
            digest.update(f"\0{directory}/{name} {stat.st_size} {stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:32]


def encode(index: dict) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "entries": [
            {"key": k, "name": e.name, "kind": e.kind.name, "yaml_path": None if e.yaml_path is None else str(e.yaml_path),
             "cfg": e.cfg, "tags": sorted(e.tags)}
            for k, e in index.items()
        ],
    }


def decode(raw: dict[str, Any]) -> dict:
    from lm_eval.tasks._index import Entry, Kind

    if raw.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT} file")
    return {
        e["key"]: Entry(e["name"], Kind[e["kind"]], None if e["yaml_path"] is None else Path(e["yaml_path"]), e["cfg"], set(e["tags"]))
        for e in raw["entries"]
    }


def read(file: Path) -> dict | None:
    """The index in `file`, or None where there is none or it cannot be read (then it is built again)."""
    try:
        return decode(json.loads(file.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write(file: Path, index: dict) -> None:
    """Keep `index` in `file` (replacing older indexes) when it survives JSON exactly; a cache that cannot be
    written costs only the next run's rebuild."""
    try:
        text = json.dumps(encode(index))
        if decode(json.loads(text)) != index:
            return
        write_atomically(file, lambda tmp: tmp.write_text(text))
        for old in file.parent.glob("*.json"):
            if old != file:
                old.unlink(missing_ok=True)
    except (OSError, TypeError, ValueError):
        return
