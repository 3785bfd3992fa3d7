"""Files written whole or not at all: an interrupted run never leaves half a checkpoint, graph or shard."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def write_atomically(path: str | Path, write: Callable[[Path], object]) -> None:
    """`write(tmp)` a temporary file beside `path` (named for this process, so that concurrent writers of
    one path never share it), then rename it over `path`; the parent directory is created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
