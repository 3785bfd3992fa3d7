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
import re
import subprocess
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

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


class Tracker(Protocol):
    """One run. Names of params, metrics and tags pass through `safe_name`."""

    @property
    def run_id(self) -> str | None: ...

    def log_params(self, params: Mapping[str, object]) -> None: ...

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None: ...

    def set_tags(self, tags: Mapping[str, object]) -> None: ...

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None: ...

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
            if reason := unreachable(self.uri):
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


def open_tracker(config: TrackingConfig | None) -> Tracker:
    """The parent run of one evaluation (a `NullTracker` when `config` is None).

    Logs the param `git_commit`. Never raises on an unreachable store: it warns and spools instead."""
    if config is None:
        return NullTracker()
    uri = resolve_uri(config.tracking_uri)
    entry = Path(config.spool_dir).absolute() / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
    session = _Session(
        uri, Spool(entry, {"tracking_uri": uri, "experiment": config.experiment, "time": _now_ms()})
    )
    session.connect(config.experiment)
    tracker = MlflowTracker(session, config.run_name, parent=None)
    tracker.log_params({"git_commit": git_commit()})
    return tracker


def resume(run_id: str | None) -> Tracker:
    """The run `run_id` opened earlier in this process and not yet ended (None: a `NullTracker`)."""
    if run_id is None:
        return NullTracker()
    if run_id not in _OPEN:
        raise KeyError(f"no open run {run_id!r} in this process (it has ended, or was never opened here)")
    return _OPEN[run_id]


@atexit.register
def _end_abandoned_runs() -> None:
    """A run still open at exit was never ended by its evaluation: close it as KILLED, so the store does
    not show it RUNNING forever and a spooled one is marked ended in its journal."""
    for tracker in [t for t in _OPEN.values() if t._parent is None]:
        tracker.end("KILLED")
