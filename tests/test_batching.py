"""Batched decoding (spot.engine.generations): B requests in one verify forward per round, continuous batching.

In the exact layout a request's rows meet the very kernels they meet alone, so every request's tokens, forward
count, finish and text equal its batch-1 decode bit for bit, whatever else shares the batch: checked here for
batch sizes 1, 2, 3 and 8 with mixed prompt lengths and stop points, for every target family and cache mode,
temperature, policy and drafter, and at the level of a single forward's logits in fp32 and bf16.
"""

from __future__ import annotations

import functools
import json
from dataclasses import replace

import pytest
import torch
from conftest import existing_store, run_lm_eval_here, tiny_qwen3, tiny_qwen3_moe, write_checkpoint
from test_dual_cache import tiny_dream, tiny_llada
from test_llada2 import tiny_llada2
from test_lm import REPO, run_lm_eval
from test_refresh import refreshed
from test_refreshed_sets import wild
from test_set_model import learned
from test_spiffy import calibrated

from spot import DecodeConfig, Request, Sampling, generate, generate_batch, generations
from spot.drafters import AdversarialDrafter, OracleDrafter, RandomDrafter
from spot.drafters.base import DraftContext
from spot.drafters.freedave import FreeDaveDrafter
from spot.drafters.hybrid import HybridDrafter
from spot.drafters.order_model import OrderModel
from spot.drafters.reach import ReachCalibration, ReachMap
from spot.drafters.refreshed_sets import RefreshedSets
from spot.drafters.sets import SetsDrafter, StaleSets
from spot.drafters.spiffy import SpiffyDrafter
from spot.drafters.spot import SpotDrafter
from spot.targets import BlockCausalTarget, DualCacheTarget
from spot.targets.base import Call
from spot_eval.checkpoints.drafter import load_checkpoint
from spot_eval.checkpoints.shipped import shipped_drafter

VOCAB, MASK, EOS = 64, 63, 62
SIZES = (2, 3, 8)


def family(name: str, dtype: torch.dtype = torch.float32):
    """Every target family in the exact layout: SDAR (dense and MoE) and LLaDA2.0 block-causal, LLaDA under each
    frozen-cache decoder, Dream (shifted logits)."""
    eos = frozenset({EOS})
    if name in ("sdar", "sdar_moe", "llada2"):
        build = {"sdar": tiny_qwen3, "sdar_moe": tiny_qwen3_moe, "llada2": tiny_llada2}[name]
        return BlockCausalTarget(build(seed=5).to(dtype), MASK, eos, 16, exact=True)
    if name == "dream":
        return DualCacheTarget(tiny_dream(seed=5, dtype=dtype), MASK, eos, 16, shift=True)
    return DualCacheTarget(tiny_llada(seed=5, dtype=dtype), MASK, eos, 16, cache=name.removeprefix("llada_"))


REACH = ReachCalibration((1, 2), (ReachMap((-4.0, 0.0), (0.2, 0.9)), ReachMap((-8.0, 0.0), (0.02, 0.5))), (0.7, 0.3, 0.1))
FAMILIES = ["sdar", "sdar_moe", "llada2", "llada_dual", "llada_prefix", "llada_none", "llada_nosuffix", "dream"]


def words(ids: list[int]) -> str:
    return " ".join(f"t{i}" for i in ids)


