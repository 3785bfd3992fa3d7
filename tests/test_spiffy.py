"""Spiffy: graph validation, instantiation and pruning on literal distributions, losslessness in the
engine with hand-made and calibrated graphs, and a deterministic calibration command."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import replace

import pytest
import torch
from conftest import MASK_ID, VOCAB, tiny_target, write_checkpoint

from spot import DecodeConfig, Sampling, generate
from spot.drafters.base import DraftContext, DraftError
from spot.drafters.spiffy import Formula, SpiffyDrafter, commit_offsets, instantiate, prune, scores
from spot.sizing import DraftMode, Sizing, VerifyCost
from spot_eval.checkpoints.spiffy_graph import (
    graph_for_target,
    graph_from_dict,
    graph_to_dict,
    load_graph,
    write_graph,
)
from spot_eval.checkpoints.target import load_target
from spot_eval.cli import main
from spot_eval.training.spiffy_calibrate import build_graph, count_futures, replay, select

M = MASK_ID



def graph_dict(block_length: int = 16, policy: str = "single") -> dict:
    """A hand-made graph: depth-1 guesses, and {(0,0),(1,0)} reached through both commit orders."""
    nodes = [
        {"id": 0, "commits": [], "parents": []},
        {"id": 1, "commits": [[0, 0]], "parents": [0]},
        {"id": 2, "commits": [[1, 0]], "parents": [0]},
        {"id": 3, "commits": [[0, 1]], "parents": [0]},
        {"id": 4, "commits": [[0, 0], [1, 0]], "parents": [1, 2]},
        {"id": 5, "commits": [[0, 0], [2, 0]], "parents": [1]},
        {"id": 6, "commits": [[0, 0], [1, 0], [2, 0]], "parents": [4, 5]},
        {"id": 7, "commits": [[0, 0], [1, 0], [2, 0], [3, 0]], "parents": [6]},
    ]
    return {
        "format": "spiffy-graph/1",
        "target": {"block_length": block_length, "policy": policy},
        "block_length": block_length,
        "nodes": nodes,
        "declared_nodes": len(nodes) - 1,
    }


# -- validation --------------------------------------------------------------------------------


def broken(edit) -> dict:
    raw = copy.deepcopy(graph_dict())
    edit(raw)
    return raw


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda g: g.update(format="spiffy-graph/0"), "unknown format 'spiffy-graph/0'"),
        (lambda g: g["nodes"][1].update(parents=[6]), r"cycle through nodes \[1, 4, 5, 6\]"),
        (lambda g: g["nodes"][4].update(parents=[1, 9]), r"node 4 names parent\(s\) \[9\], which are not in the graph"),
        (lambda g: g.update(declared_nodes=10), "declares 10 nodes beyond the root but holds 7"),
        (lambda g: g["nodes"][5].update(parents=[2]), "cannot have parent 2"),
        (lambda g: g["nodes"][3].update(commits=[[0, 0]]), "nodes 1 and 3 are the same node"),
        (lambda g: g["nodes"][1].update(depth=2), "policy single needs depth == its commits"),
        (lambda g: g["nodes"][1].update(commits=[[16, 0]]), "a formula outside 0 <= i < 16"),
        (lambda g: g["target"].update(block_length=32), "the target fingerprint says block length 32"),
        (lambda g: g["nodes"].pop(0), "it declares 7 nodes beyond the root but holds 6"),
        (lambda g: g["nodes"][2].update(id=8), r"node ids must be 0 .. 7 \(0 the root\)"),
        (lambda g: g["nodes"][4].update(depth="2"), "'depth' and 'count' must be integers"),
    ],
)
def test_malformed_graphs_are_refused_naming_the_problem_and_the_file(tmp_path, edit, message):
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(broken(edit)))
    with pytest.raises(ValueError, match=message) as err:
        load_graph(path)
    assert str(path) in str(err.value)


def test_a_graph_round_trips_and_orders_parents_first():
    raw = graph_dict()
    raw["nodes"] = raw["nodes"][::-1]  # ids in any order
    graph = graph_from_dict(raw)
    assert graph.size == 7 and graph.nodes[4].parents == (1, 2) and graph.nodes[6].parents == (4, 5)
    assert graph_from_dict(graph_to_dict(graph)) == graph



def test_a_graph_file_is_parsed_once_per_version(tmp_path):
    """A run reads its graph three times before it decodes (checked before the target loads, again when the drafter
    is built, and for the target's fingerprint): one parse, until the file changes."""
    path = tmp_path / "graph.json"
    write_graph(path, graph_from_dict(graph_dict()))
    first = load_graph(path)
    assert load_graph(path, block_length=first.block_length) is first
    write_graph(path, replace(first, calibration={"prompts": 2}))  # a new file, renamed into place
    again = load_graph(path)
    assert again is not first and again.calibration == {"prompts": 2} and again.nodes == first.nodes

def test_a_graph_for_another_block_length_or_target_is_refused(tmp_path):
    path = tmp_path / "b16.json"
    path.write_text(json.dumps(graph_dict(16)))
    with pytest.raises(ValueError, match="calibrated for block length 16, but the target decodes block length 32"):
        load_graph(path, block_length=32)
    with pytest.raises(FileNotFoundError, match="spiffy-calibrate"):
        load_graph(tmp_path / "missing.json")
    path.write_text("{not json")
    with pytest.raises(ValueError, match=f"Spiffy graph {path} is not valid JSON"):
        load_graph(path)

    checkpoint = write_checkpoint(tmp_path / "ckpt")
    model = load_target(checkpoint, None)
    path.write_text(json.dumps(graph_dict(16)))  # a fingerprint without this target's identity
    with pytest.raises(ValueError, match="differs in tokenizer_sha256.*weights_digest"):
        graph_for_target(model, "single", path)
    drafter = SpiffyDrafter(graph_from_dict(graph_dict(16)))
    # Met while drafting: the engine names the drafter, the graph's own error its cause (the harness refuses such a
    # file before the target loads: spot_eval.harness.methods.drafter_file).
    with pytest.raises(DraftError, match="drafter 'spiffy' raised ValueError: this Spiffy graph is for block length 16") as err:
        generate(tiny_target(32), [1, 2], DecodeConfig(block_length=32, gen_length=40, budget=3), drafter=drafter)
    assert isinstance(err.value.__cause__, ValueError)


# -- instantiation and pruning on literals -----------------------------------------------------

# Block of 4: position 0 is committed (7); the masked positions rank 2 (p 0.9), 3 (p 0.7), 1 (p 0.5).
STATE = torch.tensor([7, M, M, M])
PROBS = torch.tensor([[0.9, 0.05, 0.01], [0.5, 0.3, 0.1], [0.9, 0.05, 0.03], [0.7, 0.2, 0.05]])
IDS = torch.tensor([[1, 2, 3], [10, 11, 12], [20, 21, 22], [30, 31, 32]])


def test_instantiation_at_t0_names_positions_by_confidence_and_tokens_by_rank():
    raw = graph_dict(4)
    raw["nodes"][5]["commits"] = [[0, 0], [2, 2]]
    raw["nodes"][6]["parents"] = [4]
    drafts = instantiate(graph_from_dict(raw), STATE, PROBS.log(), IDS, M, Sampling())
    expected = [
        [7, M, M, M],
        [7, M, 20, M],  # (0, 0): the most confident position, its top token
        [7, M, M, 30],  # (1, 0)
        [7, M, 21, M],  # (0, 1): the runner-up token
        [7, M, 20, 30],  # {(0, 0), (1, 0)}: two parents
        [7, 12, 20, M],  # {(0, 0), (2, 2)}
        [7, 10, 20, 30],  # {(0, 0), (1, 0), (2, 0)}
        # node 7 names position rank 3 of three masked positions: dropped
    ]
    assert drafts.states.tolist() == expected
    assert drafts.parents == ((), (0,), (0,), (0,), (1, 2), (1,), (4,))
    assert drafts.local[4] == pytest.approx((math.log(0.9) + math.log(0.7)) / 2)
    assert drafts.local[5] == pytest.approx((math.log(0.9) + math.log(0.1)) / 2)


def test_instantiation_at_t1_draws_each_commit_with_its_steps_noise():
    noise = {e: torch.zeros(4, 3, dtype=torch.float64) for e in range(4)}
    noise[0][2, 1] = 5.0  # step root+0 draws 21 at position 2 (log 0.05 + 5 > log 0.9)
    noise[1][3, 2] = 5.0  # step root+1 draws 32 at position 3
    graph = graph_from_dict(graph_dict(4))
    drafts = instantiate(graph, STATE, PROBS.log(), IDS, M, Sampling(temperature=1.0), noise.__getitem__)
    assert drafts.states[1:5].tolist() == [
        [7, M, 21, M],  # (0, 0) with step 0's noise
        [7, M, M, 30],  # (1, 0) is the first commit here: step 0's noise
        [7, M, 20, M],  # (0, 1): the runner-up of step 0's draw
        [7, M, 21, 32],  # rank 0 at step 0, rank 1 at step 1
    ]
    # top_k 1 keeps only each position's top token: node 3's runner-up cannot be drawn, so it goes.
    filtered = instantiate(graph, STATE, PROBS.log(), IDS, M, Sampling(temperature=1.0, top_k=1), noise.__getitem__)
    assert filtered.states[1:4].tolist() == [[7, M, 20, M], [7, M, M, 30], [7, M, 20, 30]]
    assert commit_offsets(3, 3) == [0, 1, 2] and commit_offsets(4, 2) == [0, 0, 0, 1]


def test_pruning_keeps_the_best_connected_nodes_by_geometric_mean_score():
    parents = [(), (0,), (0,), (1, 2), (1,)]
    local = [0.0, *map(math.log, (0.3, 0.5, 0.8, 0.99))]
    got = [math.exp(s) for s in scores(parents, local)]
    assert got[3:] == pytest.approx([0.8, 0.99])  # leaves: their local score
    assert got[2] == pytest.approx(math.sqrt(0.5 * 0.8))
    assert got[1] == pytest.approx(math.sqrt(0.3 * math.sqrt(0.8 * 0.99)))
    assert prune(parents, local, 1) == [2]
    assert prune(parents, local, 2) == [2, 3]
    assert prune(parents, local, 3) == [1, 2, 3]  # node 4 scores best but needs its parent 1 first
    assert prune(parents, local, 9) == [1, 2, 3, 4]


def test_spiffy_v1_keeps_the_graph_in_calibration_order_where_v4_prunes_by_score():
    """The same instantiated graph and budget 2: Spiffy v4 (the default) keeps the best-scoring connected nodes,
    Spiffy v1 the first two of the graph's own order, with no online pruning."""
    stale = torch.full((4, VOCAB), -30.0)  # log-softmax of it is PROBS' logs at IDS, to well within a millionth
    stale.scatter_(1, IDS, PROBS.log())
    graph = graph_from_dict(graph_dict(4))
    ctx = DraftContext(STATE, stale, STATE, None, DecodeConfig(block_length=4), M, 0, 0, 1, 2, lambda step: None)
    drafts = instantiate(graph, STATE, PROBS.log(), IDS, M, Sampling())
    v4, v1 = SpiffyDrafter(graph, prune_to=2).draft(ctx), SpiffyDrafter(graph, prune_to=2, order="calibration").draft(ctx)
    kept = [drafts.states[i].tolist() for i in prune(drafts.parents, drafts.local, 2)]
    assert v4.states[1:].tolist() == kept and v1.states[1:].tolist() == drafts.states[1:3].tolist()
    assert v4.states[1:].tolist() != v1.states[1:].tolist()
    assert (SpiffyDrafter(graph).name, SpiffyDrafter(graph, order="calibration").name) == ("spiffy", "spiffy_v1")
    with pytest.raises(ValueError, match="unknown order 'random'; choose score or calibration"):
        SpiffyDrafter(graph, order="random")


# -- losslessness in the engine ----------------------------------------------------------------


class Recording:
    """Wraps a drafter and records (tree size, budget, has a multi-parent node) per draft."""

    def __init__(self, drafter) -> None:
        self.drafter, self.name, self.trees = drafter, drafter.name, []

    def draft(self, ctx):
        tree = self.drafter.draft(ctx)
        self.trees.append((tree.size, ctx.budget, any(len(ps) > 1 for ps in tree.parents)))
        return tree


def prompts(seed: int, n: int = 3, length: int = 11) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB - 2, (length,), generator=g).tolist() for _ in range(n)]


