"""What a nightly-format suite costs on this machine: run it (`spot-eval nightly --dry-run`) and time it, or read
the runs an earlier (perhaps resumed) regeneration left, and print one JSON line.

    python bench/suite_time.py --suite results/comparison/single-t0.toml --out OUT      # run it, timed
    python bench/suite_time.py --suite spot_eval/reports/suites/nightly.toml --out OUT   # the nightly suite
    python bench/suite_time.py --suite results/comparison/single-t0.toml --out OUT --read # the runs in OUT only

`wall_seconds` is the command's own time (absent with --read, and meaningless for a run resumed from its cache);
`decode_seconds` sums every request's decoding over every method from the runs' samples, the part a resumed
regeneration keeps from each session, so it is the figure to compare between suites and machines.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd


def decode_seconds(folder: Path) -> dict:
    """Requests, samples and the decoding seconds summed over every run of a suite's output folder."""
    runs = sorted(folder.glob("runs/*/samples.jsonl"))
    if not runs:
        raise SystemExit(f"bench/suite_time.py: no runs under {folder}/runs; run the suite first (without --read)")
    samples = pd.concat([pd.read_json(path, lines=True) for path in runs])
    requests = samples.drop_duplicates(["task", "doc_id", "repeat", "request"])
    return {"runs": len(runs), "requests": len(requests), "samples": len(samples),
            "decode_seconds": round(float(samples["seconds"].sum()), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", required=True, help="a suite file (spot-eval nightly --suite)")
    parser.add_argument("--out", required=True, help="the nightly's --out folder")
    parser.add_argument("--date", default=None, help="the nightly's --date (default: the suite file's stem)")
    parser.add_argument("--read", action="store_true", help="read the finished runs in OUT instead of running the suite")
    parser.add_argument("--tracking-uri", default=None, help="passed to the nightly (default: an sqlite file in OUT)")
    args = parser.parse_args()
    date = args.date or Path(args.suite).stem
    out = Path(args.out)
    figures = {"bench": "suite_time", "suite": args.suite, "date": date}
    if not args.read:
        uri = args.tracking_uri or f"sqlite:///{(out / f'{date}.db').resolve()}"
        out.mkdir(parents=True, exist_ok=True)
        command = [str(Path(sys.executable).with_name("spot-eval")), "nightly", "--suite", args.suite, "--out", str(out),
                   "--date", date, "--dry-run", "--tracking-uri", uri]
        started = time.perf_counter()
        done = subprocess.run(command, stdout=subprocess.DEVNULL)
        figures |= {"wall_seconds": round(time.perf_counter() - started, 1), "returncode": done.returncode}
    figures |= decode_seconds(out / date)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
