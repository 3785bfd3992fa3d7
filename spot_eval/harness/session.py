"""One `lm_eval --model spot` run: per-request records in, summary tables and artifacts out.

The model adds a `RequestRecord` per request; after lm-eval has scored the outputs, `finish`
writes the per-sample JSONL and the summary, and reports divergences (nothing is lost: the files
are written before a divergence ends the run with a non-zero exit).

A run directory holds:
    run.json          settings: model_args, decoder config, fingerprints, MLflow run, versions
    samples.jsonl     one row per request and method (tokens, forwards, seconds, divergence)
    summary.csv       per task and method: sums and ratios against draft-free
    outcomes.jsonl    per scored sample and metric, lm-eval's value (with `--log_samples`)
    lm_eval_results.json, throughput_ratio.png, accepted_lengths.png
`spot_eval.reports.results` reads these back (nightly reports, `spot-eval compare`).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from spot_eval.harness.lossless import MethodRecord
from spot_eval.reports.plots import accepted_histogram, throughput_bars
from spot_eval.reports.regression import describe
from spot_eval.reports.results import summarize
from spot_eval.tracking.writer import Tracker, safe_name


@dataclass(frozen=True)
class RequestRecord:
    task: str | None
    doc_id: int | None
    repeat: int
    request: int
    prompt_sha256: str
    text: str
    methods: list[MethodRecord]  # draft_free first

    def rows(self) -> list[dict]:
        """One flat row per method, as written to samples.jsonl."""
        out = []
        for m in self.methods:
            row = {"task": self.task, "doc_id": self.doc_id, "repeat": self.repeat, "request": self.request,
                   "prompt_sha256": self.prompt_sha256, "label": m.label, **asdict(m)}
            row["tokens"] = len(m.token_ids)
            row["lossless"] = m.lossless
            out.append(row)
        return out


def outcomes(samples: dict) -> list[dict]:
    """lm-eval's logged samples ({task: [sample]}) -> one row per (task, doc, filter, metric) with its value."""
    rows = []
    for task, logged in samples.items():
        for sample in logged:
            for metric in sample.get("metrics") or ():
                value = sample.get(metric)
                if isinstance(value, (int, float)):
                    rows.append({"task": task, "doc_id": sample["doc_id"], "filter": sample.get("filter"),
                                 "metric": metric, "value": float(value)})
    return rows


class Session:
    def __init__(
        self, args, fingerprints: dict, tracker: Tracker, out_dir: str | Path | None = None, settings: dict | None = None
    ) -> None:
        self.args = args
        self.fingerprints = fingerprints
        self.tracker = tracker
        self.settings = settings or {}
        self.records: list[RequestRecord] = []
        self.out_dir = Path(out_dir or Path("spot-eval-runs") / time.strftime("%Y%m%d-%H%M%S"))

    def add(self, record: RequestRecord) -> None:
        self.records.append(record)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([row for r in self.records for row in r.rows()])

    def summary(self) -> pd.DataFrame:
        """Per task and method: sums over the same requests, ratios against draft-free."""
        return summarize(self.frame(), ["task"])

    def divergences(self) -> list[dict]:
        return [
            {"task": r.task, "doc_id": r.doc_id, "repeat": r.repeat, "method": m.label, **asdict(m.divergence)}
            for r in self.records for m in r.methods if m.divergence is not None
        ]

    def flush(self) -> Path:
        """Write what is known so far (called after every generate_until batch)."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        run = {**self.settings, "fingerprints": self.fingerprints, "mlflow_run_id": self.tracker.run_id,
               "mlflow_tracking_uri": getattr(self.tracker, "uri", None)}
        (self.out_dir / "run.json").write_text(json.dumps(run, indent=1, default=str) + "\n")
        path = self.out_dir / "samples.jsonl"
        with path.open("w") as f:
            for r in self.records:
                for row in r.rows():
                    f.write(json.dumps(row) + "\n")
        self.summary().to_csv(self.out_dir / "summary.csv", index=False)
        return path

    def finish(self, results: dict | None) -> None:
        """After lm-eval scored the outputs: write and log everything, print the table, then gate."""
        self.flush()
        if results is not None:
            samples = results.get("samples") or {}
            with (self.out_dir / "outcomes.jsonl").open("w") as f:
                for row in outcomes(samples):
                    f.write(json.dumps(row) + "\n")
            kept = {k: v for k, v in results.items() if k != "samples"}  # docs and responses: in samples.jsonl
            (self.out_dir / "lm_eval_results.json").write_text(json.dumps(kept, indent=2, default=str))
        table = self.summary()
        self._log(table, results)
        if not table.empty:
            columns = ["task", "label", "requests", "forward_ratio", "throughput_ratio", "tokens_per_forward", "lossless"]
            print(table[columns].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        print(f"spot-eval: samples and summary in {self.out_dir}")
        uri = getattr(self.tracker, "uri", None)
        if uri and uri.startswith("sqlite:"):
            print(f"spot-eval: MLflow run {self.tracker.run_id}; browse with: mlflow ui --backend-store-uri {uri}")
        elif uri:
            print(f"spot-eval: MLflow run {self.tracker.run_id} at {uri}")
        bad = self.divergences()
        self.tracker.end("FAILED" if bad and self.args.fail_on_divergence else "FINISHED")
        if bad and self.args.fail_on_divergence:
            lines = [f"  {d['task']} doc {d['doc_id']} (repeat {d['repeat']}) {d['method']}: {describe(d)}" for d in bad]
            raise SystemExit("spot-eval: outputs diverged from draft-free decoding:\n" + "\n".join(lines))

    def _log(self, table: pd.DataFrame, results: dict | None) -> None:
        """Accuracy on the parent run; per-method statistics on one nested run per method."""
        tracker = self.tracker
        for task, metrics in ((results or {}).get("results") or {}).items():
            tracker.log_metrics({safe_name(f"{task}/{k}"): v for k, v in metrics.items()
                                 if isinstance(v, (int, float)) and "stderr" not in k})
        if results is not None:
            tracker.log_params({safe_name(f"task_version/{t}"): v for t, v in (results.get("versions") or {}).items()})
        frame = self.frame()
        for label, rows in table.groupby("label", sort=False) if not table.empty else ():
            with tracker.child(label) as run:
                for _, row in rows.iterrows():
                    prefix = f"{row.task}/"
                    run.log_metrics({
                        safe_name(prefix + k): float(row[k]) for k in (
                            "forward_ratio", "throughput_ratio", "tokens_per_forward", "lossless", "accepted_mean",
                            "forwards", "seconds", "drafter_seconds", "tokens", "requests")
                    })
                lengths = [n for a in frame[frame.label == label].accepted_lengths for n in a]
                if lengths:
                    ordered = sorted(lengths)
                    run.log_metrics({"accepted_length/mean": sum(lengths) / len(lengths),
                                     "accepted_length/p50": float(ordered[len(ordered) // 2]),
                                     "accepted_length/p90": float(ordered[int(0.9 * (len(ordered) - 1))])})
        if not table.empty:
            if (table.label != "draft_free").any():
                throughput_bars(table, self.out_dir / "throughput_ratio.png")
            accepted_histogram(frame, self.out_dir / "accepted_lengths.png")
        for path in sorted(self.out_dir.iterdir()):
            tracker.log_artifact(path, "spot-eval")
