"""`spot-eval decode`: the JSON contract other issues rely on, and bad input without tracebacks.

The commands run in-process through `spot_eval.cli.main` (what the console script calls), one through the
real `spot-eval` console script."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli, write_checkpoint

OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
CONSOLE_SCRIPT = str(Path(sys.executable).parent / "spot-eval")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return str(write_checkpoint(tmp_path_factory.mktemp("cli") / "ckpt"))


DECODE = ("decode", "--prompt", "t1 t2 t3 t4 t5", "--gen-length", "40", "--json")


def decode(capsys, checkpoint: str, *extra: str) -> dict:
    run = run_cli(capsys, *DECODE, "--target", checkpoint, *extra)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.mark.slow
def test_decode_prints_the_json_contract_and_methods_agree(checkpoint, capsys):
    sampled = ("--temperature", "1.0", "--seed", "4", "--unmasking", "threshold", "--threshold", "0.5")
    console = subprocess.run([CONSOLE_SCRIPT, *DECODE, "--target", checkpoint, *sampled], capture_output=True, text=True,
                             env=OFFLINE, timeout=300)
    assert console.returncode == 0, console.stderr
    reference = json.loads(console.stdout)
    in_process = decode(capsys, checkpoint, *sampled)  # what the console script runs, in this process
    for key in ("text", "token_ids", "forwards", "commit_steps", "accepted_lengths"):
        assert in_process[key] == reference[key], key
    for key in ("text", "token_ids", "forwards", "commit_steps", "seconds", "accepted_lengths"):
        assert key in reference
    assert reference["method"] == "draft_free" and reference["forwards"] == len(reference["accepted_lengths"])
    # The steps taken, and beside them the "steps" setting (unset here), which once overwrote them in this JSON.
    assert reference["commit_steps"] == reference["forwards"] and reference["steps"] is None
    oracle = decode(capsys, checkpoint, "--temperature", "1.0", "--seed", "4", "--unmasking", "threshold", "--threshold", "0.5",
                    "--method", "oracle", "--budget", "8")
    assert oracle["token_ids"] == reference["token_ids"] and oracle["text"] == reference["text"]
    assert oracle["forwards"] < reference["forwards"] and oracle["commit_steps"] == reference["commit_steps"]
    exact = decode(capsys, checkpoint, "--temperature", "1.0", "--seed", "4", "--unmasking", "threshold", "--threshold", "0.5",
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
        (["--unmasking", "greedy"], "unknown unmasking 'greedy'; choose one of single"),
        (["--chat"], "--chat needs a chat template"),
        (["--gen-length", "1000"], "needs 1008 positions"),
    ],
)
def test_bad_input_is_one_clear_line(checkpoint, capsys, args, message):
    run = run_cli(capsys, "decode", "--target", checkpoint, "--prompt", "t1 t2", *args)
    assert run.returncode == 2
    assert message in run.stderr and "Traceback" not in run.stderr



HEAVY = ("torch", "transformers", "mlflow", "lm_eval", "accelerate")


@pytest.mark.parametrize("argv", [["--help"], ["decode", "--help"], ["decode", "--prompt", "hi", "--temperature", "-1"],
                                  ["decode", "--prompt", "hi", "--budget", "many"], ["decode", "--prompt", "hi", "--top-p", "2"]])
def test_help_and_refusals_come_before_torch_loads(argv):
    """--help and a flag wrong whatever the checkpoint are answered from the settings' classes alone: none of the
    heavy packages (seconds to import) load first (bench/cli_latency.py times it)."""
    code = ("import sys\nfrom spot_eval.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as end:\n"
            f"    print(end.code, sorted(m for m in {HEAVY!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines()[-1] == f"{0 if argv[-1] == '--help' else 2} []", done.stdout[-300:] + done.stderr
    assert argv[-1] == "--help" or done.stderr.startswith("error: ")

def test_a_missing_target_is_named(tmp_path, capsys):
    run = run_cli(capsys, "decode", "--target", str(tmp_path / "none"), "--prompt", "x")
    assert run.returncode == 2 and "is not a directory" in run.stderr


def test_decode_takes_the_reference_rules(checkpoint, capsys):
    """--confidence and --no-stop-at-eos reach the decoder, and an oracle drafter under them is lossless."""
    written = decode(capsys, checkpoint, "--confidence", "margin", "--no-stop-at-eos")
    assert written["stop_at_eos"] is False and written["confidence"] == "margin"
    assert len(written["token_ids"]) == 40  # every block, to --gen-length
    oracle = decode(capsys, checkpoint, "--confidence", "margin", "--no-stop-at-eos", "--method", "oracle", "--budget", "4")
    assert oracle["token_ids"] == written["token_ids"] and oracle["forwards"] < written["forwards"]
    entropy = decode(capsys, checkpoint, "--confidence", "entropy")
    assert entropy["stop_at_eos"] is True and entropy["confidence"] == "entropy"
    bad = run_cli(capsys, *DECODE, "--target", checkpoint, "--confidence", "low")
    assert bad.returncode == 2 and "unknown confidence 'low'; choose one of probability, margin, entropy, random" in bad.stderr


def test_a_trained_drafter_under_another_rule_is_said_once_and_stays_lossless(capsys):
    """The shipped SPOT drafter (trained under the default rule) on the embedded target under margin confidence
    and the mask in the softmax: one warning naming the rule; the tokens are the draft-free decoder's."""
    rule = ("--prompt", "What is 2 + 3?", "--chat", "--gen-length", "32", "--json", "--confidence", "margin", "--mask-in-softmax")
    free = run_cli(capsys, "decode", *rule)
    assert free.returncode == 0 and "decoding rule" not in free.stderr
    spot = run_cli(capsys, "decode", *rule, "--method", "spot", "--budget", "4")
    assert spot.returncode == 0 and json.loads(spot.stdout)["token_ids"] == json.loads(free.stdout)["token_ids"]
    said = [line for line in spot.stderr.splitlines() if "decoding rule" in line]
    assert len(said) == 1 and re.search(r"spot@4: its drafter was trained on trajectories of the default decoding rule .* "
                                        r"confidence=margin, mask_in_softmax=True\. The output is still exactly", said[0])
