"""`spot-eval spiffy-calibrate`: Spiffy's offline graph calibration (method.md §3.4, the paper's Algorithm 2).

Replay the target's draft-free trajectories at T = 0 on calibration prompts. At every step s >= 1
of a block, the root is the state before step s and its stale distribution is the one behind step
s - 1 (`BlockTrace.topk_logprobs[s - 1]`, what the engine hands a drafter). Each actual future
state s + d (d = 1 .. max_depth) becomes a graph node: (depth d, the set of formulas (i, j) of the
positions committed since the root), i the position's rank by stale top-1 probability among the
root's masked positions and j the committed token's rank in that position's stale top-k. A future
whose token is outside the top-k is skipped, and with it every deeper future (they all hold it).
The counts form the "full possibility graph"; the kept graph is the connected sub-graph of D nodes
with the highest cumulative frequency, chosen greedily from the root: repeatedly add the most
frequent node with an already chosen parent (ties: shallower, then the smaller formulas) [INF: the
notes give the objective, not the search]. Nodes are saved in depth order so parents come first.

Prompts [INF]: the paper calibrates on 25 MATH500 + 25 MBPP prompts, which are test items here, so
calibration uses training splits only: half the prompts from MATH train, half from MBPP's
prompt/validation/train task ids (`corpus.training_pairs`, test collisions removed), each source a
seeded shuffle, chat-formatted like `spot-eval decode --chat`. Prompts too long for the model's
positions are passed over. The result depends only on (target, settings, seed).
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from spot import BlockTrace, DecodeConfig, generate
from spot.drafters.spiffy import Formula, GraphNode, SpiffyGraph, position_order
from spot.targets.base import LoadedTarget, Target
from spot_eval.checkpoints.fingerprint import target_fingerprint
from spot_eval.checkpoints.spiffy_graph import write_graph
from spot_eval.checkpoints.target import encode_prompt, load_target
from spot_eval.training.corpus import training_pairs

CALIBRATION_SOURCES = ("math", "mbpp")
NodeKey = tuple[int, tuple[Formula, ...]]  # (depth, commits sorted by (i, j))
ROOT: NodeKey = (0, ())


@dataclass(frozen=True)
class FutureCounts:
    counts: dict[NodeKey, int]  # how often each future was seen
    steps: int  # roots counted (steps s >= 1 with a future)


def count_futures(traces: Iterable[BlockTrace], mask_id: int, max_depth: int) -> FutureCounts:
    """Express every actual future of every step as formulas relative to that step's stale distribution."""
    counts: Counter[NodeKey] = Counter()
    steps = 0
    for trace in traces:
        if trace.topk_ids is None or trace.topk_logprobs is None:
            raise ValueError(f"block {trace.block} was recorded without its top-k; replay with record_topk > 0")
        states = trace.states.tolist()  # [S + 1][K]
        n_steps = len(states) - 1
        for s in range(1, n_steps):
            root = states[s]
            ids = trace.topk_ids[s - 1].tolist()  # [K][k]
            order = position_order(trace.topk_logprobs[s - 1][:, 0], trace.states[s] == mask_id)
            rank = {p: i for i, p in enumerate(order)}
            commits: list[Formula] = []
            for d in range(1, min(max_depth, n_steps - s) + 1):
                before, after = states[s + d - 1], states[s + d]
                new = [p for p in range(len(root)) if before[p] == mask_id and after[p] != mask_id]
                if any(after[p] not in ids[p] for p in new):
                    break
                commits += [Formula(rank[p], ids[p].index(after[p])) for p in new]
                counts[(d, tuple(sorted(commits)))] += 1
            steps += 1
    return FutureCounts(dict(counts), steps)


def _is_parent(a: NodeKey, b: NodeKey) -> bool:
    return a[0] == b[0] - 1 and set(a[1]) < set(b[1])


def select(counts: FutureCounts, n_nodes: int) -> list[NodeKey]:
    """The greedy connected sub-graph: `n_nodes` keys beyond the root, in the order chosen."""
    by_depth: dict[int, list[NodeKey]] = {}
    for key in counts.counts:
        by_depth.setdefault(key[0], []).append(key)
    chosen = [ROOT]
    frontier = set(by_depth.get(1, ()))  # the root is every depth-1 node's parent
    while frontier and len(chosen) - 1 < n_nodes:
        best = min(frontier, key=lambda k: (-counts.counts[k], k[0], k[1]))
        chosen.append(best)
        frontier.discard(best)
        frontier |= {k for k in by_depth.get(best[0] + 1, ()) if _is_parent(best, k) and k not in chosen}
    return chosen[1:]


