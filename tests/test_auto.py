"""budget=auto through the harness: the cached verify-cost profile, the reach calibration in the drafter
checkpoint, `spot@auto` in methods, and `spot-eval decode --budget auto` / `spot-eval profile`."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from conftest import existing_store, own_cache_home, run_cli, run_lm_eval_here, tiny_qwen3, write_checkpoint
from mlflow import MlflowClient

from spot.cost import measure_verify, probe_contexts
from spot.drafters.order_model import OrderModel
from spot.drafters.reach import ReachCalibration, ReachMap
from spot.drafters.stale import StaleOrder
from spot_eval.checkpoints import shipped
from spot_eval.checkpoints.drafter import load_checkpoint, save_checkpoint
from spot_eval.checkpoints.fingerprint import target_fingerprint
from spot_eval.checkpoints.shipped import EMBEDDED_TARGET, shipped_drafter
from spot_eval.checkpoints.target import load_target
from spot_eval.harness import profile as profile_module
from spot_eval.harness.methods import MethodSpec, build_drafter, parse_methods
from spot_eval.harness.profile import Profile, profile_key, verify_profile

REPO = Path(__file__).resolve().parent.parent
REACH = ReachCalibration((1, 2), (ReachMap((-1.0, 0.0), (0.4, 0.9)), ReachMap((-3.0, 0.0), (0.05, 0.5))), (0.8, 0.5, 0.3))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    calls = []

    def counted(*args, **kwargs):
        calls.append(args)
        return measure_verify(*args, **kwargs, repeats=1)

    monkeypatch.setattr(profile_module, "measure_verify", counted)
    return calls


def test_the_probe_measures_a_bounded_grid(tmp_path):
    target = load_target(write_checkpoint(tmp_path / "ckpt"), None)
    contexts = probe_contexts(target)
    assert contexts[0] == target.block_length and contexts[-1] % target.block_length == 0
    cost = measure_verify(target, contexts, pieces=(1, 2, 5), repeats=1)
    assert cost.pieces == (1, 2, 5) and len(cost.seconds) == len(contexts)
    assert cost(3, contexts[0]) > 0


@pytest.mark.filterwarnings("ignore:decode block length 8 differs")
def test_the_profile_is_measured_once_then_read_back_until_the_target_changes(tmp_path, cache, caplog):
    path = write_checkpoint(tmp_path / "ckpt")
    target = load_target(path, None)
    with caplog.at_level(logging.WARNING, "spot_eval"):
        first = verify_profile(target)
    assert len(cache) == 1 and "measuring the verify cost" in caplog.text  # the one-line notice
    again = verify_profile(load_target(path, None))
    assert len(cache) == 1 and again == first  # read back: same key, same numbers
    assert Profile.from_dict(json.loads(json.dumps(first.to_dict()))) == first
    # Another dtype, layout or block length is another key: measured anew.
    for other in (load_target(path, None, dtype=torch.bfloat16), load_target(path, None, exact=True), load_target(path, 8)):
        assert profile_key(other) != first.key
        verify_profile(other)
    assert len(cache) == 4
    # Another device is another key: on a CPU the thread count is part of the device.
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert profile_key(target).device != first.key.device
    finally:
        torch.set_num_threads(threads)
    # Other weights (a retrained target) are another key too.
    retrained = write_checkpoint(tmp_path / "other", model=tiny_qwen3(seed=1))
    assert profile_key(load_target(retrained, None)).target != first.key.target


def test_a_damaged_profile_is_measured_again(tmp_path, cache, caplog):
    target = load_target(write_checkpoint(tmp_path / "ckpt"), None)
    verify_profile(target)
    (file,) = (tmp_path / "cache" / "spot-eval" / "profiles").iterdir()
    file.write_text("{not json")
    with caplog.at_level(logging.WARNING, "spot_eval"):
        verify_profile(target)
    assert len(cache) == 2 and "unreadable" in caplog.text
    assert Profile.from_dict(json.loads(file.read_text())).key == profile_key(target)


def test_the_reach_calibration_rides_in_the_drafter_checkpoint(tmp_path):
    path = tmp_path / "d.pt"
    save_checkpoint(path, OrderModel(), {"model": "m", "tokenizer_sha256": "t", "weights_digest": "w", "block_length": 16,
                                         "policy": "single"}, {}, reach=REACH, stale=StaleOrder(0.2, REACH))
    loaded = load_checkpoint(path)
    assert loaded.reach == REACH and loaded.stale == StaleOrder(0.2, REACH)
    for key, value, message in [("stale", {"temperature": -1.0}, "stale order is malformed"),
                                ("reach", {"ranks": [1], "maps": [{"scores": [0.0]}]}, "reach calibration is malformed")]:
        raw = torch.load(path, weights_only=True)
        raw[key] = value
        torch.save(raw, path)
        with pytest.raises(ValueError, match=message):
            load_checkpoint(path)


@pytest.mark.parametrize(
    ("methods", "budgets", "specs"),
    [
        ("spot@auto", "", [MethodSpec("spot", 20, None, auto=True)]),
        ("spot+spiffy@3", "8+auto", [MethodSpec("spot", 8), MethodSpec("spot", 20, None, auto=True), MethodSpec("spiffy", 3)]),
        ("spot_gamma@auto:x.pt", "", [MethodSpec("spot_gamma", 20, "x.pt", auto=True)]),
    ],
)
def test_auto_methods_parse(methods, budgets, specs):
    assert parse_methods(methods, budgets) == specs
    assert [s.label for s in specs if s.auto] == [f"{s.name}@auto" for s in specs if s.auto]


def test_auto_is_refused_for_a_drafter_without_reach(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="random@auto.*budget auto needs calibrated reach.*random@3"):
        parse_methods("random@auto", "")
    assert parse_methods("spot@auto", "", max_budget=5)[0].budget == 5
    assert parse_methods("spiffy@auto", "") == [MethodSpec("spiffy", 20, None, auto=True)]
    # A drafter checkpoint without a calibration, and a hand-made Spiffy graph without counts.
    target = load_target(write_checkpoint(tmp_path / "ckpt"), None)
    bare = tmp_path / "bare.pt"
    save_checkpoint(bare, OrderModel(), target_fingerprint(target, "single"), {})
    with pytest.raises(ValueError, match="holds no reach calibration.*calibrate-reach"):
        build_drafter(MethodSpec("spot", 20, str(bare), auto=True), target, "single")
    graph = tmp_path / "graph.json"
    graph.write_text(json.dumps({"format": "spiffy-graph/1", "target": target_fingerprint(target, "single"),
                                 "block_length": 16, "nodes": [{"id": 0, "commits": [], "parents": []},
                                                               {"id": 1, "commits": [[0, 0]], "parents": [0]}],
                                 "declared_nodes": 1}))
    with pytest.raises(ValueError, match="hand-made graph without calibration counts"):
        build_drafter(MethodSpec("spiffy", 20, str(graph), auto=True), target, "single")
    # A SPOT-R file without one: the fix is to calibrate it on its collect, or, for a file whose collect does not
    # ship (a shipped one), to train one
    embedded, uncalibrated = load_target(EMBEDDED_TARGET, None), tmp_path / "spot_r_b32.pt"
    raw = torch.load(shipped_drafter("spot_r", 32), weights_only=True)
    torch.save({**raw, "reach": None, "stale": {**raw["stale"], "reach": None}}, uncalibrated)
    with pytest.raises(ValueError, match=r"no reach calibration of spot_rc's trees.*calibrate-reach --drafter .*spot_rc@8"):
        build_drafter(MethodSpec("spot_rc", 20, str(uncalibrated), auto=True), embedded, "single")
    monkeypatch.setattr(shipped, "DRAFTERS", tmp_path)
    with pytest.raises(ValueError, match=r"no reach calibration of spot_r's trees.*train one for budget=auto.*spot_r@8"):
        build_drafter(MethodSpec("spot_r", 20, str(uncalibrated), auto=True), embedded, "single")


@pytest.mark.slow
def test_decode_budget_auto_and_the_profile_command(tmp_path, capsys, monkeypatch):
    """The shipped block-32 drafters carry a calibration; decode sizes each tree from this machine's profile."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    shown = run_cli(capsys, "profile", "--threads", "1")
    assert shown.returncode == 0, shown.stderr
    profile = json.loads(shown.stdout)
    assert profile["key"]["block_length"] == 32 and profile["verify"]["pieces"][0] == 1 and Path(profile["file"]).is_file()
    assert "measuring the verify cost" in shown.stderr
    run = run_cli(capsys, "decode", "--method", "spot", "--budget", "auto", "--prompt", "What is 2 + 3?", "--chat",
                  "--gen-length", "64", "--json", "--threads", "1")
    assert run.returncode == 0, run.stderr
    assert "measuring" not in run.stderr  # the cached profile
    result = json.loads(run.stdout)
    assert result["budget"] == "auto" and result["max_budget"] == 20 and 0 <= result["mean_tree_size"] <= 20
    reference = run_cli(capsys, "decode", "--prompt", "What is 2 + 3?", "--chat", "--gen-length", "64", "--json", "--threads", "1")
    assert json.loads(reference.stdout)["token_ids"] == result["token_ids"]
    for method in ("spot_r", "spot_rc"):  # the shipped SPOT-R file carries the calibrations of both its trees
        refreshed = run_cli(capsys, "decode", "--method", method, "--budget", "auto", "--prompt", "What is 2 + 3?", "--chat",
                            "--gen-length", "64", "--json", "--threads", "1")
        assert refreshed.returncode == 0, refreshed.stderr
        assert json.loads(refreshed.stdout)["token_ids"] == result["token_ids"], method
    bad = run_cli(capsys, "decode", "--method", "random", "--budget", "auto", "--prompt", "x")
    assert bad.returncode == 2 and "--budget auto needs a drafter with calibrated reach" in bad.stderr


