"""`spot-eval sync`: replay the runs that spot_eval/tracking/writer.py spooled during a tracking outage.

Each spool entry is one evaluation's journal (see `spool.Spool`). Replay recreates the parent run
and its nested runs with their start/end times and statuses, params, tags, metrics (with their steps
and timestamps), dataset inputs, artifacts and the experiment tags they set (a saved view of the runs
table), then deletes the entry, so a second sync does nothing. The runs that reached the server before
the outage are tagged `spot_eval.superseded_by` and, if still RUNNING, ended as FAILED. A sync cut short
(the server dies again) leaves the ids of the runs it created in `replayed`; the next sync deletes those
runs before replaying the entry again.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from spot_eval.tracking.spool import Spool
from spot_eval.tracking.store import TrackingUnavailable, client_env, experiment_id, first_use, unreachable
from spot_eval.tracking.writer import InputDataset, TrackingConfig, end_dead_run

REPLAYED = "replayed"  # ids of the runs a cut-short sync created, one a line


def sync(spool_dir: str | Path | None = None, tracking_uri: str | None = None) -> Iterator[str]:
    """Replay every entry of `spool_dir` into `tracking_uri` (default: the store each run was meant for),
    oldest first, yielding one summary line per entry. Raises TrackingUnavailable, keeping the entry,
    if the store cannot be reached or fails during the replay."""
    root = Path(spool_dir or TrackingConfig.spool_dir)
    entries = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if not entries:
        yield f"nothing to sync in {root}"
    for entry in entries:
        yield _sync_entry(entry, tracking_uri)
    if entries:
        with contextlib.suppress(OSError):  # an emptied spool goes too
            root.rmdir()


def _sync_entry(entry: Path, tracking_uri: str | None) -> str:
    with Spool.claim(entry) as free:
        if not free:
            return f"skipped {entry.name}: an evaluation is still writing it"
        records = Spool.read(entry)
        header = records[0]
        if not any(r["op"] == "outage" for r in records):
            # The process died with the store reachable: the store has every call already, but its runs may
            # still say RUNNING.
            shutil.rmtree(entry)
            return f"removed {entry.name}: it was logged to the tracking store live, nothing to replay" + _end_live(
                tracking_uri or header["tracking_uri"], header["experiment"], records)
        uri = tracking_uri or header["tracking_uri"]
        if reason := unreachable(uri):
            raise TrackingUnavailable(
                f"tracking server {uri} is unreachable ({reason}); the spool {entry} is kept"
            )
        try:
            with client_env():
                with first_use(uri):
                    client = MlflowClient(uri)
                    experiment = experiment_id(client, header["experiment"])
                _delete_partial_replay(client, entry)
                ids = _replay(client, entry, records, experiment)
                _supersede(client, records, ids)
        except (MlflowException, OSError) as err:
            raise TrackingUnavailable(
                f"replaying {entry} into {uri} failed ({str(err).strip().splitlines()[0][:200]}); "
                "the spool is kept: run `spot-eval sync` again"
            ) from err
        shutil.rmtree(entry)
    start = next(r for r in records if r["op"] == "start")  # the parent run
    return (
        f"synced {entry.name}: run {ids[start['run']]} ({start['name']!r}, {len(ids) - 1} nested runs) "
        f"into {uri}, experiment {header['experiment']!r}"
    )


def _end_live(uri: str, experiment: str, records: list[dict[str, Any]]) -> str:
    """End the runs of a live-logged journal whose process died (its lock was free) that are still RUNNING."""
    if unreachable(uri):
        return ""
    try:
        with client_env():
            client = MlflowClient(uri)
            found = client.get_experiment_by_name(experiment)
            ended = [r["server_id"] for r in records if r["op"] == "start" and r["parent"] is None and r["server_id"]
                     and found and end_dead_run(client, found.experiment_id, r["server_id"])]
    except (MlflowException, OSError):
        return ""
    return "".join(f"; its run {run_id} was still RUNNING and is now FAILED" for run_id in ended)


def _replay(
    client: MlflowClient, entry: Path, records: list[dict[str, Any]], experiment: str
) -> dict[str, str]:
    """Recreate the journal's runs; returns journal run name -> new run id."""
    ids: dict[str, str] = {}
    ended: set[str] = set()
    with (entry / REPLAYED).open("a") as replayed:
        for r in records:
            op = r["op"]
            if op == "start":
                tags = {"spot_eval.spool": entry.name}
                if r["parent"] is not None:
                    tags[MLFLOW_PARENT_RUN_ID] = ids[r["parent"]]
                run = client.create_run(experiment, start_time=r["time"], tags=tags, run_name=r["name"])
                ids[r["run"]] = run.info.run_id
                replayed.write(run.info.run_id + "\n")
                replayed.flush()
            elif op == "params":
                client.log_batch(ids[r["run"]], params=[Param(k, v) for k, v in r["params"].items()])
            elif op == "metrics":
                metrics = [Metric(k, v, r["time"], r["step"]) for k, v in r["metrics"].items()]
                client.log_batch(ids[r["run"]], metrics=metrics)
            elif op == "tags":
                client.log_batch(ids[r["run"]], tags=[RunTag(k, v) for k, v in r["tags"].items()])
            elif op == "experiment_tags":
                for key, value in r["tags"].items():
                    client.set_experiment_tag(experiment, key, value)
            elif op == "inputs":
                client.log_inputs(ids[r["run"]], datasets=[InputDataset(**d).entity() for d in r["datasets"]])
            elif op == "artifact":
                client.log_artifact(ids[r["run"]], str(entry / r["file"]), r["artifact_path"])
            elif op == "end":
                client.set_terminated(ids[r["run"]], r["status"], end_time=r["time"])
                ended.add(r["run"])
    for key in ids.keys() - ended:
        client.set_terminated(ids[key], "KILLED")  # the evaluation died before ending this run
    return ids


def _supersede(client: MlflowClient, records: list[dict[str, Any]], ids: dict[str, str]) -> None:
    """Point the runs the server got before the outage at their complete replays."""
    for r in records:
        if r["op"] != "start" or r["server_id"] is None:
            continue
        try:
            if client.get_run(r["server_id"]).info.status == "RUNNING":
                client.set_terminated(r["server_id"], "FAILED")
            client.set_tag(r["server_id"], "spot_eval.superseded_by", ids[r["run"]])
        except MlflowException as err:
            # Not found: the old run lives in another store (sync --tracking-uri), nothing to mark.
            if err.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise


def _delete_partial_replay(client: MlflowClient, entry: Path) -> None:
    path = entry / REPLAYED
    if not path.exists():
        return
    for run_id in path.read_text().split():
        try:
            client.delete_run(run_id)
        except MlflowException as err:
            if err.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
    path.unlink()
