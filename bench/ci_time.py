"""Time CI as it runs: `.ci/run` on a clean clone of HEAD, and write what it printed to results/measurements.

    python bench/ci_time.py                 # clone HEAD, run .ci/run there, write results/measurements/ci-latest.json
    python bench/ci_time.py --log ci.log    # read the output of a run made by hand instead (with --commit)

The file holds the latest run only (its date, commit, tests, coverage, the time of the installs and of pytest, the
slowest tests); `python docs/generate.py` renders it on the Tests and CI page beside the short before-and-after
table of results/measurements/ci.toml. Prints the same figures as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LATEST = ROOT / "results" / "measurements" / "ci-latest.json"
SLOWEST = 10
LOW_COVERAGE = 80  # the modules below it are listed, with why (results/measurements/ci.toml)


def run_ci(commit: str) -> str:
    """.ci/run's output on a clean clone of `commit`, stdout and stderr together; raises when it fails."""
    with tempfile.TemporaryDirectory(prefix="ci-time-") as folder:
        clone = Path(folder) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        subprocess.run(["git", "-C", str(clone), "checkout", "-q", commit], check=True)
        started = time.monotonic()
        run = subprocess.run(["bash", ".ci/run"], cwd=clone, capture_output=True, text=True)
        log = run.stdout + run.stderr + f"\nci_time: wall {time.monotonic() - started:.0f} s\n"
        if run.returncode != 0:
            sys.stderr.write(log[-5000:])
            raise SystemExit(f"bench/ci_time.py: .ci/run failed with exit status {run.returncode}; nothing written")
        return log


def figures(log: str, commit: str) -> dict:
    """What a .ci/run log says: tests, coverage, pytest's seconds, the whole run's seconds, the slowest tests."""
    def found(pattern: str, what: str) -> re.Match:
        match = re.search(pattern, log, flags=re.M)
        if match is None:
            raise SystemExit(f"bench/ci_time.py: the log has no {what} (pattern {pattern!r}); is it a whole .ci/run log?")
        return match

    summary = found(r"^=*\s*(\d+) passed(?:, (\d+) skipped)?.* in ([\d.]+)s", "pytest summary line")
    total = int(found(r"^ci: done in (\d+) s", "'ci: done' line")[1])
    coverage = found(r"Total coverage: ([\d.]+)%", "coverage total")[1]
    slowest = re.findall(r"^([\d.]+)s (?:call|setup|teardown)\s+(\S+)", log, flags=re.M)[:SLOWEST]
    # coverage's table: name, statements, missed, percent
    modules = [(name, float(percent)) for name, percent in re.findall(r"^((?:spot|spot_eval)/\S+\.py)\s+\d+\s+\d+\s+(\d+)%", log, flags=re.M)]
    pytest = float(summary[3])
    return {
        "bench": "ci_time", "date": time.strftime("%Y-%m-%d"), "commit": commit[:7], "machine": f"{_cores()}-core CPU, "
        f"{platform.machine()}", "command": "bash .ci/run (clean clone)", "tests": int(summary[1]),
        "skipped": int(summary[2] or 0), "coverage_percent": float(coverage), "pytest_seconds": round(pytest),
        "other_seconds": total - round(pytest), "total_seconds": total,
        "slowest": [[float(seconds), test] for seconds, test in slowest],
        "below_80_percent": [[name, percent] for name, percent in modules if percent < LOW_COVERAGE],
    }


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", default=None, help="a .ci/run output to read instead of running it")
    parser.add_argument("--commit", default=None, help="the commit the run tested (default: HEAD)")
    parser.add_argument("--out", default=str(LATEST))
    args = parser.parse_args(argv)
    commit = args.commit or subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                                           check=True).stdout.strip()
    log = Path(args.log).read_text() if args.log else run_ci(commit)
    result = figures(log, commit)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
