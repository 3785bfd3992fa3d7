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
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from spot_eval import registry

FORMAT = "spot-eval-results/1"
DATE_FORMAT = "%Y-%m-%dT%H:%M:%S"  # `created`: local time, as every results file has written it
SAMPLE_FIELDS = (
    "task", "doc_id", "repeat", "request", "label", "method", "budget", "tokens", "forwards", "steps",
    "seconds", "target_seconds", "drafter_seconds", "accepted_lengths", "lossless", "divergence", "draft_nodes",
    "mean_tree_size", "lossy", "token_divergence", "after_eos_forwards",
)
NEEDED = ("task", "label", "forwards", "steps", "seconds", "drafter_seconds", "tokens", "accepted_lengths", "lossless",
          "lossy", "token_divergence", "draft_nodes")  # what `summarize` reads of each sample
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
    registry.remember(run.get("methods") or {})  # a plugin's name and colour, where it is not installed here
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
    # when the run last wrote its record: what orders it among pooled results (`combine`)
    written = time.strftime(DATE_FORMAT, time.localtime(run_file.stat().st_mtime))
    return Bundle(settings, [info], samples, outcomes, accuracy, written)


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
    """One bundle from several; their settings must agree. Bundles pool their requests (results/comparison/*-more.toml
    extends a suite with later items), and a bundle may add methods to requests that an earlier one decoded (it
    decodes them again with draft-free decoding, its methods' reference, side by side): each sample row then says
    which bundle it came from (`part`), and a method's ratios are taken against the draft-free decode of the same
    request in the same part (`summarize`).

    The parts are numbered in the order their results were written (`created`; the given order among equals): a
    request's first decode is its draft-free row's (draft-free's own row and another policy's anchor), whatever order
    the files are named in, so a part that adds methods later never replaces the decode the request's other
    policies were measured against."""
    if not bundles:
        raise ResultsError("no results to combine")
    bundles = sorted(bundles, key=lambda b: b.created)  # stable: results without a date ("": written before it was kept) first
    check_settings([b.settings for b in bundles], [r.get("dir", "?") for b in bundles for r in b.runs[:1]])
    parts = [b.samples.assign(part=i) if len(bundles) > 1 else b.samples for i, b in enumerate(bundles)]
    samples = pd.concat(parts, ignore_index=True)
    if len(bundles) > 1:
        _check_pooled(samples)
    return Bundle(
        settings=bundles[0].settings,
        runs=[r for b in bundles for r in b.runs],
        samples=samples,
        outcomes=pd.concat([b.outcomes for b in bundles], ignore_index=True),
        accuracy=_pooled_accuracy([b.accuracy for b in bundles], samples) if len(bundles) > 1 else bundles[0].accuracy,
        # the newest part's date, so that a pooled bundle pooled again keeps its place in the order
        created=max(b.created for b in bundles) or time.strftime(DATE_FORMAT),
    )


ACCURACY_KEYS = ("policy", "temperature", "seed", "task")  # what one lm-eval score of a run covers


