"""Scoring time per candidate, before and after the tests moved out of the sandbox (issue 54), and what crossed.

Scores the 500 MBPP test-split reference solutions and the 164 HumanEval canonical solutions, one candidate at a
time (`sandbox.run`, one worker, so each time is one candidate's: its processes' start, the program, the tests),
with two trees of spot_eval: `--before REV`'s (extracted with `git archive`, default 170dc65, the last commit with
the in-process tests) and this one. The sides alternate, `--repeats` times each, in fresh interpreters; a
candidate's time is its median over the repeats. Prints one JSON line: per task and overall, the median and 90th
percentile per candidate of each side and the ratio of medians (after / before); the candidates that did not
pass on either side; and, after, per kind of crossing (spot_eval.execution.judge) the problems where it
occurred, and the problems on the weaker guarantee ("program object").

Usage: python bench/scoring_time.py [--before 170dc65] [--repeats 3] [--limit N per task]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def items(limit: int | None) -> list[tuple[str, str, dict, str]]:
    """(task, program, document, kind) for every candidate, as the spot tasks build them."""
    from spot_eval.data import datasets

    mbpp = [("spot_mbpp", d["code"], d, "mbpp") for d in datasets.mbpp_split("test")]
    humaneval = [("spot_humaneval", p["prompt"] + p["canonical_solution"], p, "humaneval") for p in datasets.load("humaneval_test")]
    return mbpp[:limit] + humaneval[:limit]


def measure(side: str, limit: int | None) -> list[dict]:
    """Run in a fresh interpreter whose spot_eval is the side's tree: each candidate's seconds and outcome."""
    from spot_eval.execution import sandbox

    if side == "after":
        from spot_eval.execution import problems

        def tests(doc: dict, kind: str):
            return problems.mbpp(doc) if kind == "mbpp" else problems.humaneval(doc)
    else:  # the tree before: tests were one string, run in the program's process

        def tests(doc: dict, kind: str):
            if kind == "mbpp":
                return "\n".join([doc["test_setup_code"], *doc["test_list"]])
            return f"{doc['test']}\ncheck({doc['entry_point']})"

    sandbox.confinement()  # once, outside the timings
    rows = []
    for task, program, doc, kind in items(limit):
        start = time.perf_counter()
        outcome = sandbox.run(program, sandbox.Limits(), tests(doc, kind))
        rows.append({"task": task, "id": str(doc["task_id"]), "s": time.perf_counter() - start, "status": outcome.status,
                     "crossings": list(getattr(outcome, "crossings", ()))})
    return rows


def old_tree(revision: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision, "spot_eval"], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def run_side(side: str, tree: Path, limit: int | None) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    code = f"import sys, json; sys.path.insert(0, {str(ROOT / 'bench')!r}); import scoring_time as b; print(json.dumps(b.measure({side!r}, {limit!r})))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tree, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def summary(times: list[float]) -> dict:
    ordered = sorted(times)
    return {"median_ms": round(1000 * statistics.median(ordered), 1), "p90_ms": round(1000 * ordered[int(0.9 * (len(ordered) - 1))], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="170dc65", help="the revision measured as 'before'")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--limit", type=int, default=None, help="the first N candidates of each task only (a quick look)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="scoring-time-") as tmp:
        trees = {"before": old_tree(args.before, Path(tmp)), "after": ROOT}
        runs: dict[str, list[list[dict]]] = {"before": [], "after": []}
        for _ in range(args.repeats):
            for side in ("before", "after"):
                runs[side].append(run_side(side, trees[side], args.limit))
    result: dict = {"bench": "scoring_time", "before": args.before, "repeats": args.repeats,
                    "candidates": len(runs["after"][0])}
    for task in ("spot_mbpp", "spot_humaneval", "all"):
        entry = {}
        for side, repeats in runs.items():
            per_candidate = [statistics.median(r[i]["s"] for r in repeats) for i, row in enumerate(repeats[0])
                             if task in ("all", row["task"])]
            entry[side] = summary(per_candidate)
        entry["ratio"] = round(entry["after"]["median_ms"] / entry["before"]["median_ms"], 2)
        result[task] = entry
    for side, repeats in runs.items():
        result[f"not_passed_{side}"] = sorted({f"{r['id']}: {r['status']}" for rs in repeats for r in rs if r["status"] != "passed"})
    crossings: dict[str, list[str]] = {}
    for row in runs["after"][0]:
        for kind in row["crossings"]:
            crossings.setdefault(kind, []).append(f"{row['task']}/{row['id']}")
    result["crossings"] = {kind: {"problems": len(ids), "ids": ids} for kind, ids in sorted(crossings.items())}
    result["weaker"] = crossings.get("program object", [])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
