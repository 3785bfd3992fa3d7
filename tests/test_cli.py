"""`spot-eval decode`: the JSON contract other issues rely on, and bad input without tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import write_checkpoint

OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def spot_eval(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "spot_eval.cli", *args], capture_output=True, text=True, env=OFFLINE, timeout=300
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return str(write_checkpoint(tmp_path_factory.mktemp("cli") / "ckpt"))


def decode(checkpoint: str, *extra: str) -> dict:
    run = spot_eval("decode", "--target", checkpoint, "--prompt", "t1 t2 t3 t4 t5", "--gen-length", "40", "--json", *extra)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_decode_prints_the_json_contract_and_methods_agree(checkpoint):
    reference = decode(checkpoint, "--temperature", "1.0", "--seed", "4", "--unmasking", "threshold", "--threshold", "0.5")
    for key in ("text", "token_ids", "forwards", "steps", "seconds", "accepted_lengths"):
        assert key in reference
    assert reference["method"] == "draft_free" and reference["forwards"] == len(reference["accepted_lengths"])
    oracle = decode(checkpoint, "--temperature", "1.0", "--seed", "4", "--unmasking", "threshold", "--threshold", "0.5",
                    "--method", "oracle", "--budget", "8")
    assert oracle["token_ids"] == reference["token_ids"] and oracle["text"] == reference["text"]
    assert oracle["forwards"] < reference["forwards"]
    exact = decode(checkpoint, "--temperature", "1.0", "--seed", "4", "--unmasking", "threshold", "--threshold", "0.5",
                   "--method", "oracle", "--budget", "8", "--exact")
    assert exact["exact"] is True and reference["exact"] is False
    assert exact["token_ids"] == reference["token_ids"]  # fp32: the layouts agree on this tiny target


@pytest.mark.parametrize(
    "args, message",
    [
        (["--method", "nope"], "unknown method 'nope'"),
        (["--method", "random", "--budget", "-1"], "needs --budget >= 1"),
        (["--budget", "3"], "takes no budget"),
        (["--method", "spot", "--budget", "4", "--drafter", "/nowhere.pt"], "does not exist"),
        (["--temperature", "-1"], "temperature must be >= 0"),
        (["--unmasking", "greedy"], "unknown unmasking policy 'greedy'"),
        (["--chat"], "--chat needs a chat template"),
        (["--gen-length", "1000"], "needs 1008 positions"),
    ],
)
def test_bad_input_is_one_clear_line(checkpoint, args, message):
    run = spot_eval("decode", "--target", checkpoint, "--prompt", "t1 t2", *args)
    assert run.returncode == 2
    assert message in run.stderr and "Traceback" not in run.stderr


def test_a_missing_target_is_named(tmp_path):
    run = spot_eval("decode", "--target", str(tmp_path / "none"), "--prompt", "x")
    assert run.returncode == 2 and "is not a directory" in run.stderr
