"""SPOT-RS (spot.drafters.refreshed_sets): its examples read the head's distribution at the node, its rule is fitted on
them, and what it cannot read is refused; its trees are lossless whatever the head's weights in tests/test_set_model.py
(beside the learned set model's) and batch-invariant in tests/test_batching.py."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from conftest import tiny_target, write_checkpoint
from test_refresh import SMALL, with_hidden
from test_token_drift import block

from spot import DecodeConfig
from spot.drafters.base import DraftContext
from spot.drafters.order_model import step_noise_at_topk
from spot.drafters.refresh import RefreshConfig, RefreshedTokens, RefreshHead
from spot.drafters.refreshed_sets import RefreshedSets, refreshed_set_examples
from spot.drafters.set_model import Projection
from spot.drafters.sets import SetsDrafter, StaleSets, fit_stale_sets, set_examples
from spot_eval.checkpoints.refresh_head import load_refresh
from spot_eval.cli import main
from spot_eval.training import collect as collect_module


def neutral(topk: int, hidden_dims: int, vocab: int) -> RefreshedTokens:
    """A head that keeps the stale ranking and gives the candidates half the mass: its query and mass layers zero, so
    a candidate's refreshed probability is its share among the candidates times sigmoid(0)."""
    head = RefreshHead(RefreshConfig(topk=topk, hidden_dims=hidden_dims, embedding_dims=2), torch.ones(vocab, 2))
    for layer in (head.query, head.mass):
        torch.nn.init.zeros_(layer.weight)
        torch.nn.init.zeros_(layer.bias)
    return RefreshedTokens(head.eval(), Projection.identity(hidden_dims))


def test_an_example_reads_the_heads_confidence_at_the_node_and_the_set_the_step_committed():
    b = with_hidden(block())  # K = 4, top-2 at 0.6 and 0.3 everywhere
    for depth in (0, 1):
        conf, masked, chosen = refreshed_set_examples([b], neutral(2, 3, 10), depth)
        stale_conf, stale_masked, stale_chosen = set_examples([b], depth)
        assert torch.equal(masked, stale_masked) and torch.equal(chosen, stale_chosen)
        assert torch.allclose(stale_conf, torch.full_like(stale_conf, 0.6))
        assert torch.allclose(conf, torch.full_like(conf, (0.6 / 0.9) / 2), atol=1e-6)  # the share, half the mass
    # Depth 0 from root steps 1, 2 and 3: the positions steps 1, 2 and 3 committed.
    assert refreshed_set_examples([b], neutral(2, 3, 10), 0)[2].int().tolist() == [[0, 1, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]]


def test_an_example_reads_the_stale_forward_behind_the_root_and_the_noise_of_the_node_step():
    """At T = 1 with a head that reads the neighbours, the hidden state and the staleness: example (root step s, depth
    d) is the head's draw for the node states[s + d] from the forward behind step s - 1 (its top-k, hidden state and
    state), Δ = d + 1, under step s + d's noise."""
    b = with_hidden(block(1.0))
    torch.manual_seed(0)
    head = RefreshHead(RefreshConfig(topk=2, hidden_dims=3, embedding_dims=2), torch.randn(10, 2))
    for parameter in (head.neighbour, head.query.weight, head.mass.weight):
        torch.nn.init.normal_(parameter, std=2.0)
    tokens = RefreshedTokens(head.eval(), Projection.identity(3))
    conf = refreshed_set_examples([b], tokens, 1)[0]
    by_hand = []
    for s in (1, 2):  # root steps with a node one step deeper and a step after it
        ids = b.topk_ids[s - 1]
        noise = step_noise_at_topk(b.seed, b.request, b.block, [s + 1], ids)
        fresh = tokens.refreshed(b.topk_logprobs[s - 1], ids, b.hidden[s - 1], b.states[s - 1], b.states[s + 1][None], [1], 1.0, noise)
        by_hand.append(fresh.prediction.probs[0, :, 0].double())
    assert torch.equal(conf, torch.stack(by_hand))
    assert not torch.allclose(conf, refreshed_set_examples([b], tokens, 0)[0][:2])  # another node, staleness and step


def test_the_rule_is_fitted_on_the_refreshed_confidences():
    b = with_hidden(block())
    tokens = neutral(2, 3, 10)
    fitted = fit_stale_sets([b, b], 0.9, depths=4, examples=lambda blocks, d: refreshed_set_examples(blocks, tokens, d))
    assert len(fitted.coefficients) == 4 and all(math.isfinite(v) for c in fitted.coefficients for v in c)
    assert fitted.coefficients[3] == fitted.coefficients[2]  # no example three steps deep in a block of four steps


def test_blocks_without_hidden_states_or_with_a_narrower_top_k_are_refused():
    with pytest.raises(ValueError, match="without hidden states"):
        refreshed_set_examples([block()], neutral(2, 3, 10), 0)
    with pytest.raises(ValueError, match="top-2"):
        refreshed_set_examples([with_hidden(block())], neutral(4, 3, 10), 0)


def wild(target, seed: int) -> RefreshedTokens:
    """Random weights whose reading of the neighbours overturns the stale ranking, so its trees differ from SPOT-Sets'."""
    torch.manual_seed(seed)
    embeddings = target.embeddings().detach().float()
    head = RefreshHead(SMALL, Projection.fit(embeddings, SMALL.embedding_dims)(embeddings))
    torch.nn.init.normal_(head.neighbour, std=3.0)
    torch.nn.init.normal_(head.query.weight, std=3.0)
    return RefreshedTokens(head.eval(), Projection.fit(torch.randn(64, embeddings.shape[1]), SMALL.hidden_dims))