def _pooled_accuracy(parts: list[pd.DataFrame], samples: pd.DataFrame) -> pd.DataFrame:
    """The parts' lm-eval scores, each weighted (`weight`) by the requests first decoded in its part: a part that
    extends a suite weighs by its items, and one that decodes earlier items again (adding methods) counts for none
    of them, so that the pooled mean is over the items, each once. A part pooled before shares its count among its
    own scores by their weights; a score of a task no sample names (a group's aggregate) keeps its weight."""
    first = samples.drop_duplicates(_request_keys(samples))  # the rows are in part order: each request's first part
    out = []
    for number, accuracy in enumerate(parts):
        if accuracy.empty:
            continue
        keys = [k for k in ACCURACY_KEYS if k in accuracy.columns and k in first.columns]
        counts = first[first.part == number].groupby(keys).size().rename("weight").reset_index()
        prior = accuracy["weight"].to_numpy() if "weight" in accuracy.columns else 1.0
        weighted = accuracy.drop(columns="weight", errors="ignore").assign(prior=prior).merge(counts, on=keys, how="left")
        share = weighted.prior / weighted.groupby([*keys, "metric"]).prior.transform("sum")
        weighted["weight"] = (weighted.weight.fillna(0.0) * share).where(weighted.task.isin(samples.task), weighted.prior)
        out.append(weighted[weighted.weight > 0].drop(columns="prior"))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def _check_pooled(samples: pd.DataFrame) -> None:
    """Refuse a method's request in two bundles (it would weigh its item double in every sum and interval), and a
    request whose draft-free decodes in two bundles took different forwards (the same decoder on the same request:
    one of them is not what the other bundle's methods were checked against)."""
    request = _request_keys(samples)
    methods = samples[samples.label != "draft_free"]
    twice = methods[methods.duplicated([*request, "label"])]
    if not twice.empty:
        first = twice.iloc[0]
        raise ResultsError(
            f"{len(twice)} requests are in more than one of the results given (e.g. {first['task']} document "
            f"{first['doc_id']}, {first['label']}, T = {first['temperature']:g}, seed {first['seed']}): pass each run's "
            "results once, and extend a suite with one that starts after its items (a suite's start) or runs other methods"
        )
    free = samples[samples.label == "draft_free"]
    forwards = free.groupby(request, sort=False)["forwards"].nunique()
    if (forwards > 1).any():
        first = dict(zip(request, forwards[forwards > 1].index[0], strict=True))
        raise ResultsError(
            f"draft-free decoding took different forwards on one request in two of the results given ({first['task']} "
            f"document {first['doc_id']}, T = {first['temperature']:g}, seed {first['seed']}): they were not decoded by "
            "the same target and settings; compare results of one target and decoder"
        )


REQUEST = ("policy", "temperature", "seed", "task", "doc_id", "repeat")  # one decoded request, every method's row of it


def _request_keys(samples: pd.DataFrame) -> list[str]:
    """The columns of `REQUEST` that the samples have (older results lack some): what names one of their requests."""
    return [k for k in REQUEST if k in samples.columns]


def newest_only(bundles: list[Bundle]) -> list[Bundle]:
    """The bundles, newest first, each without the requests a newer one holds (every method's rows of a request come
    from one run, so its ratios stay side by side): what an experiment's runs of the same suite on several days
    give when they are read back as one table."""
    seen: set[tuple] = set()
    out = []
    for bundle in bundles:
        keys = _request_keys(bundle.samples)
        request = list(bundle.samples[keys].itertuples(index=False, name=None))
        kept = bundle.samples[[r not in seen for r in request]]
        seen.update(request)
        if kept.empty:
            continue
        docs = set(kept[["task", "doc_id", "temperature", "seed"]].itertuples(index=False, name=None))
        outcomes = bundle.outcomes
        if not outcomes.empty and {"task", "doc_id", "temperature", "seed"} <= set(outcomes.columns):
            outcomes = outcomes[[d in docs for d in outcomes[["task", "doc_id", "temperature", "seed"]].itertuples(index=False, name=None)]]
        out.append(Bundle(bundle.settings, bundle.runs, kept.reset_index(drop=True), outcomes, bundle.accuracy, bundle.created))
    return out


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
        missing = sorted({*NEEDED, "temperature", "seed", "policy"} - set(samples.columns))
        if samples.empty or missing:
            raise ResultsError(f"results bundle {path}: its samples lack {', '.join(missing) or 'every row'}; it is "
                               "truncated, corrupt or older than this spot-eval: rerun the nightly")
        outcomes, accuracy = pd.DataFrame(data.get("outcomes") or []), pd.DataFrame(data.get("accuracy") or [])
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


