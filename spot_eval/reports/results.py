"""Evaluation results read back as tables: run directories (spot_eval/harness/session.py) and nightly bundles.

A *bundle* gathers several runs of one configuration sweep (temperatures x seeds) into one JSON
file: the unit that nightly reports compare, that `spot-eval compare` tabulates and that
`results/` pins as a baseline.

    {"format": "spot-eval-results/1", "created": ..., "settings": {"target", "block_length", "gen_length"},
     "runs": [{"temperature", "seed", "mlflow_run_id", "dir"}],
     "samples": [{temperature, seed, task, doc_id, repeat, label, forwards, seconds, ...}],
     "outcomes": [{temperature, seed, task, doc_id, filter, metric, value}],
     "accuracy": [{temperature, seed, task, metric, value}]}

Every reader names the file and the fix when it cannot use what it finds.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

FORMAT = "spot-eval-results/1"
SAMPLE_FIELDS = (
    "task", "doc_id", "repeat", "request", "label", "method", "budget", "tokens", "forwards", "steps",
    "seconds", "target_seconds", "drafter_seconds", "accepted_lengths", "lossless", "divergence", "draft_nodes",
    "mean_tree_size", "lossy", "token_divergence",
)
SETTINGS = ("target", "block_length", "gen_length")  # must agree for runs to share a table


class ResultsError(ValueError):
    """A results file or run directory that cannot be used; the message names it and the fix."""


@dataclass(frozen=True)
class Bundle:
    settings: dict
    runs: list[dict]
    samples: pd.DataFrame  # one row per request and method (SAMPLE_FIELDS + temperature, seed)
    outcomes: pd.DataFrame  # one row per scored sample and metric
    accuracy: pd.DataFrame  # lm-eval's aggregate per task and metric
    created: str = ""

    @property
    def identity(self) -> dict[str, str]:
        """What ran (spot_eval.harness.lm.identity_tags and the commit), each field's distinct values over the
        runs joined, and the largest peak memory; empty for runs written before run.json recorded it."""
        fields: dict[str, list[str]] = {}
        for run in self.runs:
            for key, value in (run.get("identity") or {}).items():
                if value and str(value) not in fields.setdefault(key, []):
                    fields[key].append(str(value))
        out = {key: ", ".join(values) for key, values in fields.items() if values}
        peaks = [run["peak_memory_mb"] for run in self.runs if run.get("peak_memory_mb") is not None]
        if peaks:
            out["peak_memory_mb"] = f"{max(peaks):.0f}"
        return out

    def to_json(self) -> dict:
        return {
            "format": FORMAT, "created": self.created, "settings": self.settings, "runs": self.runs,
            "samples": self.samples.to_dict("records"), "outcomes": self.outcomes.to_dict("records"),
            "accuracy": self.accuracy.to_dict("records"),
        }

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), default=_plain) + "\n")
        return path


def _plain(value: object) -> object:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


# -- run directories ----------------------------------------------------------------------------------


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ResultsError(f"{path}: line {n} is not JSON ({err.msg}); the file is corrupt, rerun the evaluation") from None
    return rows


def read_run(run_dir: str | Path) -> Bundle:
    """One `lm_eval --model spot` run directory as a one-run bundle."""
    run_dir = Path(run_dir)
    run_file, samples_file = run_dir / "run.json", run_dir / "samples.jsonl"
    for needed in (run_file, samples_file):
        if not needed.is_file():
            raise ResultsError(
                f"{run_dir} is not a spot-eval run directory: {needed.name} is missing "
                "(pass the output_dir of an `lm_eval --model spot` run)"
            )
    try:
        run = json.loads(run_file.read_text())
    except json.JSONDecodeError as err:
        raise ResultsError(f"{run_file} is not JSON ({err.msg}); the run directory is corrupt") from None
    decoder = run.get("decoder") or {}
    temperature = float((decoder.get("sampling") or {}).get("temperature", 0.0))
    seed = int(decoder.get("seed", 0))
    samples = pd.DataFrame(_read_jsonl(samples_file))
    if samples.empty:
        raise ResultsError(f"{samples_file} holds no samples: the run decoded nothing (check --limit and --tasks)")
    # policy: the decoder's commit rule, which each method's ratios are taken against (SPOT-Sets: threshold)
    policy = decoder.get("policy", "single")
    samples = samples[[c for c in SAMPLE_FIELDS if c in samples.columns]].assign(temperature=temperature, seed=seed, policy=policy)
    accuracy = _accuracy(run_dir, temperature, seed)
    accuracy = accuracy.assign(policy=policy) if not accuracy.empty else accuracy
    outcomes_file = run_dir / "outcomes.jsonl"
    outcomes = pd.DataFrame(_read_jsonl(outcomes_file)) if outcomes_file.is_file() else pd.DataFrame()
    outcomes = outcomes.assign(temperature=temperature, seed=seed, policy=policy) if not outcomes.empty else outcomes
    settings = {
        "target": run.get("target_id") or (run.get("fingerprints") or {}).get("target"),
        "block_length": decoder.get("block_length"),
        "gen_length": decoder.get("gen_length"),
    }
    info = {"temperature": temperature, "seed": seed, "mlflow_run_id": run.get("mlflow_run_id"), "dir": str(run_dir),
            "identity": run.get("identity") or {}, "peak_memory_mb": run.get("peak_memory_mb")}
    return Bundle(settings, [info], samples, outcomes, accuracy)


def _accuracy(run_dir: Path, temperature: float, seed: int) -> pd.DataFrame:
    path = run_dir / "lm_eval_results.json"
    if not path.is_file():
        return pd.DataFrame()
    results = json.loads(path.read_text()).get("results") or {}
    rows = [
        {"temperature": temperature, "seed": seed, "task": task, "metric": metric, "value": float(value)}
        for task, metrics in results.items()
        for metric, value in metrics.items()
        if isinstance(value, (int, float)) and "stderr" not in metric and metric != "alias"
    ]
    return pd.DataFrame(rows)


def combine(bundles: list[Bundle]) -> Bundle:
    """One bundle from several; their settings must agree."""
    if not bundles:
        raise ResultsError("no results to combine")
    check_settings([b.settings for b in bundles], [r.get("dir", "?") for b in bundles for r in b.runs[:1]])
    return Bundle(
        settings=bundles[0].settings,
        runs=[r for b in bundles for r in b.runs],
        samples=pd.concat([b.samples for b in bundles], ignore_index=True),
        outcomes=pd.concat([b.outcomes for b in bundles], ignore_index=True),
        accuracy=pd.concat([b.accuracy for b in bundles], ignore_index=True),
        created=time.strftime("%Y-%m-%dT%H:%M:%S"),
    )


def check_settings(settings: list[dict], names: list[str]) -> None:
    """Refuse results with different target, block length or generation length in one table."""
    for key in SETTINGS:
        values = {str(s.get(key)) for s in settings}
        if len(values) > 1:
            found = ", ".join(f"{name}: {s.get(key)}" for name, s in zip(names, settings, strict=False))
            raise ResultsError(
                f"results with different {key} cannot share a table ({found}); compare runs of one setting at a time"
            )


# -- bundles ------------------------------------------------------------------------------------------


def read_bundle(path: str | Path) -> Bundle:
    path = Path(path)
    if not path.is_file():
        raise ResultsError(f"results file {path} does not exist")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ResultsError(f"results file {path} is corrupt ({err}); restore it from git or rerun the nightly") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ResultsError(f"{path} is not a spot-eval results bundle (format {found!r}, expected {FORMAT!r})")
    try:
        samples = pd.DataFrame(data["samples"])
        if samples.empty or not {"task", "label", "forwards", "seconds", "temperature", "seed"} <= set(samples.columns):
            raise KeyError("samples")
        outcomes, accuracy = pd.DataFrame(data.get("outcomes") or []), pd.DataFrame(data.get("accuracy") or [])
        # bundles written before runs recorded their policy decoded single-commit
        samples, outcomes, accuracy = (f if f.empty or "policy" in f else f.assign(policy="single")
                                       for f in (samples, outcomes, accuracy))
        return Bundle(data["settings"], data["runs"], samples, outcomes, accuracy, data.get("created", ""))
    except (KeyError, TypeError) as err:
        raise ResultsError(f"results bundle {path} lacks {err}; it is truncated or corrupt, rerun the nightly") from None


def read_any(path: str | Path) -> Bundle:
    """A bundle file, or a run directory, or a directory of run directories."""
    path = Path(path)
    if path.is_file():
        return read_bundle(path)
    if (path / "run.json").is_file():
        return read_run(path)
    if path.is_dir():
        runs = sorted(p for p in path.iterdir() if (p / "run.json").is_file())
        if (path / "nightly.json").is_file():
            return read_bundle(path / "nightly.json")
        if runs:
            return combine([read_run(p) for p in runs])
    raise ResultsError(f"{path}: no results bundle or spot-eval run directory there")


# -- tables -------------------------------------------------------------------------------------------


def summarize(samples: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per keys + label: sums over the requests, and ratios against draft-free on the same keys.

    throughput_ratio is draft-free seconds / method seconds (summed), forward_ratio likewise with
    target forwards: the SPOT paper's definitions. Every request's methods are decoded back to back in one
    process, so each request's draft-free and speculative seconds were measured side by side, whether in this
    process or (resumed: the count of requests read back from lm-eval's cache) in an earlier one. lossy: the method differs from draft-free by design
    (max-commit), so 1 - lossless is its divergence rate over requests and token_divergence (mean over
    requests) over output positions, not a failure.
    """
    if samples.empty:
        return samples
    df = samples.assign(accepted_mean=samples["accepted_lengths"].map(lambda a: sum(a) / max(len(a), 1)),
                        verifies=samples["accepted_lengths"].map(len))
    if "draft_nodes" not in df.columns:  # runs written before budget=auto recorded no tree sizes
        df["draft_nodes"] = float("nan")
    # Runs written before lossy methods existed: every method lossless, token divergence unmeasured.
    df["lossy"] = df["lossy"].eq(True) if "lossy" in df.columns else False
    if "token_divergence" not in df.columns:
        df["token_divergence"] = float("nan")
    df["resumed"] = df["resumed"].eq(True) if "resumed" in df.columns else False  # older runs resumed nothing
    grouped = df.groupby([*keys, "label"], sort=False).agg(
        requests=("forwards", "size"), resumed=("resumed", "sum"), tokens=("tokens", "sum"), forwards=("forwards", "sum"),
        seconds=("seconds", "sum"), drafter_seconds=("drafter_seconds", "sum"),
        lossless=("lossless", "mean"), lossy=("lossy", "max"), token_divergence=("token_divergence", "mean"),
        accepted_mean=("accepted_mean", "mean"), draft_nodes=("draft_nodes", lambda x: x.sum(min_count=1)), verifies=("verifies", "sum"),
    ).reset_index()
    grouped["mean_tree_size"] = grouped.pop("draft_nodes") / grouped.pop("verifies").clip(lower=1)
    base = grouped[grouped["label"] == "draft_free"].set_index(keys)
    index = pd.MultiIndex.from_frame(grouped[keys]) if len(keys) > 1 else grouped[keys[0]]
    grouped["forward_ratio"] = base["forwards"].reindex(index).to_numpy() / grouped["forwards"]
    grouped["throughput_ratio"] = base["seconds"].reindex(index).to_numpy() / grouped["seconds"]
    grouped["tokens_per_forward"] = grouped["tokens"] / grouped["forwards"]
    grouped["drafter_share"] = grouped["drafter_seconds"] / grouped["seconds"]
    return grouped
