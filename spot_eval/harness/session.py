"""One `lm_eval --model spot` run: per-request records in, summary tables and artifacts out.

The model adds a `RequestRecord` per request; after lm-eval has scored the outputs, `finish`
writes the per-sample JSONL and the summary, and reports divergences (nothing is lost: the files
are written before a divergence ends the run with a non-zero exit). A lossy method's divergences
(max-commit, opt-in) end nothing: its divergence rates, and its own outputs' accuracy against
draft-free's (spot_eval.harness.rescore), are reported under a "lossy" label instead.

A run directory holds:
    run.json          settings: model_args, decoder config, fingerprints, MLflow run, versions
    samples.jsonl     one row per request and method (tokens, forwards, seconds, divergence)
    summary.csv       per task and method: sums and ratios against draft-free
    outcomes.jsonl    per scored sample, metric and label: lm-eval's value for the draft-free text (with
                      `--log_samples`), and each lossy method's own text scored the same way
    lm_eval_results.json, throughput_ratio.png, forward_ratio.png, accepted_lengths.png
`spot_eval.reports.results` reads these back (nightly reports, `spot-eval compare`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import tempfile
import time
import traceback
import uuid
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
from mlflow.data.code_dataset_source import CodeDatasetSource
from mlflow.data.huggingface_dataset_source import HuggingFaceDatasetSource

from spot.policy import Margins
from spot_eval.harness.lossless import Divergence, MethodRecord
from spot_eval.harness.parallel import ONE_PROCESS, Ranks
from spot_eval.harness.registration import say_last
from spot_eval.harness.rescore import score_texts
from spot_eval.reports.plots import accepted_histogram, forward_bars, throughput_bars
from spot_eval.reports.regression import describe, lossy_accuracy
from spot_eval.reports.results import RATIOS, summarize
from spot_eval.tracking.writer import InputDataset, Tracker, safe_name


@dataclass(frozen=True)
class RequestRecord:
    task: str | None
    doc_id: int | None
    repeat: int
    request: int
    prompt_sha256: str
    text: str
    methods: list[MethodRecord]  # draft_free first, every method decoded back to back in one process
    resumed: bool = False  # decoded by an earlier process of this evaluation, read back from lm-eval's cache
    batch_size: int = 1  # requests decoded at once (every method, draft-free included, at this size)
    batch_divergence: Divergence | None = None  # draft-free at batch_size against draft-free alone (batch_size > 1)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "resumed": False})

    @classmethod
    def from_json(cls, text: str, resumed: bool = True) -> RequestRecord:
        """A record `to_json` wrote (by an earlier process: `resumed`)."""
        raw = json.loads(text)
        methods = []
        for m in raw.pop("methods"):
            methods.append(MethodRecord(**{**m, "token_ids": tuple(m["token_ids"]),
                                           "accepted_lengths": tuple(m["accepted_lengths"]), "divergence": _divergence(m.pop("divergence"))}))
        batch = _divergence(raw.pop("batch_divergence", None))
        return cls(**{**raw, "methods": methods, "resumed": resumed, "batch_divergence": batch})

    def rows(self) -> list[dict]:
        """One flat row per method, as written to samples.jsonl."""
        out = []
        for m in self.methods:
            row = {"task": self.task, "doc_id": self.doc_id, "repeat": self.repeat, "request": self.request,
                   "prompt_sha256": self.prompt_sha256, "resumed": self.resumed, "batch_size": self.batch_size,
                   "label": m.label, **asdict(m)}
            row["tokens"] = len(m.token_ids)
            row["lossless"] = m.lossless
            row["mean_tree_size"] = m.mean_tree_size
            out.append(row)
        return out


@dataclass(frozen=True)
class MethodFailure:
    """A method stopped during a run: its drafter (or a plugin's build) broke the contract or raised. `defect`: one
    line naming it; `where`: what it was doing; `trace`: the traceback, for the run's failures.log."""

    label: str
    origin: str
    defect: str
    where: str
    trace: str

    @classmethod
    def of(cls, label: str, origin: str, err: BaseException, where: str = "building its drafter") -> MethodFailure:
        return cls(label, origin, str(err), where, "".join(traceback.format_exception(err)))

    def line(self) -> str:
        return f"spot-eval: method {self.label} ({self.origin}) failed while {self.where} and was stopped: {self.defect}"


def _divergence(d: dict | None) -> Divergence | None:
    return None if d is None else Divergence(**{**d, "margins": None if d["margins"] is None else Margins(**d["margins"])})


def outcomes(samples: dict) -> list[dict]:
    """lm-eval's logged samples ({task: [sample]}) -> one row per (task, doc, filter, metric) with its value
    (of the draft-free text, the one lm-eval scores)."""
    rows = []
    for task, logged in samples.items():
        for sample in logged:
            for metric in sample.get("metrics") or ():
                value = sample.get(metric)
                if isinstance(value, (int, float)):
                    rows.append({"task": task, "doc_id": sample["doc_id"], "filter": sample.get("filter"),
                                 "metric": metric, "value": float(value), "label": "draft_free"})
    return rows


# The summary's columns in the words every report uses (spot_eval.reports.results.RATIOS), and why a CPU's differ.
HEADLINE = ("throughput_ratio", "forward_ratio", "tokens_per_forward", "lossless")
LEGEND = " ".join(f"{column}: {meaning}." for column, _, meaning in RATIOS if column in HEADLINE) + (
    " On a CPU a verify of P pieces costs about P forwards, so the throughput ratio lags the forward ratio; on a GPU "
    "small P are nearly free.")


class Session:
    def __init__(
        self,
        args,
        fingerprints: dict,
        tracker: Tracker,
        out_dir: str | Path | None = None,
        settings: dict | None = None,
        ranks: Ranks = ONE_PROCESS,
    ) -> None:
        """Under `accelerate launch` every rank keeps its own requests' records; rank 0 (`ranks.main`)
        gathers them in `finish` and alone writes the run directory and logs to MLflow."""
        self.args = args
        self.fingerprints = fingerprints
        self.tracker = tracker
        self.settings = settings or {}
        self.ranks = ranks
        self.records: list[RequestRecord] = []
        self.out_dir = Path(out_dir or Path("spot-eval-runs") / time.strftime("%Y%m%d-%H%M%S"))
        self.failures: list[MethodFailure] = []  # the methods stopped during the run (their rows leave the summary)
        self.unwritable: str | None = None  # the run directory that could not be written, and why
        self.view: str | None = None  # the saved view of MLflow's runs table that shows the headline figures
        self.memory: dict[str, float] | None = None  # every rank's peak per device, once gathered (finish)

    def device_memory(self) -> dict[str, float]:
        """MiB at the peak on each device the target runs on (run.json's "devices"); every rank's once `finish`
        gathered them (rank<N>/cuda:M under data parallel)."""
        if self.memory is not None:
            return self.memory
        return peak_memory_by_device(self.settings.get("devices") or [], self.settings.get("bytes_on_disk") or 0)

    def _write(self, files: Callable[[Path], object]) -> None:
        """Write into the run directory. If it cannot be written (removed, replaced by a file, full),
        warn and write there no more: from then on into a fallback folder, so nothing decoded is lost;
        `finish` then ends the run with a non-zero exit that names both."""
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            files(self.out_dir)
            return
        except OSError as err:
            if self.unwritable is not None:
                raise
            self.unwritable = f"{self.out_dir} ({err.strerror or err})"
        self.out_dir = _fallback_dir()
        warnings.warn(f"the run directory {self.unwritable} cannot be written; writing the run to {self.out_dir}",
                      RuntimeWarning, stacklevel=3)
        files(self.out_dir)

    def add(self, record: RequestRecord) -> None:
        self.records.append(record)

    def fail(self, failure: MethodFailure) -> None:
        """A method stopped: said now in one line (the traceback in failures.log), and at the end of the run."""
        self.failures.append(failure)
        warnings.warn(failure.line() + f" (its traceback: {self.out_dir / 'failures.log'})", RuntimeWarning, stacklevel=2)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([row for r in self.records for row in r.rows()])

    def summary(self) -> pd.DataFrame:
        """Per task and method: sums over the same requests, ratios against draft-free. A method that failed has no
        row: its ratios would cover the requests before it stopped only (samples.jsonl keeps them)."""
        frame = self.frame()
        stopped = {f.label for f in self.failures}
        return summarize(frame[~frame.label.isin(stopped)] if stopped and not frame.empty else frame, ["task"])

    def lossy_texts(self) -> dict[tuple[str, int, str], list[str]]:
        """Each lossy method's own texts by (task, doc_id, label), in repeat order: what lm-eval did not score."""
        texts: dict[tuple[str, int, str], list[str]] = {}
        for r in sorted(self.records, key=lambda r: r.repeat):
            for m in r.methods:
                if m.lossy:
                    texts.setdefault((r.task, r.doc_id, m.label), []).append(m.text)
        return texts

    def divergences(self) -> list[dict]:
        """The divergences of methods that must be lossless (a lossy method's are its measured rate)."""
        return [
            {"task": r.task, "doc_id": r.doc_id, "repeat": r.repeat, "method": m.label, **asdict(m.divergence)}
            for r in self.records for m in r.methods if m.failed
        ] + [
            {"task": r.task, "doc_id": r.doc_id, "repeat": r.repeat, "method": f"draft_free at batch {r.batch_size} against batch 1",
             **asdict(r.batch_divergence)}
            for r in self.records if r.batch_divergence is not None
        ]

    def flush(self) -> Path:
        """Write what is known so far (called after every generate_until batch; rank 0 only)."""
        if not self.ranks.main:
            return self.out_dir / "samples.jsonl"
        resumed = sum(r.resumed for r in self.records)
        run = {**self.settings, "fingerprints": self.fingerprints, "mlflow_run_id": self.tracker.run_id,
               "mlflow_tracking_uri": getattr(self.tracker, "uri", None),
               # requests read back from lm-eval's cache (--use_cache): decoded and timed by an earlier process
               "requests": len(self.records), "resumed_requests": resumed, "peak_memory_mb": round(peak_memory_mb()),
               "peak_memory_mb_by_device": {k: round(v) for k, v in self.device_memory().items()},
               "failed_methods": {f.label: {"origin": f.origin, "where": f.where, "defect": f.defect} for f in self.failures}}
        rows = [json.dumps(row) + "\n" for r in self.records for row in r.rows()]
        summary = self.summary()

        def files(out: Path) -> None:
            (out / "run.json").write_text(json.dumps(run, indent=1, default=str) + "\n")
            (out / "samples.jsonl").write_text("".join(rows))
            summary.to_csv(out / "summary.csv", index=False)
            if self.failures:
                (out / "failures.log").write_text("".join(f"{f.line()}\n{f.trace}\n" for f in self.failures))

        self._write(files)
        return self.out_dir / "samples.jsonl"

    def finish(self, results: dict | None, tasks: object = None, limit: float | None = None) -> None:
        """After lm-eval scored the outputs: write and log everything, print the table, then gate.

        tasks: the task dict lm-eval evaluated, which scores the lossy methods' own texts (None: unscored).
        limit: lm-eval's --limit (None: every document, or not known), recorded with each task's dataset input.
        Called on every rank: each scores its own requests' lossy texts (its tasks hold their documents),
        then the records reach rank 0 (each request once: lm-eval's padding copies were never recorded),
        which goes on alone."""
        lossy = score_texts(tasks, self.lossy_texts()) if tasks is not None else []
        if self.ranks.world_size > 1:
            parts = self.ranks.gather_object((self.records, lossy, self.failures, self.device_memory()))
            if not self.ranks.main:
                return
            self.memory = {f"rank{rank}/{device}": mib for rank, part in enumerate(parts) for device, mib in part[3].items()}
            self.records = sorted((r for part, *_ in parts for r in part), key=lambda r: (r.task or "", r.doc_id or 0, r.repeat))
            lossy = [row for _, rows, *_ in parts for row in rows]
            # each rank stops a method on its own requests; the first rank's word on it stands
            self.failures = list({f.label: f for _, _, failures, _ in reversed(parts) for f in failures}.values())
        self.flush()
        scored = outcomes((results or {}).get("samples") or {}) + lossy  # lm-eval's per-sample scores: only with --log_samples
        if results is not None:
            kept = {k: v for k, v in results.items() if k != "samples"}  # docs and responses: in samples.jsonl

            def files(out: Path) -> None:
                if scored:
                    (out / "outcomes.jsonl").write_text("".join(json.dumps(row) + "\n" for row in scored))
                (out / "lm_eval_results.json").write_text(json.dumps(kept, indent=2, default=str))

            self._write(files)
        table = self.summary()
        accuracy = lossy_accuracy(pd.DataFrame(scored))
        self._log(table, results, accuracy, limit)
        lines = []
        if not table.empty:
            columns = ["task", "label", "requests", "forward_ratio", "throughput_ratio", "tokens_per_forward", "lossless"]
            lines += [table[columns].to_string(index=False, float_format=lambda x: f"{x:.3f}"), LEGEND,
                      *lossy_lines(table, accuracy), *slow_drafter_lines(table)]
        lines += [f.line() for f in self.failures]
        if self.settings.get("device_map"):  # a spread target: what each of its devices held at the peak
            lines.append("spot-eval: peak memory " + ", ".join(f"{d} {mib:.0f} MiB" for d, mib in self.device_memory().items()))
        lines.append(f"spot-eval: samples and summary in {self.out_dir}")
        uri = getattr(self.tracker, "uri", None)
        link = self.tracker.ui_link(self.view)
        if uri and uri.startswith("sqlite:"):
            lines.append(f"spot-eval: MLflow run {self.tracker.run_id}; browse with: mlflow ui --backend-store-uri {uri}"
                         + (f", then open {link}" if link else ""))
        elif uri:
            lines.append(f"spot-eval: MLflow run {self.tracker.run_id} at {uri}" + (f"; its runs table: {link}" if link else ""))
        say_last(lines)  # under lm-eval's command line: after its results table, as the run's last lines
        bad = self.divergences()
        self.tracker.end("FAILED" if (bad and self.args.fail_on_divergence) or self.failures else "FINISHED")
        failures = []
        if self.unwritable is not None:
            failures.append(f"spot-eval: the run directory {self.unwritable} could not be written; "
                            f"every file of the run is in {self.out_dir} instead")
        if bad and self.args.fail_on_divergence:
            lines = [f"  {d['task']} doc {d['doc_id']} (repeat {d['repeat']}) {d['method']}: {describe(d)}" for d in bad]
            failures.append("spot-eval: outputs diverged from draft-free decoding:\n" + "\n".join(lines))
        if self.failures:
            failures.append(f"spot-eval: {len(self.failures)} method(s) failed and were stopped ("
                            f"{', '.join(f.label for f in self.failures)}); the others finished. Tracebacks: "
                            f"{self.out_dir / 'failures.log'}")
        if failures:
            raise SystemExit("\n".join(failures))

    def _log(self, table: pd.DataFrame, results: dict | None, accuracy: pd.DataFrame, limit: float | None = None) -> None:
        """Accuracy and each task's documents (a dataset input) on the parent run; per-method statistics on one
        nested run per method (a lossy one tagged spot_eval.lossy=true, with its own outputs' accuracy beside
        draft-free's on the same samples)."""
        tracker = self.tracker
        tracker.log_inputs(task_datasets(self.records, results, limit))
        scores = {}  # lm-eval's numbers per task: its metrics ("metric,filter") and others (sample_len)
        for task, metrics in ((results or {}).get("results") or {}).items():
            scores |= {f"{task}/{k}": v for k, v in metrics.items() if isinstance(v, (int, float)) and "stderr" not in k}
        if scores:  # rounded as lm-eval's own table prints them
            tracker.log_metrics({safe_name(k): round(v, 4) for k, v in scores.items()})
        if results is not None:
            tracker.log_params({safe_name(f"task_version/{t}"): v for t, v in (results.get("versions") or {}).items()})
        frame = self.frame()
        tracker.set_tags({PEAK_MEMORY: f"{peak_memory_mb():.0f}"})
        if memory := self.device_memory():
            tracker.log_metrics({safe_name(f"peak_memory_mb/{device}"): round(mib, 1) for device, mib in memory.items()})
        if not table.empty:  # each method's headline figures on the parent too, where MLflow's runs table shows them as columns
            headline = parent_headline(table)
            tracker.log_metrics(headline)
            # MLflow's runs table shows them once picked: a saved view picks the methods' figures and the accuracy
            # (not draft-free's, whose ratios are 1 by definition: it is the reference).
            methods = [k for k in headline if not k.startswith("draft_free/")] or list(headline)
            self.view = tracker.save_view(view_name(table), [*methods, *(k for k in scores if "," in k)])
            path = tracker.ui_path(self.view)
            tracker.set_tags({NOTE: description(table, path)})
            if path is not None:
                tracker.describe_experiment(experiment_description(path), EXPERIMENT_NOTE_START)
        for label, rows in table.groupby("label", sort=False) if not table.empty else ():
            with tracker.child(label) as run:
                for _, row in rows.iterrows():
                    prefix = f"{row.task}/"
                    run.log_metrics({
                        safe_name(prefix + k): float(row[k]) for k in (
                            "forward_ratio", "throughput_ratio", "tokens_per_forward", "lossless", "token_divergence",
                            "accepted_mean", "mean_tree_size", "forwards", "seconds", "drafter_seconds", "tokens", "requests",
                            "resumed", *(k for k in ("after_eos_share", "forward_ratio_to_eos") if k in row.index))
                    })
                if rows.lossy.any():
                    run.set_tags({LOSSY_TAG: "true"})
                    for _, r in (accuracy[accuracy.label == label] if not accuracy.empty else accuracy).iterrows():
                        name = f"{r.task}/{r.metric},{r['filter']}"
                        run.log_metrics({safe_name(name): float(r.accuracy), safe_name(f"{name}/draft_free"): float(r.accuracy_draft_free),
                                         safe_name(f"{name}/mcnemar_p"): float(r.p)})
                lengths = [n for a in frame[frame.label == label].accepted_lengths for n in a]
                if lengths:
                    ordered = sorted(lengths)
                    run.log_metrics({"accepted_length/mean": sum(lengths) / len(lengths),
                                     "accepted_length/p50": float(ordered[len(ordered) // 2]),
                                     "accepted_length/p90": float(ordered[int(0.9 * (len(ordered) - 1))])})
        if not table.empty:
            def plots(out: Path) -> None:
                if (table.label != "draft_free").any():
                    ran = table.assign(temperature=float(self.args.temperature))  # the figures' panel title
                    throughput_bars(ran, out / "throughput_ratio.png")
                    forward_bars(ran, out / "forward_ratio.png")
                accepted_histogram(frame, out / "accepted_lengths.png")

            self._write(plots)
        for path in sorted(self.out_dir.iterdir()):
            tracker.log_artifact(path, "spot-eval")


LOSSY_TAG = "spot_eval.lossy"
NOTE = "mlflow.note.content"  # the run's description in MLflow's UI (markdown)
PEAK_MEMORY = "spot_eval.peak_memory_mb"


def peak_memory_mb() -> float:
    """The process's peak memory: the CUDA allocator's peak where the run used a GPU, else the resident set's."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 2**20
    return resident_peak_mb()


def resident_peak_mb() -> float:
    """The process's peak resident set (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_memory_by_device(devices: list[str], on_disk: int = 0) -> dict[str, float]:
    """MiB at its peak on each device the target used: a GPU's allocator peak, the process's resident set for
    the CPU, and for the disk the `on_disk` bytes of weights read from there (from the checkpoint's own
    safetensors files where it can, so the offload folder may hold none of them)."""
    import torch

    out = {}
    for device in devices:
        if device.startswith("cuda"):
            out[device] = torch.cuda.max_memory_allocated(torch.device(device)) / 2**20
        elif device == "cpu":
            out[device] = resident_peak_mb()
        elif device == "disk":
            out[device] = on_disk / 2**20
    return out


# The parent run's headline columns in MLflow's runs table, per method and task: short names that a header shows whole
# (the reports' "fwd ×" and "tput ×"), rounded as the reports print them. lossless is rounded down, so that only a
# method lossless on every request reads 1. The nested run of each method keeps every figure unrounded.
PARENT_FIGURES = {"forward_ratio": "fwd_x", "throughput_ratio": "tput_x", "lossless": "lossless"}


def lossless_shown(share: float) -> float:
    """A lossless share to 3 decimals, rounded down (0.9996 is 0.999, not 1): 1 only when every request matched."""
    return math.floor(round(share * 1000, 6)) / 1000  # round first: 0.57 * 1000 is 569.99999999999994


def parent_headline(table: pd.DataFrame) -> dict[str, float]:
    """`<method>/<task>/fwd_x`, `tput_x` (2 decimals) and `lossless` (3 decimals, rounded down) per summary row."""
    out = {}
    for _, r in table.iterrows():
        for column, short in PARENT_FIGURES.items():
            value = float(r[column])
            out[safe_name(f"{r.label}/{r.task}/{short}")] = lossless_shown(value) if column == "lossless" else round(value, 2)
    return out


def description(table: pd.DataFrame, path: str | None = None) -> str:
    """The run's summary (MLflow's run description, markdown): task, method, requests and the headline figures as an
    aligned text block (a markdown table's cells run together in MLflow's run page), and a link to the runs table
    with them as columns (`path`, relative to MLflow's UI)."""
    shown = pd.DataFrame({"task": table.task, "method": table.label, "requests": table.requests,
                          "fwd ×": table.forward_ratio.map("{:.2f}".format),
                          "tput ×": table.throughput_ratio.map("{:.2f}".format),
                          "tokens / forward": table.tokens_per_forward.map("{:.2f}".format),
                          "lossless": table.lossless.map(lambda share: f"{lossless_shown(share):.3f}")})
    link = f" [The runs table with these figures as columns]({path})." if path else ""
    return ("spot-eval: draft-free decoding against each method on the same requests (ratios over draft-free)." + link
            + "\n\n```text\n" + shown.to_string(index=False) + "\n```")


EXPERIMENT_NOTE_START = "**spot-eval**"  # how the experiment description spot-eval writes begins (a user's own stays)


def experiment_description(path: str) -> str:
    """The experiment's description (atop each of its pages in MLflow's UI, the GenAI overview's too): the one click
    to the runs table with the latest evaluation's headline columns, and the switch that makes MLflow open it."""
    return (f"{EXPERIMENT_NOTE_START}: **[Open the runs table with the headline columns]({path})** (per method and "
            "task fwd_x, tput_x and lossless, and the accuracy: the latest evaluation's view, also in the Views menu). "
            "MLflow opens an experiment on the page of the GenAI / Model training switch atop its sidebar: Model "
            "training opens the runs table, and the browser remembers it.")


def view_name(table: pd.DataFrame) -> str:
    """The saved view's name in MLflow's "Views" menu: the tasks and the methods it shows."""
    methods = [m for m in dict.fromkeys(table.label) if m != "draft_free"] or ["draft_free"]
    return f"spot-eval: {', '.join(dict.fromkeys(table.task))} | {', '.join(methods)}"[:200]


def task_datasets(records: list[RequestRecord], results: dict | None, limit: float | None) -> list[InputDataset]:
    """One MLflow dataset input per task evaluated: named by the task, with a digest of the documents evaluated
    (their doc ids and the sha256 of the prompts their requests carried: runs with the same digest decoded the
    same requests), the task's source (a hub dataset, or the function that loads its documents) and, as its
    profile, how many documents of how many, and lm-eval's --limit."""
    configs = (results or {}).get("configs") or {}
    counts = (results or {}).get("n-samples") or {}
    by_task: dict[str | None, list[RequestRecord]] = {}
    for r in records:
        by_task.setdefault(r.task, []).append(r)
    out = []
    for task, rows in by_task.items():
        name = task or "requests"
        docs = sorted({(r.doc_id, r.prompt_sha256) for r in rows}, key=lambda d: (d[0] is None, d[0] or 0, d[1]))
        digest = hashlib.sha256(json.dumps(docs).encode()).hexdigest()[:16]
        source = _task_source(name, configs.get(task) or {})
        profile = {"documents": len({d for d, _ in docs}), "requests": len(rows),
                   "of": (counts.get(task) or {}).get("original"), "limit": limit}
        out.append(InputDataset(name, digest, source._get_source_type(), source.to_json(), json.dumps(profile)))
    return out


def _task_source(task: str, config: dict) -> HuggingFaceDatasetSource | CodeDatasetSource:
    """Where a task's documents come from, as lm-eval's task config says: a hub dataset (path, config, split,
    revision), or the `custom_dataset` function that loads them (the spot_* tasks: the vendored test sets)."""
    split = config.get("test_split") or config.get("validation_split")
    if config.get("dataset_path"):
        revision = (config.get("dataset_kwargs") or {}).get("revision")
        return HuggingFaceDatasetSource(config["dataset_path"], config.get("dataset_name"), split=split, revision=revision)
    tags = {"task": task, "split": split}
    loader = config.get("custom_dataset")
    if callable(loader):
        tags["custom_dataset"] = getattr(loader, "__qualname__", str(loader))
    elif isinstance(loader, str):  # lm-eval's results hold the function's source
        found = re.search(r"def (\w+)", loader)
        tags["custom_dataset"] = found.group(1) if found else loader[:200]
    upstream = (config.get("metadata") or {}).get("upstream_task")
    if upstream:
        tags["upstream_task"] = upstream
    return CodeDatasetSource({k: v for k, v in tags.items() if v is not None})


def slow_drafter_lines(table: pd.DataFrame) -> list[str]:
    """A line per method and task whose drafting took longer than the verifies it fed, with drafting's share of the
    method's wall time: its drafter, not the target, bounds its speed."""
    if table.empty or "target_seconds" not in table.columns:
        return []
    lines = []
    for _, r in table[(table.label != "draft_free") & (table.drafter_seconds > table.target_seconds)].iterrows():
        lines.append(f"spot-eval: WARNING {r.label} on {r.task}: drafting took {r.drafter_seconds / max(r.seconds, 1e-12):.0%} "
                     f"of its wall time, longer than the target's verify forwards ({r.target_seconds / max(r.seconds, 1e-12):.0%}); "
                     "its drafter, not the target, bounds its speed")
    return lines


def lossy_lines(table: pd.DataFrame, accuracy: pd.DataFrame) -> list[str]:
    """What the run prints for each lossy method: that it is lossy, how often it differs, and its accuracy."""
    lines = []
    for _, r in table[table.lossy].iterrows() if not table.empty else ():
        differ = round((1 - r.lossless) * r.requests)
        lines.append(f"spot-eval: {r.label} is LOSSY by design (max-commit acceptance, opt-in; not checked for losslessness): "
                     f"on {r.task}, {differ} of {r.requests} requests ({1 - r.lossless:.1%}) and {r.token_divergence:.1%} of "
                     "output positions differ from draft-free")
        for _, a in (accuracy[(accuracy.label == r.label) & (accuracy.task == r.task)] if not accuracy.empty else accuracy).iterrows():
            lines.append(f"  {a.metric} ({a['filter']}): {a.accuracy:.3f} against draft-free's {a.accuracy_draft_free:.3f} on "
                         f"{a.samples} paired samples ({a.lost} lost, {a.gained} gained, McNemar p = {a.p:.3g})")
    return lines


def _fallback_dir() -> Path:
    """Where a run goes when its run directory cannot be written: ./spot-eval-unsaved/<time>-<id>, or a
    fresh temporary folder when the working directory is not writable either."""
    path = Path("spot-eval-unsaved") / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir(parents=True)
        return path.absolute()
    except OSError:
        return Path(tempfile.mkdtemp(prefix="spot-eval-unsaved-"))
