"""`spot-eval nightly`: run a suite through lm-eval, compare it with a baseline, report, and gate.

1. Run: every (temperature, seed) of the suite is one real `lm_eval --model spot` run over the
   suite's tasks, logged to the suite's MLflow experiment, into `<report>/runs/T<t>-seed<s>/`.
   A rerun of the same day resumes: finished runs are kept.
2. Compare: with the pinned baseline bundle (`--baseline FILE`, e.g. under results/) or else the
   previous nightly of the same suite in the experiment that passed (its `nightly/nightly.json`
   artifact); suites sharing an experiment never become each other's baseline.
   spot_eval/reports/regression.py says what a regression is.
3. Report: `results/nightly/<date>/report.md` and a self-contained `report.html` (tables, bars
   against the baseline, accepted-length histograms, trend lines over the last nightlies), plus
   `nightly.json`, the bundle the next nightly compares with. All of it is logged to a nightly
   summary run in the same experiment (tag spot_eval.kind=nightly).
4. Gate: a one-paragraph verdict comes first; exit 1 on a regression unless --dry-run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import warnings
from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd

from spot_eval.reports import plots
from spot_eval.reports.compare import accuracy_table, compare, figures, means, rivals, section_title
from spot_eval.reports.compare import findings as found_in
from spot_eval.reports.history import (
    BUNDLE_ARTIFACT,
    KIND_TAG,
    REGRESSION_TAG,
    SUITE_TAG,
    HistoryError,
    nightly_bundle,
    nightly_runs,
)
from spot_eval.reports.regression import (
    Finding,
    Tolerances,
    accuracy_changes,
    divergence_table,
    find_regressions,
    gates,
    lossy_accuracy,
    method_table,
)
from spot_eval.reports.report import Report, Section, figure_title, header, write
from spot_eval.reports.results import Bundle, ResultsError, check_settings, combine, read_bundle, read_run
from spot_eval.tracking.writer import TrackingConfig, open_tracker, safe_name

DEFAULT_SUITE = Path(__file__).resolve().parent / "suites" / "nightly.toml"


class NightlyError(RuntimeError):
    """The nightly could not produce a result (bad suite, failed evaluation); the message says why."""


@dataclass(frozen=True)
class Suite:
    name: str
    experiment: str
    tasks: tuple[str, ...]
    include_path: str
    limit: int | dict[str, int]  # documents per task: one count for every task, or {task: count}
    methods: str
    temperatures: tuple[float, ...]
    seeds: tuple[int, ...]
    gen_length: int
    model_args: str = ""
    num_processes: int = 1  # > 1: each lm_eval runs under `accelerate launch` on this many processes
    batch_size: int = 1  # requests each lm_eval decodes at once (--batch_size; docs/guides/batching.md)
    # The first document of each task (one index, or {task: index}): a suite that extends an earlier one to more
    # items decodes only the new ones, and `spot-eval compare` pools both (results/comparison/).
    start: int | dict[str, int] = 0
    trend_window: int = 14
    tolerances: Tolerances = Tolerances()

    def __post_init__(self) -> None:
        if not self.tasks or not self.temperatures or not self.seeds:
            raise NightlyError("a suite needs at least one task, temperature and seed")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.name):
            raise NightlyError(f"suite name {self.name!r}: use letters, digits, '_', '.' and '-' (it tags the MLflow runs)")
        for key in ("limit", "start"):
            value = getattr(self, key)
            if isinstance(value, dict) and set(value) != set(self.tasks):
                raise NightlyError(
                    f"{key} names tasks {sorted(value)} but the suite runs {sorted(self.tasks)}: give every task of "
                    f"the suite a {key} (or one number for all)"
                )
        counts = [self.count(task) for task in self.tasks]
        if min(*counts, self.gen_length, self.trend_window, self.num_processes, self.batch_size) < 1:
            raise NightlyError(
                f"limit, gen_length, trend_window, num_processes and batch_size must be >= 1 (got {self.limit}, "
                f"{self.gen_length}, {self.trend_window}, {self.num_processes}, {self.batch_size})"
            )
        if min(self.first(task) for task in self.tasks) < 0:
            raise NightlyError(f"start must be >= 0 (got {self.start}): it is the index of a task's first document")

    def count(self, task: str) -> int:
        return self.limit[task] if isinstance(self.limit, dict) else self.limit

    def first(self, task: str) -> int:
        return self.start[task] if isinstance(self.start, dict) else self.start

    def documents(self) -> list[str]:
        """lm_eval's arguments that pick the documents: `--limit N` where every task starts at its first document and
        takes as many, else `--samples` with each task's indices."""
        if not isinstance(self.limit, dict) and not self.start:
            return ["--limit", str(self.limit)]
        chosen = {task: list(range(self.first(task), self.first(task) + self.count(task))) for task in self.tasks}
        return ["--samples", json.dumps(chosen, separators=(",", ":"))]