@pytest.mark.slow
def test_lm_eval_runs_spot_at_auto(tmp_path, capsys):
    """lm_eval --model spot: spot@auto is lossless, its tree sizes and the profile are recorded, and
    MLflow holds them."""
    checkpoint = write_checkpoint(tmp_path / "ckpt")
    existing_store(tmp_path)  # the run's default store, ./mlflow.db
    drafter = tmp_path / "spot.pt"
    torch.manual_seed(0)
    save_checkpoint(drafter, OrderModel(), target_fingerprint(load_target(checkpoint, None), "single"), {},
                    reach=ReachCalibration((1,), (ReachMap((-2.0, 0.0), (0.3, 0.95)),), (0.9, 0.8, 0.7, 0.6)))
    args = f"pretrained={checkpoint},methods=spot@auto:{drafter},max_budget=6,gen_length=32,device=cpu,output_dir={tmp_path / 'run'}"
    run = run_lm_eval_here(capsys, "--model", "spot", "--model_args", args, "--tasks", "spot_gsm8k", "--include_path",
                           str(REPO / "tasks"), "--limit", "2", cwd=tmp_path, env={"XDG_CACHE_HOME": str(own_cache_home(tmp_path))})
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stderr.count("measuring the verify cost") == 1
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").open()]
    auto = [s for s in samples if s["label"] == "spot@auto"]
    assert len(auto) == 2 and all(s["lossless"] and s["auto"] and s["budget"] == 6 for s in auto)
    assert all(0 <= s["mean_tree_size"] <= 6 and s["mean_tree_size"] == s["draft_nodes"] / len(s["accepted_lengths"]) for s in auto)
    run_json = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run_json["profile"]["key"]["block_length"] == 16 and min(run_json["profile"]["drafter_seconds"]["spot@auto"]["model"].values()) > 0
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    [parent] = client.search_runs([client.get_experiment_by_name("spot-eval").experiment_id], "tags.mlflow.runName = 'spot-eval'")
    assert parent.data.params["profile/key/dtype"] == "float32"
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    metrics = {c.info.run_name: c.data.metrics for c in children}["spot@auto"]
    assert 0 <= metrics["spot_gsm8k/mean_tree_size"] <= 6