def mixed(config: DecodeConfig, n: int = 8, seed: int = 0) -> list[Request]:
    """n requests of 1 to 40 prompt tokens, each with its own generation length and, for some, a stop string:
    they stop at different points, so the batch changes as they finish."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = torch.randint(1, MASK - 1, (int(torch.randint(1, 41, (), generator=g)),), generator=g).tolist()
        stop = (f"t{int(torch.randint(1, MASK - 1, (), generator=g))}",) if i % 3 == 1 else ()
        out.append(Request(prompt, replace(config, gen_length=int(torch.randint(8, 49, (), generator=g)), stop_strings=stop),
                           number=1000 + i))
    return out


def outcome(g) -> tuple:
    return g.token_ids, g.text, g.finish_reason, g.stats.forwards, g.stats.steps, g.stats.accepted_lengths


def same_at_every_batch_size(target, requests: list[Request]) -> list[tuple]:
    """Each request's outcome at batch 1, checked to be the same at every batch size."""
    alone = [outcome(generate(target, r.prompt_ids, r.config, r.drafter, r.number, decode=words)) for r in requests]
    for size in SIZES:
        batched = generate_batch(target, requests, size, decode=words)
        assert [outcome(g) for g in batched] == alone, size
    return alone


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize(("policy", "temperature"), [("single", 0.0), ("threshold", 1.0)])
def test_draft_free_decoding_is_the_same_at_every_batch_size(name, policy, temperature):
    target = family(name)
    config = DecodeConfig(policy=policy, threshold=0.5, block_length=16, gen_length=32, sampling=Sampling(temperature), seed=3)
    same_at_every_batch_size(target, mixed(config))


@pytest.mark.parametrize(("name", "temperature"), [("sdar", 1.0), ("llada2", 0.0), ("llada_dual", 1.0), ("dream", 0.0)])
def test_every_drafter_is_lossless_and_batch_invariant(name, temperature):
    """Each request's drafter in its own trees (oracle, adversarial, random, untrained SPOT, Spiffy), its pieces
    verified beside the other requests' (with cross-block pieces on block-causal targets): tokens and forwards as
    at batch 1, and as draft-free's tokens. One SPOT drafter serves every request, so its order model scores all
    the requests' roots in one call per round."""
    target = family(name)
    config = DecodeConfig(policy="single", block_length=16, gen_length=32, sampling=Sampling(temperature), seed=4,
                          cross_block=isinstance(target, BlockCausalTarget),
                          tie_break="topk" if name in ("llada_dual", "dream") else "leftmost")  # each request its own row
    requests = mixed(replace(config, cross_block=False), n=4, seed=1)
    references = [generate(target, r.prompt_ids, r.config, request=r.number, decode=words, record=True) for r in requests]
    torch.manual_seed(0)
    spot = SpotDrafter(OrderModel(), gate=0.9)
    calibrated_spot = SpotDrafter(spot.model, gate=0.9, reach=REACH)  # the hybrid weighs its nodes by their reach
    drafters = [lambda ref: OracleDrafter(ref.trajectory), lambda ref: AdversarialDrafter(ref.trajectory, VOCAB),
                lambda ref: RandomDrafter(VOCAB, seed=2), lambda ref: spot, lambda ref: FreeDaveDrafter(),
                lambda ref: HybridDrafter(calibrated_spot)]
    if name == "sdar":  # Spiffy's graph calibrated on this target (test_spiffy covers the other families at batch 1)
        graph = calibrated(target, 16, "single")
        drafters.append(lambda ref: SpiffyDrafter(graph, prune_to=3))
        spot_r = refreshed(target, 1, wild=True)  # SPOT-R's head reads each request's own hidden states and nodes
        spot_rc = refreshed(target, 1, wild=True, mode="stale")  # and SPOT-RC's order, its refreshed confidences
        drafters += [lambda ref: spot_r, lambda ref: spot_rc]
    for make in drafters:
        speculative = [replace(r, config=replace(r.config, budget=4, cross_block=config.cross_block), drafter=make(ref))
                       for r, ref in zip(requests, references, strict=True)]
        alone = same_at_every_batch_size(target, speculative)
        assert [a[0] for a in alone] == [ref.token_ids for ref in references], make(references[0]).name


