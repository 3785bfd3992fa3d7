"""MLflow tracking: one parent run per evaluation, one nested run per method, mirrored into a spool.

`open_tracker(config)` returns the parent run's `Tracker`; `tracker.child("spot@8")` opens a nested run.
With `config=None` it returns a `NullTracker`, whose calls do nothing, so call sites need no `if`.
A run stays open until `end()`; a later step of the same process (lm-eval scores the outputs after
`generate_until` returns) finds it again with `resume(run_id)` and logs the accuracy into the same run.

Every call of an evaluation is also appended to its spool entry (spool.py), with copies of the
artifacts. If the store is unreachable at the start, or a call fails with an outage later, the
tracker warns once and from then on writes to the spool only; `spot-eval sync` (sync.py) recreates
the whole run from it.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar

from mlflow import MlflowClient
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT, MLFLOW_PARENT_RUN_ID

from spot_eval.tracking.spool import Spool
from spot_eval.tracking.store import (
    TrackingUnavailable,
    client_env,
    experiment_id,
    first_use,
    resolve_uri,
    unreachable,
)

T = TypeVar("T")

END_STATUSES = ("FINISHED", "FAILED", "KILLED")

# Errors that say the call itself is wrong: the spool would not help, because replay would fail the same way.
CALLER_ERRORS = frozenset(
    {"INVALID_PARAMETER_VALUE", "BAD_REQUEST", "RESOURCE_ALREADY_EXISTS", "INVALID_STATE"}
)


@dataclass(frozen=True)
class TrackingConfig:
    # None: the embedded store `sqlite:///mlflow.db` in the working directory (artifacts in ./mlruns).
    # MLflow 3's file store (./mlruns as the tracking URI) raises unless MLFLOW_ALLOW_FILE_STORE is set.
    tracking_uri: str | None = None
    experiment: str = "spot-eval"
    run_name: str = "spot-eval"  # the parent run; nested runs are named by `child(name)`
    spool_dir: str = "spot-eval-spool"  # one entry per evaluation, kept only after an outage

    def __post_init__(self) -> None:
        for field in ("experiment", "run_name", "spool_dir"):
            if not getattr(self, field):
                raise ValueError(f"tracking {field} must not be empty")


@dataclass(frozen=True)
class InputDataset:
    """A dataset a run evaluated, as MLflow records a dataset input (the run page's and runs table's "Datasets").

    `source` and `profile` are JSON: `source` as MLflow's DatasetSource of `source_type` writes it (`to_json`),
    `profile` what the UI shows of the data (here: how many documents, of how many, and the limit)."""

    name: str
    digest: str
    source_type: str
    source: str
    profile: str | None = None
    schema: str | None = None
    context: str = "eval"  # MLflow's mlflow.data.context input tag: what the run used the dataset for

    def entity(self) -> DatasetInput:
        dataset = Dataset(self.name, self.digest, self.source_type, self.source, self.schema, self.profile)
        return DatasetInput(dataset, [InputTag(MLFLOW_DATASET_CONTEXT, self.context)])


# MLflow's runs table shows no metric column until someone picks it (its "Columns" menu). A saved view (its "Views"
# menu: an experiment tag `mlflow.sharedViewState.<id>` holding the table's state as JSON) picks them, in order and
# wide enough for each header to read whole (`columnOrder`, `columnWidths`: MLflow 3.15 and later), and `ui_link`
# opens the runs table with it. MLflow 3.10 and later open an experiment on the page of the browser's own GenAI /
# Model training switch (GenAI, its overview, unless switched), whatever the experiment's kind tag
# (store.EXPERIMENT_KIND) says; `workflowType=machine_learning` in the link picks the runs table (3.15 and later).
VIEW_TAG = "mlflow.sharedViewState."
MAX_EXPERIMENT_TAG = 20000  # MLflow's limit on an experiment tag's value
LOCAL_UI = "http://127.0.0.1:5000"  # where `mlflow ui` serves a local store by default
# The runs table's columns left of the picked ones (AG Grid ids): the run's name, when it ran, and its dataset.
LEADING_COLUMNS = ("attributes.`Run Name`", "runDateAndNestInfo", "attributes.`Dataset`")
# A header's width in MLflow's table: its text (13 px semibold, about 7.5 px a character) and the sort icon's room.
HEADER_PX_PER_CHARACTER, HEADER_PADDING_PX = 7.5, 48
# The experiment's description in MLflow's UI (markdown, shown atop every page of the experiment, GenAI's too).
NOTE = "mlflow.note.content"


def header_width(column: str) -> int:
    """The width (px) at which MLflow's runs table shows a metric column's whole header (`metrics.`name``)."""
    return round(len(column.removeprefix("metrics.").strip("`")) * HEADER_PX_PER_CHARACTER + HEADER_PADDING_PX)


def runs_view(name: str, metrics: Sequence[str]) -> tuple[str, str]:
    """A saved view of MLflow's runs table named `name` that shows the Dataset column and the metrics `metrics` (as
    logged: made safe here; the first ones where not all fit in an experiment tag), in that order, each column wide
    enough for its whole header: (its id, the tag's value). The id is a digest of both, so the same view saved again
    replaces itself."""
    columns = ["attributes.`Dataset`", *(f"metrics.`{safe_name(m)}`" for m in dict.fromkeys(metrics))]
    stamp = _now_ms()

    def value(n: int) -> str:
        picked = columns[:n]
        state = json.dumps({"selectedColumns": picked, "columnOrder": [*LEADING_COLUMNS, *picked[1:]],
                            "columnWidths": {c: header_width(c) for c in picked[1:]}})
        return json.dumps({"name": name, "createdAt": stamp, "updatedAt": stamp, "state": state})

    low, high = 1, len(columns)  # the most columns that fit: between low and high
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if len(value(middle)) <= MAX_EXPERIMENT_TAG else (low, middle - 1)
    return hashlib.sha256(json.dumps([name, columns[:low]]).encode()).hexdigest()[:16], value(low)


class Tracker(Protocol):
    """One run. Names of params, metrics and tags pass through `safe_name`."""

    @property
    def run_id(self) -> str | None: ...

    def log_params(self, params: Mapping[str, object]) -> None: ...

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None: ...

    def set_tags(self, tags: Mapping[str, object]) -> None: ...

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None: ...

    def log_inputs(self, datasets: Sequence[InputDataset]) -> None: ...

    def save_view(self, name: str, metrics: Sequence[str]) -> str | None: ...

    def ui_link(self, view: str | None = None) -> str | None: ...

    def ui_path(self, view: str | None = None) -> str | None: ...

    def describe_experiment(self, markdown: str, ours: str) -> None: ...

    def child(self, name: str) -> Tracker: ...

    def end(self, status: str = "FINISHED") -> None: ...

    def __enter__(self) -> Tracker: ...

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None: ...


class _EndsOnExit:
    """`with tracker:` ends the run, FAILED if the block raised."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.end("FINISHED" if exc_type is None else "FAILED")  # type: ignore[attr-defined]


class NullTracker(_EndsOnExit):
    """Tracking is off: every call does nothing."""

    run_id: str | None = None

    def log_params(self, params: Mapping[str, object]) -> None:
        pass

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        pass

    def set_tags(self, tags: Mapping[str, object]) -> None:
        pass

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        pass

    def log_inputs(self, datasets: Sequence[InputDataset]) -> None:
        pass

    def save_view(self, name: str, metrics: Sequence[str]) -> str | None:
        return None

    def ui_link(self, view: str | None = None) -> str | None:
        return None

    def ui_path(self, view: str | None = None) -> str | None:
        return None

    def describe_experiment(self, markdown: str, ours: str) -> None:
        pass

    def child(self, name: str) -> NullTracker:
        return self

    def end(self, status: str = "FINISHED") -> None:
        pass


def safe_name(name: str) -> str:
    """An MLflow-valid key: `gsm8k/exact_match,strict-match` -> `gsm8k/exact_match_strict-match`.

    MLflow allows alphanumerics, `_ - . / space` (and `:` except on Windows, so not here), at most 250
    characters, and no path that normalises to another name (`a//b`, `./a`, `../a`, `/a`)."""
    cleaned = re.sub(r"[^A-Za-z0-9_\-. /]", "_", name)
    parts = [p for p in cleaned.split("/") if p not in ("", ".", "..")]
    return "/".join(parts)[:250] or "_"


@functools.cache  # one git call per process: the tracker's param and the run's identity read the same
def git_commit() -> str:
    """The commit of the spot_eval source tree, or "unknown" outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def _now_ms() -> int:
    return int(time.time() * 1000)


HOST, PID, PID_STARTED = "spot_eval.host", "spot_eval.pid", "spot_eval.pid_started"
ENDED_BY = "spot_eval.ended_by"
COMMIT_TAG = "spot_eval.commit"  # the git_commit param, as a tag: MLflow's runs table shows tags beside the run's identity


def process_tags() -> dict[str, str]:
    """Which process runs the evaluation: what a later run checks to know that it died (`end_orphans`)."""
    return {HOST: socket.gethostname(), PID: str(os.getpid()), PID_STARTED: _started(os.getpid()) or ""}


def _started(pid: int) -> str | None:
    """A process's start time in clock ticks since boot (/proc/<pid>/stat field 22), which tells a reused pid from
    the process that had it; None where there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(tags: dict[str, str]) -> bool:
    """Whether the process named by a run's process tags still runs (on another host: assumed so)."""
    if tags.get(HOST) != socket.gethostname() or not tags.get(PID, "").isdigit():
        return True
    return _started(int(tags[PID])) == tags.get(PID_STARTED)


def end_orphans(client: MlflowClient, experiment_id: str, run_name: str, spool_dir: Path) -> list[str]:
    """End, as FAILED with a tag saying why, the runs named `run_name` that are still RUNNING although the process
    that opened them on this host is gone (SIGKILL, power loss), with their nested runs; and clear the spool
    journals such processes left: one that logged live (no outage) duplicates the store and is removed, one
    that spooled waits for `spot-eval sync`. Returns one line per thing done or left."""
    lines, dead = [], []
    query = f"attributes.status = 'RUNNING' and tags.mlflow.runName = '{run_name}' and tags.`{HOST}` = '{socket.gethostname()}'"
    for run in client.search_runs([experiment_id], query, max_results=1000):
        if not _alive(run.data.tags):
            dead.append(run.info.run_id)
    for entry in sorted(p for p in spool_dir.iterdir() if p.is_dir()) if spool_dir.is_dir() else []:
        with Spool.claim(entry) as free:
            if not free:
                continue  # an evaluation is writing it
            records = Spool.read(entry)
            if any(r["op"] == "outage" for r in records):
                lines.append(f"spot-eval: the spool entry {entry} of an evaluation that ended during a tracking outage "
                             f"waits to be synced: run `spot-eval sync --spool {spool_dir}`")
                continue
            dead += [r["server_id"] for r in records if r["op"] == "start" and r["parent"] is None and r["server_id"]]
            shutil.rmtree(entry)
            lines.append(f"spot-eval: removed the spool entry {entry} of an evaluation whose process died; it had "
                         "logged to the tracking store live")
    for run_id in dict.fromkeys(dead):
        lines += end_dead_run(client, experiment_id, run_id)
    return lines


def end_dead_run(client: MlflowClient, experiment_id: str, run_id: str) -> list[str]:
    """End a RUNNING run whose process is gone, and its RUNNING nested runs, as FAILED with a tag saying why."""
    why = "its process ended without ending the run (killed, or the machine went down); ended by a later run"
    if client.get_run(run_id).info.status != "RUNNING":
        return []
    children = client.search_runs([experiment_id], f"tags.mlflow.parentRunId = '{run_id}' and attributes.status = 'RUNNING'")
    for run in [*children, client.get_run(run_id)]:
        client.set_tag(run.info.run_id, ENDED_BY, why)
        client.set_terminated(run.info.run_id, "FAILED")
    return [f"spot-eval: MLflow run {run_id} was still RUNNING but {why.split(';')[0]}: marked FAILED"]


class _Session:
    """What the parent run and its nested runs share: the client (None once spooling) and the spool."""

    def __init__(self, uri: str, spool: Spool) -> None:
        self.uri = uri
        self.spool = spool
        self.client: MlflowClient | None = None
        self.experiment_id = ""
        self.runs = 0

    def connect(self, experiment: str) -> None:
        try:
            # A server found out at the start (announce_unreachable) is not probed again: the run spools, as said.
            if reason := _ANNOUNCED.get(self.uri) or unreachable(self.uri):
                raise TrackingUnavailable(reason)
            with client_env(), first_use(self.uri):
                client = MlflowClient(self.uri)
                self.experiment_id = experiment_id(client, experiment)
            self.client = client
        except (MlflowException, OSError) as err:
            self.fall_back(err)

    def send(self, call: Callable[[MlflowClient], T]) -> T | None:
        """Run `call` against the store; on an outage switch to the spool for good and return None."""
        if self.client is None:
            return None
        try:
            with client_env():
                return call(self.client)
        except (MlflowException, OSError) as err:
            if isinstance(err, MlflowException) and err.error_code in CALLER_ERRORS:
                raise
            self.fall_back(err)
            return None

    def fall_back(self, err: Exception) -> None:
        self.client = None
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        self.spool.append({"op": "outage", "time": _now_ms(), "error": reason})
        if self.uri in _ANNOUNCED:  # said at the start (announce_unreachable)
            return
        warnings.warn(
            f"MLflow tracking store {self.uri} is unreachable ({reason}); logging to the spool "
            f"{self.spool.path} instead: run `spot-eval sync --spool {self.spool.path.parent}` once it is back",
            RuntimeWarning,
            stacklevel=2,
        )


# Runs opened in this process and not yet ended, by run_id: what `resume` finds.
_OPEN: dict[str, MlflowTracker] = {}


class MlflowTracker(_EndsOnExit):
    """One MLflow run, mirrored into the spool. Made by `open_tracker` and `child`."""

    def __init__(self, session: _Session, name: str, parent: MlflowTracker | None) -> None:
        self._session = session
        self._key = f"r{session.runs}"  # the run's name inside the journal
        session.runs += 1
        self._parent = parent
        self._children: list[MlflowTracker] = []
        self._params: dict[str, str] = {}
        self._ended = False
        start = _now_ms()
        tags = (
            {} if parent is None or parent._server_id is None else {MLFLOW_PARENT_RUN_ID: parent._server_id}
        )
        run = session.send(
            lambda c: c.create_run(session.experiment_id, start_time=start, tags=tags, run_name=name)
        )
        self._server_id = None if run is None else run.info.run_id
        parent_key = None if parent is None else parent._key
        session.spool.append(
            {
                "op": "start",
                "run": self._key,
                "parent": parent_key,
                "name": name,
                "time": start,
                "server_id": self._server_id,
            }
        )
        # Without a server id (spooling from the start) the id names the journal entry and run.
        self.run_id: str = self._server_id or f"spool:{session.spool.path.name}/{self._key}"
        self.uri = session.uri
        _OPEN[self.run_id] = self

    def log_params(self, params: Mapping[str, object]) -> None:
        clean = {safe_name(k): str(v) for k, v in params.items()}
        for key, value in clean.items():
            # MLflow params are immutable; checking here makes spooled runs fail the same way as live ones.
            if self._params.get(key, value) != value:
                raise ValueError(
                    f"param {key!r} is already {self._params[key]!r}; it cannot become {value!r}"
                )
        self._log("params", params=[Param(k, v) for k, v in clean.items()], record={"params": clean})
        self._params.update(clean)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        clean = {safe_name(k): float(v) for k, v in metrics.items()}
        stamp, step = _now_ms(), step or 0
        entities = [Metric(k, v, stamp, step) for k, v in clean.items()]
        self._log("metrics", metrics=entities, record={"metrics": clean, "step": step, "time": stamp})

    def set_tags(self, tags: Mapping[str, object]) -> None:
        clean = {safe_name(k): str(v) for k, v in tags.items()}
        self._log("tags", tags=[RunTag(k, v) for k, v in clean.items()], record={"tags": clean})

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self._check_open()
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"artifact {path} does not exist")
        copy = self._session.spool.copy_artifact(path)  # copied before sending: the caller may delete it
        self._session.send(lambda c: c.log_artifact(self._server_id, str(path), artifact_path))
        self._session.spool.append(
            {"op": "artifact", "run": self._key, "file": copy, "artifact_path": artifact_path}
        )

    def log_inputs(self, datasets: Sequence[InputDataset]) -> None:
        self._check_open()
        if not datasets:
            return
        entities = [d.entity() for d in datasets]
        self._session.send(lambda c: c.log_inputs(self._server_id, datasets=entities))
        self._session.spool.append({"op": "inputs", "run": self._key, "datasets": [asdict(d) for d in datasets]})

    def save_view(self, name: str, metrics: Sequence[str]) -> str | None:
        """Save a view of the experiment's runs table that shows `metrics` as columns (see `runs_view`); its id."""
        self._check_open()
        view, value = runs_view(name, metrics)
        tags = {VIEW_TAG + view: value}
        session = self._session
        session.send(lambda c: [c.set_experiment_tag(session.experiment_id, k, v) for k, v in tags.items()])
        session.spool.append({"op": "experiment_tags", "run": self._key, "tags": tags})
        return view

    def ui_link(self, view: str | None = None) -> str | None:
        """The link that opens the experiment's runs table in MLflow's UI (with the saved view `view`): on the
        tracking server, or for a local store where `mlflow ui` serves it by default. None while spooling."""
        path = self.ui_path(view)
        if path is None:
            return None
        if self.uri.startswith(("http://", "https://")):
            base = self.uri.rstrip("/")
        elif self.uri.startswith(("sqlite:", "file:", "/")):
            base = LOCAL_UI
        else:
            return None
        return f"{base}/{path}"

    def ui_path(self, view: str | None = None) -> str | None:
        """The runs table's place in MLflow's UI (with the saved view `view`), relative to the UI's own address: what
        a link in a description names, which works wherever the UI is served. None while spooling."""
        session = self._session
        if session.client is None or not session.experiment_id:
            return None
        query = "workflowType=machine_learning" + (f"&viewStateShareKey={view}" if view else "")
        return f"#/experiments/{session.experiment_id}/runs?{query}"

    def describe_experiment(self, markdown: str, ours: str) -> None:
        """Set the experiment's description (MLflow shows it atop each of the experiment's pages) to `markdown`,
        unless it has one that does not start with `ours` (someone's own, which stays)."""
        self._check_open()
        session = self._session
        found = session.send(lambda c: c.get_experiment(session.experiment_id).tags.get(NOTE))
        if session.client is None or (found and not found.startswith(ours)):
            return
        session.send(lambda c: c.set_experiment_tag(session.experiment_id, NOTE, markdown))
        session.spool.append({"op": "experiment_tags", "run": self._key, "tags": {NOTE: markdown}})

    def child(self, name: str) -> MlflowTracker:
        self._check_open()
        child = MlflowTracker(self._session, name, parent=self)
        self._children.append(child)
        return child

    def end(self, status: str = "FINISHED") -> None:
        if status not in END_STATUSES:
            raise ValueError(f"run status must be one of {', '.join(END_STATUSES)}; got {status!r}")
        if self._ended:
            return
        for child in self._children:
            child.end(status)
        self._ended = True
        stamp = _now_ms()
        self._session.send(lambda c: c.set_terminated(self._server_id, status, end_time=stamp))
        self._session.spool.append({"op": "end", "run": self._key, "status": status, "time": stamp})
        _OPEN.pop(self.run_id, None)
        if self._parent is None:
            self._session.spool.close(delete=self._session.client is not None)

    def _check_open(self) -> None:
        if self._ended:
            raise ValueError(f"run {self.run_id} has ended")

    def _log(self, op: str, record: Mapping[str, object], **batch: list[Any]) -> None:
        self._check_open()
        self._session.send(lambda c: c.log_batch(self._server_id, **batch))
        self._session.spool.append({"op": op, "run": self._key, **record})


