"""Runs bench scripts one after another in this one Python process, each as `__main__` with its own argv, as if
started alone: an interpreter start with torch and transformers, and on a GPU a CUDA context, cost seconds each,
on the device's clock (bench/device_check.sh).

A step that fails is reported, its traceback on stderr and one `{"bench": "steps", "failed": ...}` line on
stdout (where the figures go), and the next step still runs: a GPU lease is short and rare, and one step's bug
must not cost the others' figures. The exit status is 1 when any step failed.

Usage: python bench/steps.py TITLE "SCRIPT ARG..." [TITLE "SCRIPT ARG..." ...]   (scripts relative to bench/)
"""

from __future__ import annotations

import gc
import json
import runpy
import sys
import traceback
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parent


def run(steps: list[tuple[str, str]], folder: Path = BENCH) -> list[str]:
    """Run each (title, "script arg...") in order; returns the titles of the steps that failed."""
    sys.path.insert(0, str(folder))  # the scripts import their siblings, as when started from bench/
    failed = []
    for title, command in steps:
        print(f"steps: {title}", file=sys.stderr, flush=True)
        script, *args = command.split()
        sys.argv = [str(folder / script), *args]
        try:
            runpy.run_path(str(folder / script), run_name="__main__")
        except (Exception, SystemExit) as error:
            if not (isinstance(error, SystemExit) and error.code in (0, None)):
                traceback.print_exc()
                print(json.dumps({"bench": "steps", "failed": title, "error": repr(error)[:500]}), flush=True)
                failed.append(title)
        sys.stdout.flush()
        gc.collect()  # the step's globals, and on a failure its traceback's frames, hold its model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the next step's model gets the memory back
    return failed


def main() -> None:
    pairs = sys.argv[1:]
    if not pairs or len(pairs) % 2:
        sys.exit(f"usage: python {sys.argv[0]} TITLE 'SCRIPT ARG...' [TITLE 'SCRIPT ARG...' ...]")
    sys.exit(1 if run(list(zip(pairs[::2], pairs[1::2], strict=True))) else 0)


if __name__ == "__main__":
    main()