# Every figure the run summary, the nightly report, Table 2 and the comparison print, defined once (the docs'
# glossary is generated from these): (column, how the reports show it, what it is).
RATIOS = (
    ("forward_ratio", "fwd ×", "draft-free target forwards / the method's, summed over the same requests: the "
                               "hardware-independent saving"),
    ("throughput_ratio", "tput ×", "draft-free seconds / the method's, summed over the same requests, each request's "
                                   "methods decoded back to back in one process: the wall-clock speed-up on this device"),
    ("accepted_mean", "τ", "decoding steps accepted per target forward: the sum of steps / the sum of forwards (1 for "
                           "a draft-free decoder)"),
    ("tokens_per_forward", "tokens / forward", "output tokens / target forwards (below 1 where EOS or a stop string cuts "
                                               "a block whose positions each took a step)"),
    ("drafter_share", "drafter share", "the drafter's seconds / all seconds"),
    ("mean_tree_size", "tree size", "draft nodes verified / target forwards"),
    ("lossless", "lossless", "the share of requests whose tokens equal draft-free's (of a lossy method, 1 - its "
                             "divergence rate)"),
    ("forward_ratio_to_eos", "fwd × to EOS", "the forward ratio without the forwards that only wrote positions after "
                                             "the answer's first EOS (EOS padding), the method's and draft-free's alike: "
                                             "what the drafter saved on the answer itself"),
    ("after_eos_share", "after EOS", "the share of a method's forwards that only wrote positions after the answer's first "
                                     "EOS: padding, which any drafter guesses; a task whose answers are short is mostly "
                                     "padding"),
)
OVER_SEEDS = ("Over several seeds, the forward and throughput ratios are the mean (± std) of the per-seed ratios, and "
              "τ, tokens per forward, the drafter share and the tree size are of the sums over every seed. The interval "
              "beside a ratio ([low, high]) is its 95% bootstrap interval over the items: a task's documents resampled "
              "2,000 times, each with all its seeds, the ratio of sums recomputed on every resample (a mean over tasks: "
              "the mean of each resample's task ratios). Two methods whose intervals overlap are not told apart.")


def summarize(samples: pd.DataFrame, keys: list[str], anchor: str | None = None) -> pd.DataFrame:
    """Per keys + label: the sums over the requests and every figure of `RATIOS`, against the draft-free decoder on
    the same requests: the SPOT paper's definitions. Every request's methods are decoded back to back in one process,
    so its draft-free and speculative seconds were measured side by side, in this process or (resumed: the count of
    requests read back from lm-eval's cache) in an earlier one; a method's reference is the draft-free decode of
    each of its requests in its own run (`part`, where results that add methods to decoded requests are pooled:
    `combine`), summed over the same requests as the method's.

    anchor: with "policy" among the keys, each policy's own draft-free decoder is measured against the `anchor`
    policy's draft-free decoder on the same requests (Table 2's threshold-decoding row over single commit);
    without it a draft-free row is its own reference.
    """
    if samples.empty:
        return samples
    # A run directory's samples say which requests were resumed; a bundle's keep none of them.
    df = samples.assign(verifies=samples["accepted_lengths"].map(len),
                        resumed=samples["resumed"].eq(True) if "resumed" in samples.columns else False)
    # target_seconds: the verify forwards' share of `seconds` (results written before it was kept have none)
    target = {"target_seconds": ("target_seconds", "sum")} if "target_seconds" in df.columns else {}
    # after_eos_forwards: results written before it was kept have none (their padding columns stay empty)
    padded = _has_padding(df)
    padding = {"after_eos_forwards": ("after_eos_forwards", "sum")} if padded else {}
    sums = ["forwards", "seconds", *padding]
    df = df.assign(**_references(samples, sums, keys, anchor))[_shown(df)]
    grouped = df.groupby([*keys, "label"], sort=False).agg(
        requests=("forwards", "size"), resumed=("resumed", "sum"), tokens=("tokens", "sum"), forwards=("forwards", "sum"),
        steps=("steps", "sum"), seconds=("seconds", "sum"), drafter_seconds=("drafter_seconds", "sum"), **target,
        lossless=("lossless", "mean"), lossy=("lossy", "max"), token_divergence=("token_divergence", "mean"),
        draft_nodes=("draft_nodes", "sum"), verifies=("verifies", "sum"), **padding,
        **{f"reference_{c}": (f"reference_{c}", _whole_sum) for c in sums},
    ).reset_index()
    grouped["lossy"] = grouped["lossy"].astype(bool)
    grouped["forward_ratio"] = grouped["reference_forwards"] / grouped["forwards"]
    grouped["throughput_ratio"] = grouped["reference_seconds"] / grouped["seconds"]
    if padded:
        grouped["forward_ratio_to_eos"] = ((grouped["reference_forwards"] - grouped["reference_after_eos_forwards"])
                                           / (grouped["forwards"] - grouped["after_eos_forwards"]))
    return _pooled(grouped.drop(columns=[f"reference_{c}" for c in sums]))