def calibrated(target, block_length: int, policy: str, seed: int = 0):
    config = DecodeConfig(policy=policy, threshold=0.5, block_length=block_length, gen_length=2 * block_length, seed=seed)
    counts = count_futures(replay(target, prompts(seed), config, topk=8), MASK_ID, max_depth=6)
    fingerprint = {"block_length": block_length, "policy": policy}
    return build_graph(counts, select(counts, 10), block_length, policy, fingerprint, {"seed": seed})


@pytest.mark.parametrize("block_length", [16, 32])
@pytest.mark.parametrize("policy", ["single", "threshold"])
def test_spiffy_reproduces_draft_free_tokens(block_length, policy):
    target = tiny_target(block_length, seed=block_length, eos_ids=frozenset())
    hand = graph_dict(block_length, policy)
    for node in hand["nodes"][1:]:
        node["depth"] = len(node["commits"]) if policy == "single" else max(1, len(node["commits"]) - 1)
    if policy == "threshold":  # one step may commit two formulas: nodes 4 and 5 are one step deep
        hand["nodes"][4]["parents"] = hand["nodes"][5]["parents"] = [0]
    graphs = {"hand-made": graph_from_dict(hand), "calibrated": calibrated(target, block_length, policy)}
    assert graphs["calibrated"].size == 10
    for temperature in (0.0, 1.0):
        config = DecodeConfig(
            policy=policy, threshold=0.5, block_length=block_length, gen_length=50,
            sampling=Sampling(temperature=temperature), seed=7,
        )
        prompt = prompts(100 + block_length, n=1)[0]
        reference = generate(target, prompt, config, record=True)
        for name, graph in graphs.items():
            for budget, prune_to in ((3, 3), (10, 3), (10, None)):
                drafter = Recording(SpiffyDrafter(graph, prune_to=prune_to))
                got = generate(target, prompt, replace(config, budget=budget), drafter=drafter)
                assert got.token_ids == reference.token_ids, (name, temperature, budget, prune_to)
                cap = min(budget, prune_to or graph.size)
                assert all(size <= cap for size, _, _ in drafter.trees)
                if name == "calibrated" and temperature == 0 and prune_to is None:
                    assert got.stats.forwards < reference.stats.forwards  # drafts do get accepted