# Tracking URIs whose outage was said before the run started, and why: the spool then takes over without a second
# probe or warning.
_ANNOUNCED: dict[str, str] = {}


def announce_unreachable(config: TrackingConfig) -> None:
    """Say in one line, before anything loads, that an HTTP tracking server does not answer, that the run goes to the
    spool, and the command that logs it later; the run then spools without saying it again."""
    uri = resolve_uri(config.tracking_uri)
    reason = unreachable(uri)
    if reason is None:
        _ANNOUNCED.pop(uri, None)  # back since an earlier evaluation in this process said otherwise
        return
    _ANNOUNCED[uri] = reason
    spool = Path(config.spool_dir).absolute()
    warnings.warn(f"no MLflow server answers at {uri} ({reason}): this run is kept in the spool {spool} instead; once "
                  f"the server is back, log it with: spot-eval sync --spool {spool}", RuntimeWarning, stacklevel=2)


def open_tracker(config: TrackingConfig | None) -> Tracker:
    """The parent run of one evaluation (a `NullTracker` when `config` is None).

    Logs the param `git_commit` (and the same as the tag `spot_eval.commit`). Never raises on an unreachable store: it warns and spools instead."""
    if config is None:
        return NullTracker()
    uri = resolve_uri(config.tracking_uri)
    entry = Path(config.spool_dir).absolute() / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
    session = _Session(
        uri, Spool(entry, {"tracking_uri": uri, "experiment": config.experiment, "time": _now_ms()})
    )
    session.connect(config.experiment)
    if session.client is not None:
        try:
            with client_env():
                for line in end_orphans(session.client, session.experiment_id, config.run_name, Path(config.spool_dir)):
                    warnings.warn(line, RuntimeWarning, stacklevel=2)
        except (MlflowException, OSError) as err:  # housekeeping: never a reason to lose this evaluation
            warnings.warn(f"spot-eval: could not check for runs left RUNNING by dead processes ({err})", RuntimeWarning,
                          stacklevel=2)
    _watch_the_end()
    tracker = MlflowTracker(session, config.run_name, parent=None)
    commit = git_commit()
    tracker.set_tags({**process_tags(), COMMIT_TAG: commit})
    tracker.log_params({"git_commit": commit})
    return tracker


