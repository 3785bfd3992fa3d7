"""Reaching an MLflow tracking store: URIs, a quick health check, and quiet, fast-failing client calls.

Writing (writer.py), replaying the spool (sync.py) and reading runs back (spot_eval.reports.history)
all go through these, so an unreachable store is found out the same way everywhere.
"""

from __future__ import annotations

import fcntl
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # mlflow (seconds to import) loads at the first call: a bad URI is refused before it
    from mlflow import MlflowClient

# The environment MLflow reads at every request, set around our calls only. Its retry defaults (7 retries,
# backoff factor 2, 120 s timeout) would stall an evaluation for minutes on a dead server; one quick retry
# is enough, because an outage only diverts to the spool. Its "View run at" lines would mix into stdout.
CLIENT_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}
HEALTH_TIMEOUT_S = 2.0


class TrackingUnavailable(ConnectionError):
    """The tracking store cannot be reached (or failed while `sync` replayed into it)."""


# What MLflow can open: its own schemes, SQLAlchemy's database URLs (dialect[+driver]://), and local paths.
URI_SCHEMES = ("file", "sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks", "databricks-uc")


def check_uri(name: str, uri: str | None) -> None:
    """Refuse a tracking URI that MLflow cannot open before anything runs (None: the default store). Accepted:
    file:, sqlite:, http(s):, postgresql:/mysql:/mssql: (with or without a +driver), databricks, and plain paths
    (absolute, or ./ ~/ ../ relative, or with a directory in them)."""
    if uri is None or uri in ("databricks", "databricks-uc"):
        return
    if "://" in uri or uri.startswith("file:"):
        if uri.split(":", 1)[0].split("+", 1)[0].lower() in URI_SCHEMES:
            return
    elif uri.startswith(("/", "./", "../", "~")) or "/" in uri:
        return
    raise ValueError(
        f"{name}={uri!r} is not a tracking URI that MLflow can open; use sqlite:///mlflow.db, http(s)://host:port, "
        "file:///path/to/mlruns, postgresql://..., mysql://..., databricks, or a path (./mlruns)"
    )


def resolve_uri(tracking_uri: str | None) -> str:
    """The URI with relative sqlite paths made absolute, so `spot-eval sync` works from any directory."""
    uri = tracking_uri or "sqlite:///mlflow.db"
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix) :].startswith("/"):
        return prefix + str(Path.cwd() / uri[len(prefix) :])
    return uri


def unreachable(uri: str) -> str | None:
    """Why an HTTP tracking server does not answer `GET /health` within 2 s; None if it does (or if
    the URI is not HTTP: a database is found out by its first call)."""
    if not uri.startswith(("http://", "https://")):
        return None
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=HEALTH_TIMEOUT_S):
            return None
    except urllib.error.HTTPError as err:
        # Any answer below 500 (401 from an authenticating proxy, say) means the server is there.
        return None if err.code < 500 else f"HTTP {err.code} from /health"
    except (OSError, ValueError) as err:
        return str(getattr(err, "reason", err))


@contextmanager
def client_env() -> Iterator[None]:
    """`CLIENT_ENV` for the duration of a call; the caller's environment is restored after it."""
    saved = {key: os.environ.get(key) for key in CLIENT_ENV}
    os.environ.update(CLIENT_ENV)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# MLflow 3.0 to 3.9 open an experiment by this tag: without it on the GenAI overview (traces, latency charts), empty
# for us; "custom_model_development" on the runs table, where the methods' figures are columns (a team's server may
# still run one of those). From 3.10 the UI decides by its own GenAI / Model training switch (remembered per browser)
# and reads no tag, so the link an evaluation prints says which (writer.MlflowTracker.ui_link), picks the columns
# (writer.runs_view), and the experiment's description carries the same link (docs/tracking.md).
EXPERIMENT_KIND, MODEL_DEVELOPMENT = "mlflow.experimentKind", "custom_model_development"


def experiment_id(client: MlflowClient, name: str) -> str:
    """The experiment's id, created if missing, and marked as model development unless it has a kind already."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            client.create_experiment(name, tags={EXPERIMENT_KIND: MODEL_DEVELOPMENT})
        except MlflowException as err:
            if err.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        experiment = client.get_experiment_by_name(name)  # ours, or another process's created meanwhile
    if EXPERIMENT_KIND not in experiment.tags:
        client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND, MODEL_DEVELOPMENT)
    return experiment.experiment_id


@contextmanager
def first_use(uri: str) -> Iterator[None]:
    """Serialise the first contact with a local sqlite store across processes: MLflow creates and
    migrates its tables on first connect, and two processes doing that at once (the ranks of a
    torchrun or accelerate launch in a fresh directory) collide on sqlite. Other stores: no lock."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        yield
        return
    folder = Path(uri[len(prefix) :]).parent
    folder.mkdir(parents=True, exist_ok=True)
    lock = os.open(folder, os.O_RDONLY)  # the database's folder is the lock: no lock file is left behind
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
    finally:
        os.close(lock)  # releases the flock