def build_graph(
    counts: FutureCounts,
    chosen: Sequence[NodeKey],
    block_length: int,
    policy: str,
    target: dict[str, object],
    calibration: dict[str, object],
) -> SpiffyGraph:
    """Nodes in depth order (stable), each with every chosen node one step shallower whose commits it extends."""
    keys = [ROOT, *sorted(chosen, key=lambda k: k[0])]
    nodes = [GraphNode((), 0, (), counts.steps)]
    for key in keys[1:]:
        parents = tuple(i for i, other in enumerate(keys) if _is_parent(other, key))
        nodes.append(GraphNode(key[1], key[0], parents, counts.counts[key]))
    return SpiffyGraph(tuple(nodes), block_length, policy, target, calibration)


def replay(target: Target, prompts: Sequence[Sequence[int]], config: DecodeConfig, topk: int) -> list[BlockTrace]:
    """Draft-free trajectories with their stale top-k, request i for prompt i."""
    traces: list[BlockTrace] = []
    for request, ids in enumerate(prompts):
        traces += generate(target, list(ids), config, request=request, record=True, record_topk=topk).trajectory
    return traces


def calibration_prompts(model: LoadedTarget, n: int, seed: int, gen_length: int, chat: bool) -> list[list[int]]:
    """ceil(n/2) MATH-train and floor(n/2) MBPP-train prompts, each source a seeded shuffle; prompts
    that do not fit the model's positions with gen_length are passed over."""
    out: list[list[int]] = []
    for source, want in zip(CALIBRATION_SOURCES, (math.ceil(n / 2), n // 2), strict=True):
        pairs = training_pairs((source,))
        order = list(range(len(pairs)))
        random.Random(seed).shuffle(order)
        taken = 0
        for index in order:
            if taken == want:
                break
            ids = encode_prompt(model, pairs[index].prompt, chat)
            k = model.block_length
            if math.ceil((len(ids) + gen_length) / k) * k <= model.max_positions:
                out.append(ids)
                taken += 1
        if taken < want:
            raise ValueError(f"only {taken} {source} training prompts fit the model's positions; ask for fewer --prompts")
    return out


@dataclass(frozen=True)
class CalibrationResult:
    out: str
    nodes: int
    steps: int  # roots counted
    distinct_futures: int  # nodes of the full possibility graph
    seconds: float


def calibrate(
    target: str | Path,
    out: str | Path,
    block_length: int | None,
    prompts: int,
    nodes: int,
    seed: int,
    max_depth: int = 6,
    topk: int = 8,
    gen_length: int = 256,
    policy: str = "single",
    threshold: float = 0.9,
    chat: bool = True,
    device: str = "cpu",
    dtype: torch.dtype | None = None,
    progress: Callable[[str], None] | None = None,
    cache: str | None = None,
) -> CalibrationResult:
    t0 = time.perf_counter()
    if prompts < 1 or nodes < 1 or max_depth < 1 or topk < 1:
        raise ValueError(
            f"--prompts ({prompts}), --max-nodes ({nodes}), --max-depth ({max_depth}) and --topk ({topk}) must be >= 1"
        )
    # Validates the policy and lengths before any weights load; the paper calibrates at T = 0.
    DecodeConfig(policy=policy, threshold=threshold, gen_length=gen_length, seed=seed)
    model = load_target(target, block_length, device, dtype=dtype, cache=cache)
    config = DecodeConfig(policy=policy, threshold=threshold, block_length=model.block_length, gen_length=gen_length, seed=seed)
    fingerprint = target_fingerprint(model, policy)
    ids = calibration_prompts(model, prompts, seed, gen_length, chat)
    if progress is not None:
        progress(f"replaying {len(ids)} prompts (block {model.block_length}, gen {gen_length}, policy {policy})")
    counts = count_futures(replay(model, ids, config, topk), model.mask_id, max_depth)
    chosen = select(counts, nodes)
    if len(chosen) < nodes:
        raise ValueError(
            f"calibration saw only {len(chosen)} connected futures, fewer than --max-nodes {nodes}; "
            "use more --prompts or a larger --gen-length"
        )
    seconds = time.perf_counter() - t0
    calibration = {
        "prompts": len(ids),
        "sources": list(CALIBRATION_SOURCES),
        "seed": seed,
        "gen_length": gen_length,
        "temperature": 0.0,
        "threshold": threshold if policy == "threshold" else None,
        "max_depth": max_depth,
        "topk": topk,
        "chat": chat,
        "steps_counted": counts.steps,
        "distinct_futures": len(counts.counts),
        "wall_seconds": round(seconds, 1),
    }
    graph = build_graph(counts, chosen, model.block_length, policy, fingerprint, calibration)
    write_graph(out, graph)
    return CalibrationResult(str(out), graph.size, counts.steps, len(counts.counts), seconds)