def resume(run_id: str | None) -> Tracker:
    """The run `run_id` opened earlier in this process and not yet ended (None: a `NullTracker`)."""
    if run_id is None:
        return NullTracker()
    if run_id not in _OPEN:
        raise KeyError(f"no open run {run_id!r} in this process (it has ended, or was never opened here)")
    return _OPEN[run_id]


# How a run that the process leaves open ends (`_end_abandoned_runs`): FAILED, unless a signal or Ctrl-C
# ended the process (KILLED). A SIGKILL runs nothing: the next run finds such a run (`end_orphans`).
_abandoned = {"status": "FAILED"}


@atexit.register
def _end_abandoned_runs() -> None:
    """A run still open at exit was never ended by its evaluation: close it with the truth (an exception:
    FAILED; SIGINT or SIGTERM: KILLED), so the store does not show it RUNNING forever and a spooled one is
    marked ended in its journal."""
    for tracker in [t for t in _OPEN.values() if t._parent is None]:
        tracker.end(_abandoned["status"])


def _watch_the_end() -> None:
    """Once per process, when it opens its first run: Ctrl-C (KeyboardInterrupt) and SIGTERM end the open runs
    as KILLED, an uncaught exception as FAILED. SIGTERM, whose default would end the process without running
    exit handlers, becomes an exit with status 143 (128 + 15) where no other handler is installed."""
    if getattr(sys.excepthook, "_spot_tracking", False):
        return
    previous = sys.excepthook

    def hook(kind, error, tb) -> None:
        _abandoned["status"] = "KILLED" if issubclass(kind, KeyboardInterrupt) else "FAILED"
        previous(kind, error, tb)

    hook._spot_tracking = True
    sys.excepthook = hook
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:

        def terminated(signum, frame) -> None:
            _abandoned["status"] = "KILLED"
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, terminated)