@pytest.mark.parametrize("name", ["sdar", "llada_dual"])
def test_spot_sets_is_lossless_and_batch_invariant_under_threshold_decoding(name):
    """SPOT-Sets' trees under threshold decoding at T = 1, from the stale-confidence set predictor, from a learned
    set model (random weights, its token corrections large enough to overturn the stale ranking), whose one call per
    round scores every request's root, and SPOT-RS's (a wild refresh head: each request's nodes read its own
    hidden states and commits)."""
    target = family(name)
    config = DecodeConfig(policy="threshold", threshold=0.5, block_length=16, gen_length=32, sampling=Sampling(1.0), seed=6)
    requests = mixed(config, n=4, seed=2)
    references = [generate(target, r.prompt_ids, r.config, request=r.number, decode=words).token_ids for r in requests]
    rule = StaleSets(((1.0, 0.0, 0.0), (0.8, 0.1, -0.5)))
    for sets in (SetsDrafter(rule), learned(target, 1, wild=True), SetsDrafter(RefreshedSets(wild(target, 2), rule), name="sets_r")):
        alone = same_at_every_batch_size(target, [replace(r, config=replace(r.config, budget=6), drafter=sets) for r in requests])
        assert [a[0] for a in alone] == references, sets.name


@pytest.mark.parametrize("trained", [False, True], ids=["random", "shipped"])
def test_a_batched_draft_is_each_requests_own_tree(trained):
    """`draft_batch` over several requests' contexts (different states, steps, temperatures, modes) gives each the
    tree `draft` gives it alone, node for node and score for score: the order model's rows do not depend on the
    other rows in its call. The random model drafts blocks of 3 positions, 3 rows a request: a CPU matmul of
    fewer than 4 rows takes another kernel than a larger one (spot.targets.rows), so plain linear layers fail
    here, where the drafters' row-invariant ones (spot.drafters.order_model.layer_linear) pass."""
    if trained:
        checkpoint = load_checkpoint(shipped_drafter("spot", 32))
        drafter, k = SpotDrafter(checkpoint.model, reach=checkpoint.reach, stale=checkpoint.stale), 32
    else:
        torch.manual_seed(1)
        drafter, k = SpotDrafter(OrderModel(), gate=0.9), 3
    g = torch.Generator().manual_seed(3)
    ctxs = []
    for i in range(7):
        state = torch.where(torch.rand(k, generator=g) < 0.3, torch.randint(0, VOCAB - 2, (k,), generator=g), MASK)
        before = state.clone()
        before[int(torch.nonzero(state != MASK)[0]) if (state != MASK).any() else 0] = MASK
        config = DecodeConfig(block_length=k, gen_length=2 * k, sampling=Sampling(0.0 if i % 2 else 1.0), seed=i)
        logits, prior = torch.randn(k, 256, generator=g) * 4, torch.randn(k, 256, generator=g) * 4
        ctxs.append(DraftContext(state, logits, before, prior if i % 3 else None, config, MASK, 100 + i, i % 2, 2 + i, 3 + i,
                                 lambda step: None, "stale" if trained and i == 5 else None))
    alone = [drafter.draft(ctx) for ctx in ctxs]
    for size in (2, 3, 7):
        batched = [tree for start in range(0, len(ctxs), size) for tree in drafter.draft_batch(ctxs[start : start + size])]
        for a, b in zip(alone, batched, strict=True):
            assert torch.equal(a.states, b.states) and a.parents == b.parents and a.scores == b.scores and a.reach == b.reach


def test_continuous_batching_admits_a_waiting_request_as_one_finishes():
    """Generations come back as they finish, not in order; B requests are in flight until the queue empties."""
    target = family("sdar")
    requests = [Request([1, 2, 3], DecodeConfig(block_length=16, gen_length=length, stop_at_eos=False), number=i)
                for i, length in enumerate((112, 16, 16, 16, 16))]
    sizes, verify = [], target.verify_batch

    def counted(calls):
        sizes.append(len(calls))
        return verify(calls)

    target.verify_batch = counted
    order = [i for i, _ in generations(target, requests, 2)]
    assert order[-1] == 0 and sorted(order) == list(range(5))  # the long request finishes last
    assert max(sizes) == 2 and sizes.count(2) > sizes.count(1)  # a short one's slot went to the next waiting request
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        generate_batch(target, requests, 0)


