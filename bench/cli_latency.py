"""How long `spot-eval` takes to answer when it loads nothing heavy: --help, a subcommand's --help, and a refusal.

Each command runs as a fresh process of the installed console script, `--repeats` times, interleaved with `python -c
pass` (the interpreter's own start, the floor) so that both see the same machine. Until its process ends a command
has printed only its one answer, so the wall time to the exit is the time to that line. Prints one JSON object: per
command the median seconds, the median of `python -c pass`, and their ratio; and the goal (issue 66: each answer
within 0.5 s on this CPU).

Usage: python bench/cli_latency.py [--repeats 9]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "spot-eval --help": ["--help"],
    "spot-eval decode --help": ["decode", "--help"],
    "spot-eval decode --prompt hi --temperature -1": ["decode", "--prompt", "hi", "--temperature", "-1"],
}
GOAL_S = 0.5


def seconds(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, capture_output=True, check=False)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    console = shutil.which("spot-eval")
    if console is None:
        raise SystemExit("error: no spot-eval console script on PATH; pip install -e . first")
    floor, times = [], {name: [] for name in COMMANDS}
    for _ in range(args.repeats):
        floor.append(seconds([sys.executable, "-c", "pass"]))
        for name, argv in COMMANDS.items():
            times[name].append(seconds([console, *argv]))
    python = statistics.median(floor)
    commands = {name: {"median_s": round(statistics.median(t), 3), "over_python": round(statistics.median(t) / python, 1)}
                for name, t in times.items()}
    print(json.dumps({"repeats": args.repeats, "python_c_pass_s": round(python, 3), "goal_s": GOAL_S,
                      "commands": commands, "all_within_goal": all(c["median_s"] <= GOAL_S for c in commands.values())}))


if __name__ == "__main__":
    main()
