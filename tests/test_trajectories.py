"""`spot-eval collect` and the trajectory shards: what is recorded, resuming, refusing to mix data,
and the end-to-end path to a drafter checkpoint, on a tiny random target directory."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import replace

import pytest
import torch
from conftest import write_checkpoint

from spot import DecodeConfig, Sampling, generate
from spot.drafters.order_examples import example_index, make_examples
from spot.drafters.order_model import predict, step_noise_at_topk
from spot_eval.checkpoints.atomic_file import write_atomically
from spot_eval.checkpoints.drafter import load_checkpoint
from spot_eval.checkpoints.fingerprint import check_fingerprint, target_fingerprint
from spot_eval.checkpoints.refresh_head import load_refresh
from spot_eval.checkpoints.target import encode_prompt, load_target
from spot_eval.cli import main
from spot_eval.training.collect import collect, plan
from spot_eval.training.corpus import training_pairs
from spot_eval.training.trajectories import read_blocks, read_manifest

GEN = 32
SETTINGS = {"policy": "single", "block_length": None, "gen_length": GEN, "temperatures": (0.0, 1.0), "seed": 3,
            "shard_size": 2, "chat": False}



@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("target") / "ckpt")


@pytest.fixture(scope="module")
def recorded(checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("traj") / "single"
    result = collect(checkpoint, out, prompts=4, **SETTINGS)
    return out, result


def test_collect_writes_compact_shards_and_a_manifest(checkpoint, recorded):
    out, result = recorded
    assert (result.decoded, result.shards_written, result.shards_skipped) == (4, 2, 0)
    manifest = read_manifest(out)
    fp = manifest.fingerprint
    assert fp["tokenizer_sha256"] == hashlib.sha256((checkpoint / "tokenizer.json").read_bytes()).hexdigest()
    assert (fp["model"], fp["block_length"], fp["policy"]) == ("ckpt", 16, "single")
    assert manifest.settings.topk == 32 and manifest.settings.temperatures == (0.0, 1.0) and manifest.settings.gen_length == GEN
    assert [(s.file, s.first, s.count, s.requests) for s in manifest.shards] == [
        ("shard-00000.pt", 0, 2, 2),
        ("shard-00001.pt", 2, 2, 2),
    ]
    shard = torch.load(out / "shard-00000.pt", weights_only=True)
    assert shard["states"].dtype == torch.int16 and shard["topk_ids"].dtype == torch.int16
    assert shard["topk_logprobs"].dtype == torch.float16 and shard["topk_logprobs"].shape[1:] == (16, 32)
    assert sorted({p.source for p in training_pairs()}) == ["gsm8k", "math", "mbpp"]
    assert not list(out.glob("*.tmp"))


def test_rerun_skips_finished_shards_and_redoes_missing_ones(checkpoint, recorded, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(recorded[0], out)
    again = collect(checkpoint, out, prompts=4, **SETTINGS)
    assert (again.decoded, again.shards_written, again.shards_skipped) == (0, 0, 2)
    (out / "shard-00001.pt").unlink()  # as if the run died before this shard was renamed into place
    redo = collect(checkpoint, out, prompts=5, **SETTINGS)  # and ask for one prompt more
    assert (redo.decoded, redo.shards_written, redo.shards_skipped) == (3, 2, 1)
    assert [s.count for s in read_manifest(out).shards] == [2, 2, 1]
    first = read_blocks(recorded[0], "single")
    assert all(torch.equal(a.states, b.states) for a, b in zip(first, read_blocks(out, "single"), strict=False))


@pytest.mark.slow
def test_worker_processes_write_the_shards_one_process_writes(checkpoint, tmp_path):
    one_thread = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers' thread count, so the float arithmetic is the same
    try:
        alone = collect(checkpoint, tmp_path / "alone", prompts=6, **SETTINGS)
    finally:
        torch.set_num_threads(one_thread)
    lines: list[str] = []
    pooled = collect(checkpoint, tmp_path / "pool", prompts=6, **SETTINGS, workers=2, threads=1, progress=lines.append)
    assert (pooled.decoded, pooled.shards_written) == (alone.decoded, alone.shards_written) == (6, 3)
    assert len(lines) == 3 and all("2 requests" in line for line in lines)
    assert read_manifest(tmp_path / "pool").shards == read_manifest(tmp_path / "alone").shards
    for a, b in zip(read_blocks(tmp_path / "alone", "single"), read_blocks(tmp_path / "pool", "single"), strict=True):
        assert (a.request, a.block, a.temperature) == (b.request, b.block, b.temperature)
        assert torch.equal(a.states, b.states) and torch.equal(a.topk_ids, b.topk_ids)
        assert torch.equal(a.topk_logprobs, b.topk_logprobs)


def test_recorded_blocks_are_what_a_fresh_decode_gives(checkpoint, recorded):
    blocks = read_blocks(recorded[0], "single")
    requests = plan(4, SETTINGS["seed"], len(training_pairs()))
    assert list(dict.fromkeys(b.request for b in blocks)) == requests  # plan order, one request per prompt
    target = load_target(checkpoint, None)
    for position in (0, 1):  # T = 0 and T = 1
        request = requests[position]
        config = DecodeConfig(block_length=16, gen_length=GEN, seed=SETTINGS["seed"], sampling=Sampling(temperature=float(position)))
        ids = encode_prompt(target, training_pairs()[request].prompt, chat=False)
        traces = generate(target, ids, config, request=request, record=True, record_topk=32).trajectory
        mine = [b for b in blocks if b.request == request]
        assert [b.block for b in mine] == [t.block for t in traces] and {b.temperature for b in mine} == {float(position)}
        for block, trace in zip(mine, traces, strict=True):
            assert torch.equal(block.states, trace.states) and torch.equal(block.topk_ids.long(), trace.topk_ids)
            torch.testing.assert_close(block.topk_logprobs.float(), trace.topk_logprobs.clamp_min(-60), atol=0.02, rtol=1e-3)


def test_examples_and_labels_agree_with_the_trajectory(recorded):
    agree = total = 0
    for block in read_blocks(recorded[0], "single"):
        committed = block.committed_positions()  # [S]
        tokens = block.states[1:].gather(1, committed[:, None])[:, 0]  # [S] the committed tokens
        pairs = example_index(block, max_depth=4)
        batch = make_examples(block, pairs, buckets=128)
        for (s, d), label, candidates in zip(pairs, batch.labels, batch.candidates, strict=True):
            assert int(label) == int(committed[s + d]) and bool(candidates[label])
            assert torch.equal(candidates, block.states[s + d] == block.mask_id)
        for s in range(committed.numel()):  # the recorded top-k is the distribution step s was decided on
            p, ids = int(committed[s]), block.topk_ids[s].long()
            if block.temperature == 0:
                assert int(tokens[s]) == int(ids[p, 0])
            elif int(tokens[s]) in ids[p].tolist():  # Gumbel-max over the vocabulary, won inside the top-k
                noise = step_noise_at_topk(block.seed, block.request, block.block, s, ids)
                drawn = predict(block.topk_logprobs[s].float(), ids, block.temperature, noise).tokens[p, 0]
                agree, total = agree + int(int(drawn) == int(tokens[s])), total + 1
    assert total > 20 and agree / total > 0.95  # float16 log-probabilities may flip a near tie


def test_another_policy_or_setting_in_the_same_directory_fails(checkpoint, recorded):
    out = recorded[0]
    with pytest.raises(ValueError, match="policy: 'single' vs 'threshold'") as err:
        collect(checkpoint, out, prompts=4, **{**SETTINGS, "policy": "threshold"})
    assert str(out) in str(err.value) and "use another --out" in str(err.value)
    with pytest.raises(ValueError, match="gen_length: 32 vs 48"):
        collect(checkpoint, out, prompts=4, **{**SETTINGS, "gen_length": 48})


def test_read_blocks_rejects_another_policy(recorded):
    with pytest.raises(ValueError, match="trajectory shards from a different policy") as err:
        read_blocks(recorded[0], "threshold")
    assert "'single'" in str(err.value) and "'threshold'" in str(err.value)
    with pytest.raises(FileNotFoundError, match="spot-eval collect"):
        read_blocks(recorded[0] / "nowhere", "single")


def test_target_fingerprint_ties_a_drafter_to_target_and_block_length(checkpoint, tmp_path):
    fp16 = target_fingerprint(load_target(checkpoint, None), "single")
    check_fingerprint(fp16, target_fingerprint(load_target(checkpoint, None), "single"))
    with pytest.warns(UserWarning, match="differs from the checkpoint's block_size"):
        fp8 = target_fingerprint(load_target(checkpoint, 8), "single")
    with pytest.raises(ValueError, match="differs in block_length: 16 vs 8"):
        check_fingerprint(fp16, fp8)
    other = write_checkpoint(tmp_path / "other", tokenizer_vocab=65)  # another tokenizer
    with pytest.raises(ValueError, match="tokenizer_sha256"):
        check_fingerprint(fp16, target_fingerprint(load_target(other, None), "single"))


@pytest.mark.slow
def test_cli_collect_then_train_drafter(checkpoint, tmp_path, capsys):
    out, drafter = tmp_path / "traj", tmp_path / "spot.pt"
    main(["collect", "--target", str(checkpoint), "--out", str(out), "--prompts", "3", "--gen-length", str(GEN),
          "--no-chat", "--shard-size", "2", "--temperatures", "0,1.5"])
    assert json.loads(capsys.readouterr().out)["decoded"] == 3
    main(["train-drafter", "--trajectories", str(out), "--out", str(drafter), "--steps", "3", "--batch-size", "32",
          "--heldout", "0.34", "--max-depth", "2"])
    captured = capsys.readouterr()
    assert "order model parameters: 626050" in captured.err
    summary = json.loads(captured.out)
    assert summary["steps"] == 3 and len(summary["heldout_top1_by_depth"]) == 2 and summary["heldout_requests"] == 1
    loaded = load_checkpoint(drafter)
    check_fingerprint(loaded.fingerprint, target_fingerprint(load_target(checkpoint, None), "single"))
    assert loaded.metrics["heldout_top1_depth0"] == summary["heldout_top1_depth0"]
    # SPOT-gamma: fitted on the held-out requests, stored in a copy, usable as a method.
    gamma_path = tmp_path / "spot_gamma.pt"
    main(["fit-gamma", "--drafter", str(drafter), "--trajectories", str(out), "--budget", "4", "--out", str(gamma_path)])
    fit = json.loads(capsys.readouterr().out)
    assert fit["commits_per_forward"] >= fit["spot_commits_per_forward"] >= 1.0
    assert load_checkpoint(gamma_path).gamma[:8] == tuple(fit["gamma"]) and load_checkpoint(drafter).gamma is None
    # budget=auto's reach calibration: replayed on the same held-out requests, stored beside gamma.
    main(["calibrate-reach", "--drafter", str(gamma_path), "--trajectories", str(out), "--budget", "4"])
    reach = json.loads(capsys.readouterr().out)
    assert reach["trees"] > 0 and reach["nodes"] <= 4 * reach["trees"] and 0 < sum(b["count"] for b in reach["bins"]) < reach["nodes"]
    calibrated = load_checkpoint(gamma_path)
    assert calibrated.gamma[:8] == tuple(fit["gamma"]) and calibrated.reach.mean_reach[:8] == tuple(reach["mean_reach"])
    # and the stale-confidence order's temperature with its own calibration (the cheap mode)
    stale = reach["stale"]
    assert stale["trees"] > 0 and 0 <= stale["top1"] <= 1 and stale["steps"] > 0
    assert calibrated.stale.temperature == stale["temperature"] and calibrated.stale.reach.mean_reach[:8] == tuple(stale["mean_reach"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--policy", "greedy"], "unknown unmasking 'greedy'; choose one of single"),
        (["--temperatures", "0,x"], "--temperatures takes comma-separated numbers"),
        (["--prompts", "0"], "must be >= 1"),
        (["--no-chat", "--workers", "0"], "--workers (0) must be >= 1"),
        ([], "has no chat template; pass --no-chat"),
    ],
)
def test_cli_bad_input_is_one_clear_line(checkpoint, tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_:
        main(["collect", "--target", str(checkpoint), "--out", str(tmp_path / "x"), "--prompts", "2", *args])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_an_interrupted_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "new" / "graph.json"
    write_atomically(path, lambda tmp: tmp.write_text("whole"))

    def interrupted(tmp):
        tmp.write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomically(path, interrupted)
    assert path.read_text() == "whole" and [p.name for p in path.parent.iterdir()] == ["graph.json"]


def test_a_write_reaches_the_disk_before_the_rename_and_the_directory_after_it(tmp_path, monkeypatch):
    synced: list[tuple[str, bool]] = []  # (the path synced, whether the final name existed then)
    path = tmp_path / "graph.json"
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), path.exists()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    write_atomically(path, lambda tmp: tmp.write_text("whole"))
    assert synced == [(str(tmp_path / f"graph.json.{os.getpid()}.tmp"), False), (str(tmp_path), True)]


@pytest.mark.slow
def test_cli_train_refresh_chooses_spot_rc_s_order_by_its_trees_and_calibrates_auto(checkpoint, tmp_path, capsys, monkeypatch):
    """collect with hidden states, a SPOT drafter, then train-refresh: SPOT-RC's order temperature is the grid's
    best by replayed trees, both trees' reach is stored, and spot_r@auto / spot_rc@auto decode losslessly."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out, order, refresh = tmp_path / "traj", tmp_path / "spot.pt", tmp_path / "spot_r.pt"
    main(["collect", "--target", str(checkpoint), "--out", str(out), "--prompts", "4", "--gen-length", str(GEN), "--no-chat",
          "--shard-size", "2", "--temperatures", "0,1.5", "--hidden-dims", "8", "--embedding-dims", "8"])
    main(["train-drafter", "--trajectories", str(out), "--out", str(order), "--steps", "3", "--batch-size", "32", "--heldout", "0.5"])
    capsys.readouterr()
    main(["train-refresh", "--trajectories", str(out), "--order-model", str(order), "--out", str(refresh), "--steps", "5",
          "--batch-size", "32", "--heldout", "0.5", "--reach-budget", "4"])
    report = json.loads(capsys.readouterr().out)
    fit = report["reach_fit"]
    grid = dict(map(tuple, fit["order_fit"]["grid"]))
    assert grid[report["order_temperature"]] == max(grid.values()) == fit["order_fit"]["commits_per_forward"] >= 1
    assert fit["spot_r"]["trees"] > 0 and fit["spot_rc"]["trees"] > 0 and fit["heldout_blocks"] > 0
    loaded = load_refresh(refresh)
    assert loaded.stale.temperature == report["order_temperature"] and loaded.metrics["config"]["heldout_fraction"] == 0.5
    held = loaded.metrics["heldout_requests"]  # what the calibration replays: the requests training held out
    assert len(held) == 2 and fit["heldout_blocks"] == sum(1 for b in read_blocks(out, "single") if b.request in held)
    assert loaded.reach.mean_reach[:8] == tuple(fit["spot_r"]["mean_reach"])
    assert loaded.stale.reach.mean_reach[:8] == tuple(fit["spot_rc"]["mean_reach"])

    def decode(*extra: str) -> dict:
        main(["decode", "--pretrained", str(checkpoint), "--prompt", "one two three", "--gen-length", str(GEN), "--json",
              "--threads", "1", *extra])
        return json.loads(capsys.readouterr().out)

    free = decode()
    for method in ("spot_r", "spot_rc"):
        got = decode("--method", method, "--budget", "auto", "--max-budget", "4", "--drafter", str(refresh))
        assert got["token_ids"] == free["token_ids"] and 0 <= got["mean_tree_size"] <= 4, method
    # another collect's projections are not the head's: its inputs would be read on the wrong components
    other = tmp_path / "other"
    shutil.copytree(out, other)
    projections = torch.load(other / "projections.pt", weights_only=True)
    projections["hidden"]["mean"] = projections["hidden"]["mean"] + 1
    torch.save(projections, other / "projections.pt")
    with pytest.raises(SystemExit):
        main(["calibrate-reach", "--drafter", str(refresh), "--trajectories", str(other), "--budget", "4"])
    assert "on other components than" in capsys.readouterr().err
    # a split that holds out nothing is refused before training, not after it, when the calibration finds no block
    with pytest.raises(SystemExit):
        main(["train-refresh", "--trajectories", str(out), "--order-model", str(order), "--out", str(tmp_path / "x.pt"),
              "--heldout", "0"])
    assert "--heldout 0.0 holds out none of the 4 requests" in capsys.readouterr().err and not (tmp_path / "x.pt").exists()
    # the file records the widths its head was built with (the collect's), not RefreshConfig's defaults
    assert {k: loaded.metrics["config"]["head"][k] for k in ("topk", "hidden_dims", "embedding_dims")} == {
        "topk": 32, "hidden_dims": 8, "embedding_dims": 8}
    # an order model reading another top-k than the collect recorded: the head would refresh candidates it never saw
    from spot_eval.training import train_refresh as command

    real = command.load_checkpoint
    monkeypatch.setattr(command, "load_checkpoint", lambda path: replace(real(path), config=replace(real(path).config, topk=16)))
    with pytest.raises(SystemExit):
        main(["train-refresh", "--trajectories", str(out), "--order-model", str(order), "--out", str(tmp_path / "x.pt")])
    assert "records the top 32 log-probabilities a position, but the order model" in capsys.readouterr().err
    assert not (tmp_path / "x.pt").exists()
