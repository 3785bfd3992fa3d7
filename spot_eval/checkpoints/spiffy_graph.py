"""Spiffy's calibrated draft graph as a file: small, diffable JSON, checked against its target on load."""

from __future__ import annotations

import json
from pathlib import Path

from spot.drafters.spiffy import SpiffyGraph, graph_to_dict, load_graph
from spot.targets.base import LoadedTarget
from spot_eval.checkpoints.atomic_file import write_atomically
from spot_eval.checkpoints.fingerprint import check_fingerprint, target_fingerprint


def graph_json(graph: SpiffyGraph) -> str:
    """The graph as small, diffable JSON: one line per node."""
    raw = graph_to_dict(graph)
    head = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in raw.items() if k != "nodes"]
    nodes = ",\n".join(f"    {json.dumps(n)}" for n in raw["nodes"])
    return "{\n" + ",\n".join([*head[:3], f'  "nodes": [\n{nodes}\n  ]', *head[3:]]) + "\n}\n"


def write_graph(path: str | Path, graph: SpiffyGraph) -> None:
    """Write atomically (temp file + rename): an interrupted run never leaves half a graph."""
    write_atomically(path, lambda tmp: tmp.write_text(graph_json(graph)))


def graph_for_target(model: LoadedTarget, policy: str, path: str | Path) -> SpiffyGraph:
    """Load the graph at `path` (spot_eval.harness.methods.drafter_file finds the shipped one) and check that it
    was calibrated for this target, block length and policy."""
    path = Path(path)
    graph = load_graph(path, model.block_length)
    check_fingerprint(
        graph.target, target_fingerprint(model, policy), what=f"Spiffy graph {path} was calibrated",
        fix=f"calibrate a graph for this target (spot-eval spiffy-calibrate --target ... "
        f"--block-length {model.block_length} --unmasking {policy})",
    )
    return graph