def test_calibrated_graphs_are_dags_and_the_full_graph_is_drafted_when_asked():
    target = tiny_target(16, seed=3, eos_ids=frozenset())
    graph = calibrated(target, 16, "single")
    assert any(len(node.parents) > 1 for node in graph.nodes)
    assert graph.nodes[1].commits == (Formula(0, 0),)  # the most frequent future: the most confident top token
    drafter = Recording(SpiffyDrafter(graph, prune_to=None))
    generate(target, prompts(9, n=1)[0], DecodeConfig(block_length=16, gen_length=32, budget=10), drafter=drafter)
    assert max(size for size, _, _ in drafter.trees) == 10
    assert any(multi for _, _, multi in drafter.trees)


# -- the calibration command -------------------------------------------------------------------


def test_calibration_is_deterministic_and_its_graph_decodes_losslessly(tmp_path, capsys):
    checkpoint = str(write_checkpoint(tmp_path / "ckpt"))
    args = ["spiffy-calibrate", "--target", checkpoint, "--prompts", "2", "--max-nodes", "4", "--gen-length", "16",
            "--no-chat", "--seed", "5"]
    outs = [tmp_path / "a.json", tmp_path / "b.json"]
    for out in outs:
        main([*args, "--out", str(out)])
    texts = [json.loads(out.read_text()) for out in outs]
    for raw in texts:
        raw["calibration"].pop("wall_seconds")
    assert texts[0] == texts[1]
    assert texts[0]["declared_nodes"] == 4 and texts[0]["target"]["policy"] == "single"
    assert texts[0]["calibration"]["prompts"] == 2 and texts[0]["calibration"]["seed"] == 5
    capsys.readouterr()

    decode = ["decode", "--target", checkpoint, "--prompt", "t1 t2 t3 t4 t5", "--gen-length", "40", "--json"]
    main(decode)
    reference = json.loads(capsys.readouterr().out)
    main([*decode, "--method", "spiffy", "--budget", "3", "--drafter", str(outs[0])])
    spiffy = json.loads(capsys.readouterr().out)
    assert spiffy["token_ids"] == reference["token_ids"] and spiffy["method"] == "spiffy"

    with pytest.raises(SystemExit) as exit_:
        main([*decode, "--method", "spiffy", "--budget", "3", "--drafter", str(outs[0]), "--unmasking", "threshold"])
    assert exit_.value.code == 2
    assert "was calibrated for policy single, but this run decodes with policy threshold" in capsys.readouterr().err