def test_a_context_without_hidden_states_is_refused():
    target = tiny_target(16)
    k = target.block_length
    logits = torch.randn(k, target.vocab_size, generator=torch.Generator().manual_seed(0))
    state = torch.full((k,), target.mask_id)
    config = DecodeConfig(policy="threshold", threshold=0.5, block_length=k, budget=4)
    ctx = DraftContext(state, logits, state.clone(), None, config, target.mask_id, 0, 0, 1, 4, lambda _: None)
    with pytest.raises(ValueError, match="SPOT-RS reads the target's hidden states"):
        SetsDrafter(RefreshedSets(wild(target, 0), StaleSets(((1.0, 0.0, 0.0),)))).draft(ctx)


@pytest.mark.slow
def test_cli_records_in_the_heads_projections_fits_the_rule_into_the_file_and_sets_r_decodes_losslessly(tmp_path, capsys, monkeypatch):
    """A SPOT-R file for a tiny target (collect, train-drafter, train-refresh), then threshold trajectories recorded in
    its head's projections (collect --projections-from), the rule fitted into a copy of the file (fit-sets --refresh),
    and sets_r decoding with it at T = 0 and 1 as draft-free decoding does; what it cannot use is refused."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    checkpoint = write_checkpoint(tmp_path / "ckpt")
    single, threshold, order, refresh, fitted = (tmp_path / n for n in ("single", "threshold", "spot.pt", "spot_r.pt", "sets_r.pt"))
    common = ["--target", str(checkpoint), "--prompts", "4", "--gen-length", "32", "--no-chat", "--shard-size", "2",
              "--temperatures", "0,1", "--hidden-dims", "8", "--embedding-dims", "8"]
    main(["collect", "--out", str(single), *common])
    main(["train-drafter", "--trajectories", str(single), "--out", str(order), "--steps", "3", "--batch-size", "32", "--heldout", "0.5"])
    main(["train-refresh", "--trajectories", str(single), "--order-model", str(order), "--out", str(refresh), "--steps", "5",
          "--batch-size", "32", "--heldout", "0.5", "--reach-budget", "2"])
    with monkeypatch.context() as patch, pytest.raises(SystemExit):  # the head projects on 8 and 8: refused before the target loads
        patch.setattr(collect_module, "load_target", lambda *a, **k: pytest.fail("the target loaded before the refusal"))
        main(["collect", "--out", str(tmp_path / "x"), *common[:-4], "--hidden-dims", "4", "--embedding-dims", "8",
              "--policy", "threshold", "--projections-from", str(refresh)])
    assert "pass --hidden-dims 8 --embedding-dims 8" in capsys.readouterr().err
    main(["collect", "--out", str(threshold), *common, "--policy", "threshold", "--threshold", "0.5", "--projections-from", str(refresh)])
    with pytest.raises(SystemExit):  # single-policy trajectories hold no sets to fit on
        main(["fit-sets", "--refresh", str(refresh), "--trajectories", str(single)])
    assert "commit one position" in capsys.readouterr().err
    other = tmp_path / "other"  # threshold trajectories recorded on other components than the head's
    shutil.copytree(threshold, other)
    projections = torch.load(other / "projections.pt", weights_only=True)
    projections["embedding"]["mean"] = projections["embedding"]["mean"] + 1
    torch.save(projections, other / "projections.pt")
    with pytest.raises(SystemExit):
        main(["fit-sets", "--refresh", str(refresh), "--trajectories", str(other)])
    assert f"collect them with --projections-from {refresh}" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # nor does collect add to them
        main(["collect", "--out", str(other), *common, "--prompts", "6", "--policy", "threshold", "--threshold", "0.5",
              "--projections-from", str(refresh)])
    assert "recorded in other projections than the drafter's" in capsys.readouterr().err
    capsys.readouterr()
    main(["fit-sets", "--refresh", str(refresh), "--trajectories", str(threshold), "--out", str(fitted), "--depths", "2"])
    report = json.loads(capsys.readouterr().out)
    assert len(report["coefficients"]) == 2 and report["heldout"]["examples"][0] > 0 and "stale_heldout" in report
    assert load_refresh(refresh).sets is None and load_refresh(fitted).sets.threshold == 0.5

    def decode(temperature: str, *extra: str) -> dict:
        main(["decode", "--pretrained", str(checkpoint), "--prompt", "one two three", "--gen-length", "32", "--json", "--threads",
              "1", "--policy", "threshold", "--threshold", "0.5", "--temperature", temperature, *extra])
        return json.loads(capsys.readouterr().out)

    for temperature in ("0", "1"):
        free = decode(temperature)
        got = decode(temperature, "--method", "sets_r", "--budget", "4", "--drafter", str(fitted))
        assert got["token_ids"] == free["token_ids"] and got["forwards"] <= free["forwards"], temperature
    for drafter, threshold_given, message in ((refresh, "0.5", "holds no SPOT-RS rule"), (fitted, "0.7", "fitted at threshold 0.5")):
        with pytest.raises(SystemExit):
            main(["decode", "--pretrained", str(checkpoint), "--prompt", "one", "--gen-length", "32", "--policy", "threshold",
                  "--threshold", threshold_given, "--method", "sets_r", "--budget", "4", "--drafter", str(drafter)])
        err = capsys.readouterr().err
        assert message in err and "--projections-from" in err, err
    with pytest.raises(SystemExit):  # single-commit decoding has no sets to draft
        main(["decode", "--pretrained", str(checkpoint), "--prompt", "one", "--gen-length", "32", "--method", "sets_r",
              "--budget", "4", "--drafter", str(fitted)])
    assert "decode with --unmasking threshold" in capsys.readouterr().err