def load_suite(path: str | Path | None) -> Suite:
    path = Path(path) if path else DEFAULT_SUITE
    if not path.is_file():
        raise NightlyError(f"suite file {path} does not exist; pass --suite FILE (default: {DEFAULT_SUITE})")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise NightlyError(f"suite file {path} is not valid TOML: {err}") from None
    known = {f.name for f in fields(Suite)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise NightlyError(f"suite file {path}: unknown keys {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    try:
        tolerances = Tolerances(**data.pop("tolerances", {}))
        for key in ("tasks", "temperatures", "seeds"):
            if key in data:
                data[key] = tuple(data[key]) if isinstance(data[key], list) else (data[key],)
        return Suite(**data, tolerances=tolerances)
    except (TypeError, ValueError) as err:
        raise NightlyError(f"suite file {path}: {err}") from None


# -- 1. run ----------------------------------------------------------------------------------------------


def lm_eval_executable(suite: Suite) -> list[str]:
    """The lm_eval command: the console script, or `accelerate launch --multi_gpu ... -m lm_eval` on several
    processes (one per GPU; on a machine without GPUs they talk over gloo: accelerate's --cpu would start
    only one)."""
    script = "lm_eval" if suite.num_processes == 1 else "accelerate"
    beside = Path(sys.executable).parent / script
    found = str(beside) if beside.exists() else shutil.which(script)
    if not found:
        raise NightlyError(f"the {script} command is not installed; install the project (pip install .)")
    if suite.num_processes == 1:
        return [found]
    return [found, "launch", "--multi_gpu", "--num_processes", str(suite.num_processes), "-m", "lm_eval"]


def lm_eval_command(suite: Suite, temperature: float, seed: int, run_dir: Path, tracking_uri: str | None) -> list[str]:
    args = {
        "methods": suite.methods, "temperature": temperature, "seed": seed, "gen_length": suite.gen_length,
        "fail_on_divergence": "false",  # the nightly gates on divergences itself, after reporting them
        "mlflow_experiment": suite.experiment, "output_dir": str(run_dir),
    }
    if tracking_uri:
        args["mlflow_tracking_uri"] = tracking_uri
    model_args = ",".join(f"{k}={v}" for k, v in args.items())
    if suite.model_args:
        model_args += "," + suite.model_args
    return [
        *lm_eval_executable(suite), "--model", "spot", "--model_args", model_args, "--tasks", ",".join(suite.tasks),
        "--include_path", suite.include_path, "--apply_chat_template", "--confirm_run_unsafe_code",
        *suite.documents(), "--log_samples", "--output_path", str(run_dir / "lm_eval"),
        # A task's max_gen_toks wins over the model's gen_length (lm-eval's rule): the suite's length caps every task.
        "--gen_kwargs", f"max_gen_toks={suite.gen_length}", "--batch_size", str(suite.batch_size),
        # every decoded request kept as it finishes: an interrupted run resumes where it stopped (spot_eval.harness.lm)
        "--use_cache", str(run_dir / "cache" / "lm_eval"),
    ]


def run_suite(suite: Suite, report_dir: Path, tracking_uri: str | None, log=print) -> list[Path]:
    if not Path(suite.include_path).is_dir():
        raise NightlyError(f"task directory {suite.include_path} not found; run from the repository root or set include_path")
    runs = []
    for temperature in suite.temperatures:
        for seed in suite.seeds:
            run_dir = report_dir / "runs" / f"T{temperature:g}-seed{seed}"
            runs.append(run_dir)
            if (run_dir / "outcomes.jsonl").is_file():
                log(f"nightly: {run_dir.name} already finished, kept")
                continue
            command = lm_eval_command(suite, temperature, seed, run_dir, tracking_uri)
            log(f"nightly: {run_dir.name}: {' '.join(command)}")
            started = time.perf_counter()
            (run_dir / "cache").mkdir(parents=True, exist_ok=True)
            returncode, output = _run_shown(command, run_dir / "lm_eval.log")
            if returncode != 0 or not (run_dir / "outcomes.jsonl").is_file():
                tail = "\n".join(output.strip().splitlines()[-8:])
                raise NightlyError(f"lm_eval failed for {run_dir.name} (exit {returncode}); log in {run_dir / 'lm_eval.log'}:\n{tail}")
            log(f"nightly: {run_dir.name} done in {time.perf_counter() - started:.0f} s")
    return runs


def _run_shown(command: list[str], log_file: Path) -> tuple[int, str]:
    """Run `command`, its output into `log_file` as it comes and its progress bar (lm_eval's `spot` bar, on stderr)
    onto this process's stderr as well, so a run of hours shows where it is. Returns its exit status and output."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    with log_file.open("wb") as log, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env) as run:
        while chunk := run.stdout.read1(1 << 16):
            log.write(chunk)
            log.flush()
            if b"spot" in chunk and b"req" in chunk:  # the bar's redraws (tqdm writes "\r" lines), not lm-eval's log
                sys.stderr.buffer.write(chunk[chunk.rfind(b"\r"):] if b"\r" in chunk else chunk)
                sys.stderr.flush()
        returncode = run.wait()
    return returncode, log_file.read_text(errors="replace")


# -- 2. baseline -----------------------------------------------------------------------------------------


def find_baseline(
    pinned: str | Path | None, tracking_uri: str | None, experiment: str, suite: str, log=print
) -> tuple[Bundle | None, str]:
    """(bundle, description); a pinned file wins, else the newest passing nightly of the suite in the experiment."""
    if pinned:
        try:
            return read_bundle(pinned), f"pinned baseline {pinned}"
        except ResultsError as err:
            raise NightlyError(str(err)) from None
    try:
        for run in nightly_runs(tracking_uri, experiment, suite=suite):
            if run.status == "FINISHED" and not run.regression:
                return nightly_bundle(tracking_uri, run.run_id), f"nightly run {run.run_id} of {_date(run.start_time)}"
    except HistoryError as err:
        log(f"nightly: warning: no baseline from MLflow: {err}")
        return None, f"none ({err})"
    return None, f"none (no earlier passing nightly of suite {suite!r} in experiment {experiment!r})"


def _date(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ms / 1000))


# -- 3. report -------------------------------------------------------------------------------------------


def verdict(findings: list[Finding], baseline: str, new: Bundle) -> str:
    n_runs = len(new.runs)
    scope = (f"{len(new.samples.drop_duplicates(['temperature', 'seed', 'task', 'doc_id']))} requests in {n_runs} run(s) "
             f"(target {new.settings.get('target')}, block {new.settings.get('block_length')}, gen {new.settings.get('gen_length')})")
    if not findings:
        return f"**PASS**: no regression in {scope} against the baseline ({baseline})."
    kinds = pd.Series([f.kind for f in findings]).value_counts()
    listed = "; ".join(f"{f.kind} at {f.where}: {f.detail}" for f in findings[:6])
    more = f"; and {len(findings) - 6} more" if len(findings) > 6 else ""
    return (f"**REGRESSION** ({', '.join(f'{n} {k}' for k, n in kinds.items())}) in {scope} against the baseline "
            f"({baseline}): {listed}{more}.")


def build_report(suite: Suite, new: Bundle, base: Bundle | None, baseline: str, findings: list[Finding],
                 table: pd.DataFrame, trend: pd.DataFrame, report_dir: Path, date: str) -> Report:
    """The nightly's page, in the order a reader asks: did it pass (each gate against the previous night), the
    paper's Table 2, the grouped charts, the trend, accuracy and divergences, accepted lengths.
    `table` is `method_table(new, base)`, already computed for the trend and the MLflow metrics."""
    who = new.identity
    sections = [Section("Verdict", f"Against the baseline: {baseline}.",
                        tables=(("each regression gate, tonight against the previous night", gates(table, new, base, findings, suite.tolerances)),))]
    if findings:
        sections.append(Section("Findings", "\n\n".join(f"- **{f.kind}** {f.where}: {f.detail}" for f in findings)))
    if (new.samples.label != "draft_free").any():
        comparisons = compare(new)
        for c in comparisons:
            sections.append(Section(f"Table 2 at T = {c.temperature:g}", c.caption,
                                    tables=tuple((section_title(policy), t) for policy, t in c.sections)))
        numbers = pd.concat([c.numbers for c in comparisons], ignore_index=True)
        found = found_in(numbers, who.get("device") or "this device", rivals(numbers), means(new, numbers))
        sections.insert(1, Section("What the runs found", "\n\n".join(found)))
        throughput, forwards, histogram, frontier = figures(new, numbers, report_dir, date, "")
        sections.append(Section("Speed per task and method", figures=(throughput, forwards, frontier)))
    else:
        histogram = ("steps accepted per target forward", plots.accepted_histogram(
            new.samples, report_dir / "accepted_lengths.png", figure_title("accepted steps per target forward", who, date)))
    if not trend.empty and trend.time.nunique() == 1:  # one point is no trend
        sections.append(Section("Trend", "The trend starts with the suite's second nightly in this MLflow experiment."))
    elif not trend.empty:
        sections.append(Section(f"Trend over the last {trend.time.nunique()} nightlies",
                                "Each method's ratios, mean over tasks and temperatures, night by night: a drift shows here before it crosses a gate.",
                                figures=(("throughput and forward ratios per nightly", plots.trend(
                                    trend, report_dir / "trend.png", figure_title(f"suite {suite.name}: the last nightlies", who, date))),)))
    sections += _accuracy_sections(new, base, suite)
    sections.append(Section("Accepted steps per forward", figures=(histogram,)))
    lead = verdict(findings, baseline, new)
    # --date names the report's folder; the header always shows the day it ran (a folder may be named for its suite)
    day = date if re.fullmatch(r"\d{4}-\d{2}-\d{2}", date) else (new.created or time.strftime("%Y-%m-%d"))[:10]
    named = {} if day == date else {"report": date}
    return Report(f"spot-eval nightly {day}: suite {suite.name}", lead, sections, header(who, date=day, suite=suite.name, **named))


def _accuracy_sections(new: Bundle, base: Bundle | None, suite: Suite) -> list[Section]:
    out = []
    accuracy = accuracy_table(new)
    if not accuracy.empty:
        out.append(Section("Accuracy", "lm-eval's scores (accuracy metrics only) of the draft-free text, which every lossless method reproduces.",
                           tables=(("per task and metric, mean over seeds", accuracy),)))
    _, paired = accuracy_changes(new, base, suite.tolerances.accuracy_p) if base is not None else (None, pd.DataFrame())
    if not paired.empty:
        out.append(Section("Accuracy against the baseline (paired per sample)",
                           tables=(("lost / gained: samples right in the baseline and wrong now, and the reverse", paired),)))
    lossy = lossy_accuracy(new.outcomes)
    if not lossy.empty:
        out.append(Section("Lossy methods against draft-free (paired per sample)",
                           "A lossy method (max-commit, opt-in) differs from draft-free by design: its divergence rate is "
                           "1 - lossless above, and a drop in its own outputs' accuracy beyond noise is a finding.",
                           tables=(("accuracy of each lossy method's outputs and of draft-free's on the same samples", lossy),)))
    diverged = divergence_table(new)
    if not diverged.empty:
        out.append(Section("Divergences", "Each request whose tokens differ from draft-free, with the decision that flipped "
                                          "and its margin: a margin near 0 is a numerics tie, a large one a bug.",
                           tables=(("first divergent token per request", diverged),)))
    return out


def trend_series(
    tracking_uri: str | None, experiment: str, suite: str, window: int, current: pd.DataFrame, log=print
) -> pd.DataFrame:
    """Per nightly and method, mean throughput and forward ratios: the suite's past nightlies from MLflow plus this one."""
    rows = []
    try:
        past = nightly_runs(tracking_uri, experiment, limit=window - 1, suite=suite)
    except HistoryError as err:
        log(f"nightly: warning: no trend from MLflow: {err}")
        past = []
    labels = {safe_name(label): label for label in current.label.unique()}  # MLflow's keys spell spot@8 as spot_8
    for run in past:
        for key, value in run.metrics.items():
            for column in ("throughput_ratio", "forward_ratio"):
                if key.startswith(f"{column}/mean/"):
                    name = key.split("/", 2)[2]
                    rows.append({"time": pd.Timestamp(run.start_time, unit="ms"), "label": labels.get(name, name), column: value})
    now = pd.Timestamp.now()
    for label, g in current[current.label != "draft_free"].groupby("label"):
        rows.append({"time": now, "label": label, "throughput_ratio": g.throughput_ratio.mean(), "forward_ratio": g.forward_ratio.mean()})
    if not rows:
        return pd.DataFrame()
    return pd.DataFrame(rows).groupby(["time", "label"], as_index=False).first()


# -- 4. the command --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NightlyResult:
    findings: list[Finding]
    summary: str
    report_dir: Path
    exit_code: int


def nightly(suite: Suite, out_root: str | Path = "results/nightly", tracking_uri: str | None = None,
            baseline: str | Path | None = None, dry_run: bool = False, date: str | None = None,
            log=print) -> NightlyResult:
    date = date or time.strftime("%Y-%m-%d")
    report_dir = Path(out_root) / date
    base, described = find_baseline(baseline, tracking_uri, suite.experiment, suite.name, log)  # a corrupt pin fails before hours of decoding
    runs = run_suite(suite, report_dir, tracking_uri, log)
    try:
        new = combine([read_run(r) for r in runs])
    except ResultsError as err:
        raise NightlyError(str(err)) from None
    if base is not None:
        try:
            check_settings([new.settings, base.settings], ["this nightly", described])
        except ResultsError as err:
            log(f"nightly: warning: baseline not comparable, reporting without it: {err}")
            base, described = None, f"none ({described} has other settings)"
    findings = find_regressions(new, base, suite.tolerances)
    table = method_table(new, base)
    trend = trend_series(tracking_uri, suite.experiment, suite.name, suite.trend_window, table, log)
    report = build_report(suite, new, base, described, findings, table, trend, report_dir, date)
    bundle_path = new.write(report_dir / "nightly.json")
    md, page = write(report, report_dir)
    regressed = bool(findings)
    _log_nightly(suite, tracking_uri, date, table, findings, [bundle_path, md, page, *sorted(report_dir.glob("*.png"))], regressed)
    return NightlyResult(findings, report.lead, report_dir, 1 if regressed and not dry_run else 0)


def _log_nightly(suite: Suite, tracking_uri: str | None, date: str, table: pd.DataFrame, findings: list[Finding],
                 files: list[Path], regressed: bool) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        tracker = open_tracker(TrackingConfig(tracking_uri, suite.experiment, run_name=f"nightly {date}"))
    tracker.set_tags({KIND_TAG: "nightly", REGRESSION_TAG: str(regressed).lower(), SUITE_TAG: suite.name})
    tracker.log_params({"suite": suite.name, "tasks": ",".join(suite.tasks), "limit": str(suite.limit),
                        "start": str(suite.start), "methods": suite.methods,
                        "temperatures": ",".join(f"{t:g}" for t in suite.temperatures),
                        "seeds": ",".join(map(str, suite.seeds)), "gen_length": suite.gen_length})
    metrics = {"regressions": float(len(findings))}
    for _, r in table[table.label != "draft_free"].iterrows():
        for column in ("throughput_ratio", "forward_ratio", "lossless") + (("token_divergence",) if r.get("lossy") else ()):
            metrics[safe_name(f"{column}/T{r.temperature:g}/{r.task}/{r.label}")] = float(r[column])
    for label, g in table[table.label != "draft_free"].groupby("label"):
        metrics[safe_name(f"throughput_ratio/mean/{label}")] = float(g.throughput_ratio.mean())
        metrics[safe_name(f"forward_ratio/mean/{label}")] = float(g.forward_ratio.mean())
    tracker.log_metrics(metrics)
    for path in files:
        tracker.log_artifact(path, str(Path(BUNDLE_ARTIFACT).parent))
    tracker.end("FAILED" if regressed else "FINISHED")