def call(target, prompt: list[int], i: int) -> Call:
    """Request i's call, its stream in a state of its own: its prefix pending (riding along with the verify), or
    cached by an earlier verify with the next block pending; a cross piece on request 2 (block-causal targets)."""
    k, g = target.block_length, torch.Generator().manual_seed(i)
    prefix = torch.tensor(prompt if target.blocks_at_prompt_end else prompt[: len(prompt) // k * k])
    stream = target.open(prefix, prefix.numel() + 3 * k)
    start = prefix.numel()
    if i % 2:  # a block verified and committed: its KV cached (block-causal) or the canvas frozen anew (dual cache)
        first = torch.randint(1, MASK - 1, (k,), generator=g)
        target.verify_batch([Call(stream, first[None], start)])
        stream.commit(first)
        start += k
    pieces = torch.randint(1, MASK - 1, (3 + i, k), generator=g)
    pieces[torch.rand(3 + i, k, generator=g) < 0.5] = MASK
    ahead = None
    if i == 2 and target.cross_block:
        ahead = torch.cat([pieces[1:2], torch.full((1, k), MASK)], dim=1)  # [1, 2K]
    return Call(stream, pieces, start, ahead)


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_requests_logits_in_a_batched_forward_are_its_own_forwards_bit_for_bit(name, dtype):
    """Four requests of 16, 27, 40 and 5 prompt tokens, in different cache states, in one forward: every call's
    logits and hidden states equal those of its forward alone, to the last bit, in bf16 too."""
    target = family(name, dtype)
    prompts = [list(range(1, n + 1)) for n in (16, 27, 40, 5)]
    calls = [call(target, p, i) for i, p in enumerate(prompts)]
    forwards = target.forwards
    together = target.verify_batch(calls)
    assert target.forwards == forwards + 1  # a batched forward counts once
    for i, prompt in enumerate(prompts):
        alone = target.verify_batch([call(target, prompt, i)])[0]
        assert torch.equal(alone.logits, together[i].logits) and torch.equal(alone.hidden, together[i].hidden), i


@pytest.mark.slow
def test_lm_eval_at_batch_size_4_gives_what_batch_size_1_gives(tmp_path, capsys):
    """The real `lm_eval --model spot --batch_size 4` against `--batch_size 1` (SPOT on the embedded target, exact;
    every drafter's batching in-process: test_every_drafter_is_lossless_and_batch_invariant and, for SPOT-Sets,
    test_spot_sets_is_lossless_and_batch_invariant_under_threshold_decoding): the
    same responses, forward counts per request and scores; batch 4 checked its draft-free tokens against batch 1's
    (no batch divergence) and says its batch size in run.json and MLflow. Batch 1, the reference, runs in this
    process; batch 4 is the real command."""
    args = "methods=spot@8,exact=true,device=cpu,threads=1"
    runs = {}
    for size, launch in ((1, functools.partial(run_lm_eval_here, capsys)), (4, run_lm_eval)):
        cwd = tmp_path / f"b{size}"
        run = launch("--model", "spot", "--model_args", f"{args},mlflow_tracking_uri={existing_store(cwd)}",
                     "--tasks", "spot_gsm8k", "--include_path", str(REPO / "tasks"), "--limit", "4",
                     "--gen_kwargs", "max_gen_toks=32", "--batch_size", str(size), "--output_path", str(cwd / "out"), "--log_samples", cwd=cwd)
        assert run.returncode == 0, run.stderr[-3000:]
        run_dir = next(cwd.glob("spot-eval-runs/*"))
        samples = [json.loads(line) for line in (run_dir / "samples.jsonl").open()]
        scored = json.loads(next((cwd / "out").rglob("results_*.json")).read_text())
        logged = [json.loads(line) for line in next((cwd / "out").rglob("samples_spot_gsm8k_*.jsonl")).open()]
        runs[size] = ({(s["doc_id"], s["label"]): (s["token_ids"], s["forwards"]) for s in samples},
                      scored["results"]["spot_gsm8k"], sorted((s["doc_id"], s["resps"]) for s in logged),
                      json.loads((run_dir / "run.json").read_text()), samples)
    (one, scores_one, responses_one, _, _), (four, scores_four, responses_four, run_json, samples) = runs[1], runs[4]
    assert len(one) == 8 and one == four  # 4 requests x (draft-free, spot@8)
    assert responses_one == responses_four and scores_one == scores_four
    assert all(s["lossless"] and s["batch_size"] == 4 for s in samples)
    assert run_json["batch_size"] == 4 and run_json["identity"]["batch_size"] == "4"
    import mlflow

    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path}/b4/mlflow.db")
    [parent] = [r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])
                if "mlflow.parentRunId" not in r.data.tags]
    assert parent.data.params["batch_size"] == "4" and parent.data.tags["spot_eval.batch_size"] == "4"