def _whole_sum(values: pd.Series) -> float:
    """The sum, or NaN where a value is missing: a ratio over some of a method's requests would not be its ratio."""
    return values.sum() if values.notna().all() else np.nan


def _has_padding(samples: pd.DataFrame) -> bool:
    return "after_eos_forwards" in samples.columns and bool(samples["after_eos_forwards"].notna().all())


def _shown(samples: pd.DataFrame) -> np.ndarray:
    """[rows] bool, by position (an index may repeat): every row but a draft-free decode that an earlier part holds
    already (a part that adds methods to decoded requests decodes them again, as its methods' reference: `combine`),
    so that each request counts once."""
    if "part" not in samples.columns:
        return np.ones(len(samples), dtype=bool)
    request = _request_keys(samples)
    return ~((samples.label == "draft_free") & samples.duplicated([*request, "label"])).to_numpy()


def _references(samples: pd.DataFrame, columns: list[str], keys: list[str], anchor: str | None) -> dict[str, np.ndarray]:
    """{reference_<column>: [rows]}: each row's reference, its request's draft-free decode in the same part (where the
    method was decoded beside it), or, for a draft-free row of another policy than `anchor` (with "policy" among the
    keys), the anchor policy's draft-free decode of the request; a draft-free row is otherwise its own. NaN where
    the reference was not decoded."""
    request = _request_keys(samples)
    free = samples[samples.label == "draft_free"]
    out = _lookup(samples, free, [*request, *(["part"] if "part" in samples.columns else [])], columns)
    if anchor is not None and "policy" in keys and "policy" in request:
        moved = ((samples.label == "draft_free") & (samples.policy != anchor)).to_numpy()
        out[moved] = _lookup(samples[moved].assign(policy=anchor), free[_shown(free)], request, columns)
    return {f"reference_{c}": out[:, i] for i, c in enumerate(columns)}


def _lookup(rows: pd.DataFrame, table: pd.DataFrame, on: list[str], columns: list[str]) -> np.ndarray:
    """[rows, columns]: `table`'s columns at each row's values of `on` (its first row there; NaN where it has none)."""
    found = rows[on].merge(table.drop_duplicates(on)[[*on, *columns]], on=on, how="left")  # keeps the rows' order
    return found[columns].to_numpy(float)


def _pooled(sums: pd.DataFrame) -> pd.DataFrame:
    """The figures of `RATIOS` that are ratios of sums, whether the sums run over requests or over seeds."""
    sums["accepted_mean"] = sums["steps"] / sums["forwards"]
    sums["tokens_per_forward"] = sums["tokens"] / sums["forwards"]
    sums["drafter_share"] = sums["drafter_seconds"] / sums["seconds"]
    sums["mean_tree_size"] = sums["draft_nodes"] / sums["verifies"].clip(lower=1)
    if "after_eos_forwards" in sums.columns:
        sums["after_eos_share"] = sums["after_eos_forwards"] / sums["forwards"]
    return sums