def test_spiffy_trees_carry_the_calibration_counts_as_reach_and_auto_stays_lossless():
    """budget=auto for Spiffy: a node's reach is how often calibration saw its future (count / root count)."""
    raw = graph_dict(16)
    for node, count in zip(raw["nodes"], (100, 60, 20, 10, 15, 5, 4, 2), strict=True):
        node["count"] = count
    graph = graph_from_dict(raw)
    assert graph.reach == (1.0, 0.6, 0.2, 0.1, 0.15, 0.05, 0.04, 0.02)
    assert graph_from_dict(graph_dict(16)).reach is None  # hand-made: no counts
    target = tiny_target(16, seed=3, eos_ids=frozenset())
    config = DecodeConfig(block_length=16, gen_length=40, sampling=Sampling(1.0), seed=2)
    prompt = list(range(1, 12))
    reference = generate(target, prompt, config, record=True)
    drafter = SpiffyDrafter(graph, prune_to=None)
    assert drafter.modes == {"graph": graph.reach[1:]}
    trees = []

    class Spy:
        name = "spiffy"
        modes = drafter.modes

        def draft(self, ctx):
            trees.append(drafter.draft(ctx))
            return trees[-1]

    for cost in (VerifyCost((1, 9), (0,), ((1.0, 1.1),)), VerifyCost((1, 2), (0,), ((1.0, 1.5),))):
        got = generate(target, prompt, replace(config, budget=7), drafter=Spy(), sizing=Sizing(cost, (DraftMode("graph", ((1, 0.01),), graph.reach[1:]),)))
        assert got.token_ids == reference.token_ids
    drafted = [t for t in trees if t.size]
    assert drafted and all(t.reach[0] == 1.0 and set(t.reach[1:]) <= set(graph.reach[1:]) for t in drafted)
