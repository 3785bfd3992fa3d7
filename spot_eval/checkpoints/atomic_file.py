"""Files written whole or not at all: an interrupted run never leaves half a checkpoint, graph or shard."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def write_atomically(path: str | Path, write: Callable[[Path], object]) -> None:
    """`write(tmp)` a temporary file beside `path` (named for this process, so that concurrent writers of
    one path never share it), then rename it over `path`; the parent directory is created.

    The file's bytes are flushed to the disk before the rename and the directory's entry after it, so that a
    power loss leaves the old file or the new one, never a renamed file that is empty."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        _fsync(tmp, os.O_RDONLY)
        os.replace(tmp, path)
        _fsync(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    finally:
        tmp.unlink(missing_ok=True)


def _fsync(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