def over_seeds(summary: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """`summarize`'s table (with seed among its keys) per keys + label, keys without seed: each ratio's mean and std
    over the seeds, and the other figures of the sums over them (`OVER_SEEDS`)."""
    out = summary.groupby([*keys, "label"], sort=False).agg(
        throughput_mean=("throughput_ratio", "mean"), throughput_std=("throughput_ratio", "std"),
        forward_mean=("forward_ratio", "mean"), forward_std=("forward_ratio", "std"),
        lossless=("lossless", "mean"), lossy=("lossy", "max"), token_divergence=("token_divergence", "mean"),
        seeds=("seed", "nunique"), requests=("requests", "sum"), resumed=("resumed", "sum"), tokens=("tokens", "sum"),
        forwards=("forwards", "sum"), steps=("steps", "sum"), seconds=("seconds", "sum"),
        drafter_seconds=("drafter_seconds", "sum"), draft_nodes=("draft_nodes", "sum"), verifies=("verifies", "sum"),
        **({"after_eos_forwards": ("after_eos_forwards", "sum")} if "after_eos_forwards" in summary.columns else {}),
    ).reset_index()
    return _pooled(out)


# -- intervals ------------------------------------------------------------------------------------------------------

REPLICATES = 2000  # bootstrap resamples: the 2.5th and 97.5th percentiles move by well under 1% of a ratio beyond it
INTERVAL = ("forward", "throughput", "to_eos")  # the ratios each cell gets an interval of: (name)_low, (name)_high


def ratio_replicates(samples: pd.DataFrame, keys: list[str], anchor: str | None = None,
                     replicates: int = REPLICATES) -> dict[tuple, dict[str, np.ndarray]]:
    """The bootstrap over items behind every interval the reports show: per (keys without seed) + label, each
    ratio of `INTERVAL` recomputed on `replicates` resamples of the items (a task's documents, with every seed and
    repeat of a document kept together), the method and its reference on the same resample, as `summarize`
    defines the ratios (sums over the requests). Seeded: the same samples give the same intervals.

    Returns {(*key values, label): {"forward": [R], "throughput": [R], "to_eos": [R] (with padding counts)}}."""
    keys = [k for k in keys if k != "seed"]
    padded = _has_padding(samples)
    columns = ["forwards", "seconds", *(["after_eos_forwards"] if padded else [])]
    references = [f"reference_{c}" for c in columns]
    rows = samples.assign(**_references(samples, columns, keys, anchor))[_shown(samples)]
    out: dict[tuple, dict[str, np.ndarray]] = {}
    for key, part in rows.groupby(keys, sort=False) if keys else [((), rows)]:
        key = key if isinstance(key, tuple) else (key,)
        docs = pd.Index(sorted(part["doc_id"].unique()))
        picks = _resamples(len(docs), replicates, key)  # [R, items]: every method's of the group on the same resamples
        for label in part.label.unique():
            mine = part[part.label == label]
            if mine[references].isna().any().any():  # a reference not decoded here (a draft-free row's anchor policy's, say)
                continue
            own_docs = pd.Index(sorted(mine["doc_id"].unique()))
            at, drawn = (docs, picks) if own_docs.equals(docs) else (own_docs, _resamples(len(own_docs), replicates, (*key, label)))
            ref, own = drawn @ _per_item(mine, at, references), drawn @ _per_item(mine, at, columns)  # [R, columns]
            with np.errstate(divide="ignore", invalid="ignore"):
                ratios = {"forward": ref[:, 0] / own[:, 0], "throughput": ref[:, 1] / own[:, 1]}
                if padded:
                    ratios["to_eos"] = (ref[:, 0] - ref[:, 2]) / (own[:, 0] - own[:, 2])
            out[(*key, label)] = ratios
    return out


def _resamples(items: int, replicates: int, key: tuple) -> np.ndarray:
    """[replicates, items]: how often each item is drawn in each bootstrap resample, seeded by the cell's key, so that
    a cell's interval does not depend on which other results are pooled beside it."""
    rng = np.random.default_rng(zlib.crc32("|".join(map(str, key)).encode()))
    return rng.multinomial(items, np.full(items, 1 / items), size=replicates)


def _per_item(rows: pd.DataFrame, docs: pd.Index, columns: list[str]) -> np.ndarray:
    """[items, columns]: the rows' sums per document (over its seeds and repeats), in the order of `docs` (0 where
    the rows have none)."""
    return rows.groupby("doc_id")[columns].sum().reindex(docs, fill_value=0).to_numpy(float)


def intervals(samples: pd.DataFrame, keys: list[str], anchor: str | None = None, level: float = 0.95) -> pd.DataFrame:
    """Per (keys without seed) + label: the `level` percentile interval of each ratio of `INTERVAL` over the items
    (`ratio_replicates`), as columns forward_low, forward_high, throughput_low, ... (to_eos: with padding counts)."""
    keys = [k for k in keys if k != "seed"]
    rows = []
    for key, ratios in ratio_replicates(samples, keys, anchor).items():
        row = dict(zip([*keys, "label"], key, strict=True))
        for name, values in ratios.items():
            row[f"{name}_low"], row[f"{name}_high"] = percentile_interval(values, level)
        rows.append(row)
    return pd.DataFrame(rows)


WANTED_HALF_WIDTH = 0.05  # the comparison's aim: each cell's 95% forward interval within about ±5% of its ratio


def items_needed(cells: pd.DataFrame, items: pd.DataFrame, keys: list[str],
                 half_width: float = WANTED_HALF_WIDTH) -> pd.DataFrame:
    """Per `keys` (the task among them): the widest forward interval of any method there, as a share of its ratio,
    and about how many items would bring it within ±`half_width`: a bootstrap interval narrows as one over the square
    root of the items, so n (w / half_width)^2, never fewer than the n it has.

    cells: keys, label, forward_ratio, forward_low, forward_high (Table 2's numbers); items: keys and items (the
    documents each group decoded). Returns keys, label (the widest cell's method), items, half_width and needed."""
    cells = cells.assign(half_width=(cells.forward_high - cells.forward_low) / 2 / cells.forward_ratio)
    widest = cells.dropna(subset=["half_width"]).sort_values("half_width", kind="stable").groupby(keys).tail(1)
    widest = widest.merge(items[[*keys, "items"]], on=keys)
    wanted = (widest["items"] * (widest.half_width / half_width) ** 2).round(6)  # 160.00000000000003 is 160 items
    widest["needed"] = np.maximum(widest["items"], np.ceil(wanted)).astype(int)
    return widest[[*keys, "label", "items", "half_width", "needed"]].sort_values(keys).reset_index(drop=True)


def percentile_interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The central `level` interval of bootstrap replicates (NaN where no replicate is finite)."""
    finite = values[np.isfinite(values)]
    if not len(finite):
        return float("nan"), float("nan")
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(finite, [tail, 100 - tail])
    return float(low), float(high)


def mean_interval(replicates: dict[tuple, dict[str, np.ndarray]], group: tuple, over: int, ratio: str = "forward",
                  level: float = 0.95) -> tuple[float, float]:
    """The interval of a mean over one key (position `over` in the keys, e.g. the task), for the replicates whose other
    keys and label equal `group` (the same tuple with that position left out): each resample's mean of the ratios."""
    rows = [r[ratio] for key, r in replicates.items() if key[:over] + key[over + 1:] == group and ratio in r]
    if not rows:
        return float("nan"), float("nan")
    return percentile_interval(np.mean(np.stack(rows), axis=0), level)
