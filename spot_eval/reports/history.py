"""Reading past runs back from MLflow: evaluation runs as bundles, and the nightly series.

Writing goes through spot_eval/tracking/writer.py (with its spool); this module only reads, and turns an
unreachable store or an empty experiment into a `HistoryError` that names the fix.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from spot_eval.reports.results import Bundle, ResultsError, combine, newest_only, read_bundle, read_run
from spot_eval.tracking.store import client_env, first_use, resolve_uri, unreachable

KIND_TAG = "spot_eval.kind"  # "nightly" on a nightly's summary run
SUITE_TAG = "spot_eval.suite"  # the suite name on a nightly's summary run
REGRESSION_TAG = "spot_eval.reports.regression"  # "true" / "false" on a nightly's summary run
NIGHTLY_TAG = "spot_eval.nightly_run_id"  # on each evaluation run a nightly started
BUNDLE_ARTIFACT = "nightly/nightly.json"


class HistoryError(RuntimeError):
    """MLflow cannot give what was asked for; the message says why and what to do instead."""


@dataclass(frozen=True)
class NightlyRun:
    run_id: str
    start_time: int  # ms since the epoch
    status: str
    regression: bool
    metrics: dict[str, float]


def _client(tracking_uri: str | None) -> tuple[MlflowClient, str]:
    uri = resolve_uri(tracking_uri)
    why = unreachable(uri)
    if why:
        raise HistoryError(f"MLflow at {uri} is unreachable ({why}); start the server, or pass results files with --results")
    with first_use(uri):  # two nightlies started at once on a fresh ./mlflow.db would both create its tables
        return MlflowClient(tracking_uri=uri), uri


def _experiment(client: MlflowClient, uri: str, name: str) -> str:
    try:
        with client_env():
            experiment = client.get_experiment_by_name(name)
    except MlflowException as err:
        raise HistoryError(f"MLflow at {uri} failed to answer ({err.error_code}); check the URI or pass --results") from None
    if experiment is None:
        raise HistoryError(f"experiment {name!r} does not exist at {uri}; check --experiment and --tracking-uri")
    return experiment.experiment_id


def nightly_runs(tracking_uri: str | None, experiment: str, limit: int = 30, suite: str | None = None) -> list[NightlyRun]:
    """The experiment's nightly summary runs (of one suite, if given), newest first (an absent experiment has none)."""
    client, uri = _client(tracking_uri)
    try:
        experiment_id = _experiment(client, uri, experiment)
    except HistoryError as err:
        if "does not exist" in str(err):
            return []
        raise
    with client_env():
        runs = client.search_runs(
            [experiment_id], filter_string=f"tags.`{KIND_TAG}` = 'nightly'" + (f" and tags.`{SUITE_TAG}` = '{suite}'" if suite else ""),
            max_results=limit,
            order_by=["attributes.start_time DESC"],
        )
    return [
        NightlyRun(r.info.run_id, r.info.start_time, r.info.status,
                   r.data.tags.get(REGRESSION_TAG) == "true", dict(r.data.metrics))
        for r in runs
    ]


def nightly_bundle(tracking_uri: str | None, run_id: str) -> Bundle:
    client, _ = _client(tracking_uri)
    with tempfile.TemporaryDirectory() as tmp, client_env():
        try:
            path = client.download_artifacts(run_id, BUNDLE_ARTIFACT, tmp)
        except (MlflowException, OSError) as err:
            raise HistoryError(f"nightly run {run_id} has no {BUNDLE_ARTIFACT} artifact ({err}); pin a baseline with --baseline") from None
        return read_bundle(path)


def evaluation_bundle(tracking_uri: str | None, experiment: str, run_ids: list[str] | None = None) -> Bundle:
    """The `lm_eval --model spot` runs of an experiment (or the given ones) as one bundle; a request decoded by several
    runs (a suite's nightlies on several days) counts once, from the newest (results.newest_only)."""
    client, uri = _client(tracking_uri)
    experiment_id = _experiment(client, uri, experiment)
    with client_env():
        if run_ids:
            runs = sorted((client.get_run(r) for r in run_ids), key=lambda r: r.info.start_time, reverse=True)
        else:
            runs = client.search_runs(
                [experiment_id], filter_string="attributes.status = 'FINISHED'", max_results=500,
                order_by=["attributes.start_time DESC"],
            )
    runs = [r for r in runs if "decoder/gen_length" in r.data.params]  # evaluation parents, not children or nightlies
    if not runs:
        raise HistoryError(
            f"experiment {experiment!r} at {uri} has no finished `lm_eval --model spot` runs; run an evaluation first"
        )
    bundles = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            where = Path(tmp) / run.info.run_id
            where.mkdir()
            with client_env():
                try:
                    local = client.download_artifacts(run.info.run_id, "spot-eval", str(where))
                except (MlflowException, OSError) as err:
                    raise HistoryError(f"run {run.info.run_id} has no spot-eval artifacts ({err})") from None
            try:
                bundles.append(read_run(local))
            except ResultsError as err:
                raise HistoryError(f"run {run.info.run_id}: {err}") from None
        return combine(newest_only(bundles))