def test_a_batch_divergence_is_kept_and_ends_the_run_like_a_methods(tmp_path):
    """Draft-free at batch N against batch 1: the record keeps the divergence through the --use_cache round trip,
    and the run ends naming the request and the decision that flipped."""
    from spot.policy import Margins
    from spot_eval.harness.lm import SpotArgs
    from spot_eval.harness.lossless import Divergence, MethodRecord
    from spot_eval.harness.session import RequestRecord, Session
    from spot_eval.tracking.writer import NullTracker

    flipped = Divergence(2, 0, 3, "token", 0.004, Margins(position=0.5, threshold=None, token=0.004))
    record = RequestRecord("spot_gsm8k", 3, 0, 99, "abc", "t1",
                           [MethodRecord("draft_free", 0, (1, 2, 3), 5, 5, 1.0, 0.9, 0.0, (1,) * 5, None)],
                           batch_size=4, batch_divergence=flipped)
    assert RequestRecord.from_json(record.to_json()) == replace(record, resumed=True)
    session = Session(SpotArgs(fail_on_divergence=True), {}, NullTracker(), out_dir=tmp_path / "run")
    session.add(record)
    with pytest.raises(SystemExit, match=r"spot_gsm8k doc 3 \(repeat 0\) draft_free at batch 4 against batch 1: first "
                       r"divergent token 2; block 0 step 3: the token decision flipped \(margin 0.004"):
        session.finish({"results": {}})
    rows = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").open()]
    assert rows[0]["batch_size"] == 4


def test_the_lm_eval_model_decodes_the_same_records_at_any_batch_size(tmp_path, monkeypatch):
    """SpotLM.generate_until at batch 3 and 1 (draft-free, the oracle built from each request's reference, random
    trees, T = 1): the same texts, tokens and forwards per request and method, each repeat its own draw, lm-eval's
    padding copy answered and not recorded, and no batch divergence."""
    from test_lm import make_lm, request

    monkeypatch.chdir(tmp_path)
    reqs = [request(" ".join(f"t{i}" for i in range(1, 2 + 3 * n)), n, until=("t9",)) for n in range(5)]
    # lm-eval lists an Instance once per repeat (request() makes 2), and pads a shorter rank with copies beyond them
    reqs += [reqs[-1], reqs[-1]]
    runs = {}
    for size in (1, 3):
        lm = make_lm(str(write_checkpoint(tmp_path / f"ckpt{size}")), temperature=1.0, batch_size=size)
        texts = lm.generate_until(reqs)
        runs[size] = texts, [(r.doc_id, [(m.label, m.token_ids, m.forwards) for m in r.methods], r.batch_size, r.batch_divergence)
                             for r in lm.session.records]
    (texts_one, records_one), (texts_three, records_three) = runs[1], runs[3]
    assert texts_one == texts_three and len(texts_three) == 7 and texts_three[-1] == texts_three[-2] != texts_three[-3]
    assert [r[:2] for r in records_one] == [r[:2] for r in records_three] and len(records_three) == 6
    assert all(size == 3 and divergence is None for _, _, size, divergence in records_three)
