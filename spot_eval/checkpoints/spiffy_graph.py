"""Spiffy's calibrated draft graph as a file: written, read, validated and checked against its target here, and
nowhere else (spot.drafters.spiffy holds the graph as data and drafts from it).

The file is small, diffable JSON (`spiffy-graph/1`): one line per node, node ids its indices, parents first.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from spot.drafters.spiffy import Formula, GraphNode, SpiffyGraph
from spot.targets.base import LoadedTarget
from spot_eval.checkpoints.atomic_file import write_atomically
from spot_eval.checkpoints.fingerprint import check_fingerprint, target_fingerprint

FORMAT = "spiffy-graph/1"


def graph_to_dict(graph: SpiffyGraph) -> dict:
    """The JSON-ready form (`spiffy-graph/1`): node ids are indices, parents come first."""
    nodes = [
        {"id": i, "commits": [[f.rank, f.token] for f in n.commits], "parents": list(n.parents), "depth": n.depth,
         "count": n.count}
        for i, n in enumerate(graph.nodes)
    ]
    return {
        "format": FORMAT,
        "target": dict(graph.target),
        "block_length": graph.block_length,
        "nodes": nodes,
        "declared_nodes": graph.size,
        "calibration": dict(graph.calibration),
    }


def graph_from_dict(raw: object, source: str = "the graph") -> SpiffyGraph:
    """Validate and build a graph; every problem is a ValueError naming `source` and the problem.

    Node ids must be 0 .. N (in any list order), each node's parents with smaller ids. `depth`
    defaults to the number of commits (the `single` case), `count` to 0.
    """

    def bad(why: str) -> ValueError:
        return ValueError(f"{source} is not a valid Spiffy draft graph: {why}")

    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        found = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise bad(f"unknown format {found!r}, expected {FORMAT!r}")
    for key in ("target", "block_length", "nodes", "declared_nodes"):
        if key not in raw:
            raise bad(f"missing key {key!r}")
    target, nodes, calibration = raw["target"], raw["nodes"], raw.get("calibration", {})
    if not isinstance(target, dict) or not isinstance(calibration, dict):
        raise bad("'target' and 'calibration' must be objects")
    if not isinstance(nodes, list) or not all(isinstance(n, dict) for n in nodes):
        raise bad("'nodes' must be a list of objects")
    if not isinstance(raw["block_length"], int):
        raise bad(f"block_length must be an integer, got {raw['block_length']!r}")
    if raw["declared_nodes"] != len(nodes) - 1:
        raise bad(f"it declares {raw['declared_nodes']} nodes beyond the root but holds {len(nodes) - 1}")
    by_id: dict[int, dict] = {}
    for node in nodes:
        node_id = node.get("id")
        commits, parents = node.get("commits"), node.get("parents")
        if not isinstance(node_id, int) or node_id in by_id:
            raise bad(f"node ids must be distinct integers; got {node_id!r} twice or not an integer")
        if not isinstance(parents, list) or not all(isinstance(p, int) for p in parents):
            raise bad(f"node {node_id}: 'parents' must be a list of node ids")
        if not isinstance(commits, list) or not all(
            isinstance(c, list) and len(c) == 2 and all(isinstance(v, int) for v in c) for c in commits
        ):
            raise bad(f"node {node_id}: 'commits' must be a list of [i, j] integer pairs")
        if not isinstance(node.get("depth", 0), int) or not isinstance(node.get("count", 0), int):
            raise bad(f"node {node_id}: 'depth' and 'count' must be integers")
        by_id[node_id] = node
    if set(by_id) != set(range(len(nodes))):
        raise bad(f"node ids must be 0 .. {len(nodes) - 1} (0 the root); got {sorted(by_id)}")
    for node_id, node in sorted(by_id.items()):
        dangling = [p for p in node["parents"] if p not in by_id]
        if dangling:
            raise bad(f"node {node_id} names parent(s) {dangling}, which are not in the graph (dangling parent)")
    cycle = _on_cycles(by_id)
    if cycle:
        raise bad(f"its parent links form a cycle through nodes {cycle}")
    built = []
    for node_id in range(len(nodes)):
        node = by_id[node_id]
        commits = tuple(sorted(Formula(i, j) for i, j in node["commits"]))
        parents = tuple(sorted(set(node["parents"])))
        built.append(GraphNode(commits, node.get("depth", len(commits)), parents, node.get("count", 0)))
    try:
        return SpiffyGraph(tuple(built), raw["block_length"], target.get("policy"), target, calibration)
    except ValueError as err:
        raise bad(str(err)) from None


def _on_cycles(by_id: dict[int, dict]) -> list[int]:
    """The nodes on (or between) cycles of the parent links: what is left after repeatedly removing
    nodes without a remaining parent, then nodes without a remaining child."""
    parents = {n: set(node["parents"]) for n, node in by_id.items()}
    children = {n: {c for c in by_id if n in parents[c]} for n in by_id}
    left = set(by_id)
    for links in (parents, children):
        while free := {n for n in left if not links[n] & left}:
            left -= free
    return sorted(left)


def load_graph(path: str | Path, block_length: int | None = None) -> SpiffyGraph:
    """Read and validate a graph file; with `block_length`, refuse a graph for another block length.

    Raises:
        FileNotFoundError: no such file.
        ValueError: naming the file, for malformed JSON, a malformed graph or another block length.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"Spiffy graph {path} does not exist; calibrate one (spot-eval spiffy-calibrate --out {path}) or pass another"
        )
    stat = path.stat()
    graph = _parsed(path, (stat.st_ino, stat.st_mtime_ns, stat.st_size))
    if block_length is not None and graph.block_length != block_length:
        raise ValueError(
            f"Spiffy graph {path} was calibrated for block length {graph.block_length}, but the target decodes "
            f"block length {block_length}; pass the graph of block length {block_length} "
            f"(spot-eval spiffy-calibrate --block-length {block_length})"
        )
    return graph


@functools.lru_cache(maxsize=16)
def _parsed(path: Path, version: tuple[int, int, int]) -> SpiffyGraph:
    """The graph in the file, parsed once per version of it (inode, modification time, size): a run checks it
    before the target loads and builds from it after (spot_eval.harness.methods), and a graph is immutable."""
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"Spiffy graph {path} is not valid JSON ({err}); recalibrate it with spot-eval spiffy-calibrate") from None
    return graph_from_dict(raw, source=f"Spiffy graph {path}")


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
