"""The outage spool: one evaluation's journal, written beside every tracking call.

If the tracking store is unreachable at the start, or a call fails with an outage later, the
tracker (writer.py) goes on writing here only, and `spot-eval sync` (sync.py) later replays the
journal into the store. An evaluation that ends with no outage deletes its spool entry.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class Spool:
    """One evaluation's journal: `journal.jsonl` (an `open` header, then one record per call: start,
    params, metrics, tags, inputs, experiment_tags, artifact, end, outage) and artifact copies under
    `artifacts/<n>/`. The writer holds an flock on `lock`, so `sync` never replays a journal that is still
    growing."""

    JOURNAL = "journal.jsonl"
    LOCK = "lock"

    def __init__(self, path: Path, header: Mapping[str, object]) -> None:
        path.mkdir(parents=True)
        self.path = path
        self._lock = (path / self.LOCK).open("a")
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        self._journal = (path / self.JOURNAL).open("a", encoding="utf-8")
        self._copies = 0
        self.append({"op": "open", **header})

    def append(self, record: Mapping[str, object]) -> None:
        self._journal.write(json.dumps(record) + "\n")
        self._journal.flush()  # a crash loses at most the call in flight

    def copy_artifact(self, path: Path) -> str:
        """Copy a file or directory into the spool; returns the copy's path relative to the spool."""
        relative = Path("artifacts") / str(self._copies) / path.name
        self._copies += 1
        (self.path / relative).parent.mkdir(parents=True)
        if path.is_dir():
            shutil.copytree(path, self.path / relative)
        else:
            shutil.copy2(path, self.path / relative)
        return relative.as_posix()

    def close(self, delete: bool) -> None:
        self._journal.close()
        if delete:
            shutil.rmtree(self.path)
            with contextlib.suppress(OSError):  # the spool folder too, unless other entries are in it
                self.path.parent.rmdir()
        self._lock.close()  # releases the flock

    @staticmethod
    def read(path: Path) -> list[dict[str, Any]]:
        records = []
        for line in (path / Spool.JOURNAL).read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a torn last line: the process died while writing it
        return records

    @staticmethod
    @contextmanager
    def claim(path: Path) -> Iterator[bool]:
        """True (and the lock held until exit) if no live process is writing the entry."""
        with (path / Spool.LOCK).open("a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
