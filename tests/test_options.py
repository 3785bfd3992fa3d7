"""One source for every setting (spot_eval.harness.options): the fields of DecodeConfig and the settings classes
make lm_eval's model_args, spot-eval's flags and the model_args reference, and nothing else lists them."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spot import DecodeConfig, Sampling
from spot_eval.cli import build_parser
from spot_eval.harness.model_args import GROUPS, OPTIONS, SpotArgs
from spot_eval.harness.options import build, options, parse, values_of
from spot_eval.harness.settings import TargetSettings

ROOT = Path(__file__).resolve().parent.parent

# What the child prints: a field added to DecodeConfig's source, seen by each front door.
FRONT_DOORS = """
import contextlib, io, json, sys
sys.path.insert(0, {docs!r})
import generate
from spot_eval.cli import build_parser
from spot_eval.harness.model_args import SpotArgs

out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
    build_parser().parse_args(["decode", "--help"])
flag = build_parser().parse_args(["decode", "--prompt", "x", "--knob", "0.5"]).knob
try:
    SpotArgs.parse({{"knob": "many"}})
    refused = ""
except ValueError as err:
    refused = str(err)
print(json.dumps({{"help": out.getvalue(), "flag": flag, "parsed": SpotArgs.parse({{"knob": "0.75"}}).decode_config(32).knob,
                  "default": SpotArgs().decode_config(32).knob, "refused": refused, "page": generate.model_args_page()}}))
"""


def test_a_field_added_to_the_decoder_config_reaches_every_front_door(tmp_path):
    """Add one field to DecodeConfig's source and edit nothing else: `spot-eval decode --help` shows its flag, the flag
    parses, model_args parse and check it and it reaches the DecodeConfig, and the generated reference has its row."""
    shutil.copytree(ROOT / "spot", tmp_path / "spot", ignore=shutil.ignore_patterns("__pycache__"))
    config = tmp_path / "spot" / "config.py"
    anchor = "    alg_temp: float = setting("
    assert anchor in config.read_text()
    config.write_text(config.read_text().replace(anchor, '    knob: float = setting(0.25, "a knob a test added")\n' + anchor))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # the copy of spot/ with the field, before the installed one
    run = subprocess.run([sys.executable, "-c", FRONT_DOORS.format(docs=str(ROOT / "docs"))], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=300)  # not the checkout: "-c" puts the cwd first
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout)
    assert "--knob KNOB" in seen["help"] and "a knob a test added (default: 0.25)" in " ".join(seen["help"].split())
    assert seen["flag"] == 0.5
    assert (seen["parsed"], seen["default"]) == (0.75, 0.25)
    assert seen["refused"] == "knob='many' is not a number"
    assert "| `knob` | `float` | `0.25` | a knob a test added. |" in seen["page"]


def test_the_command_line_writes_no_setting_flag_by_hand():
    """Every flag of a decoder or target setting comes from add_flags: cli.py spells none out, but for the training
    commands' own --seed, --steps and --device (a training seed, optimizer steps, where to train)."""
    source = (ROOT / "spot_eval" / "cli.py").read_text()
    settings = options(DecodeConfig) + options(TargetSettings)
    flags = {flag for o in settings for flag in (o.flag, *(f"--{a.replace('_', '-')}" for a in o.setting.aliases))}
    assert {"--unmasking", "--temperature", "--pretrained"} <= flags
    assert set(re.findall(r'add_argument\(\s*"(--[\w-]+)"', source)) & flags == {"--seed", "--steps", "--device"}
    decode = next(a for a in build_parser()._actions if a.dest == "command").choices["decode"]
    helps = {flag: action.help for action in decode._actions for flag in action.option_strings}
    assert [o.name for o in settings if not helps[o.flag].startswith(o.help)] == []


def test_model_args_are_the_options_of_the_settings_classes_in_order():
    names = [o.name for _, cls in GROUPS for o in options(cls)]
    assert [f.name for f in dataclasses.fields(SpotArgs)] == names == [o.name for o in OPTIONS]
    assert {"unmasking", "temperature", "top_k", "device", "methods", "output_dir"} <= set(names)
    assert "policy" not in names and "budget" not in names and "stop_strings" not in names  # named, or set by the program


def test_a_config_round_trips_through_its_option_values():
    config = DecodeConfig(policy="threshold", threshold=0.7, block_length=16, gen_length=40, seed=9, cross_block=True,
                          sampling=Sampling(temperature=1.0, top_k=5, top_p=0.9), confidence="margin")
    values = values_of(config, options(DecodeConfig))
    assert values["unmasking"] == "threshold" and values["temperature"] == 1.0 and values["top_k"] == 5
    assert build(DecodeConfig, values) == config


def test_model_args_are_typed_and_checked_by_name():
    args = SpotArgs.parse({"unmasking": "dynamic", "temperature": "1", "top_k": 4.0, "exact": "yes", "steps": "8"})
    config = args.decode_config(32)
    assert (config.policy, config.sampling.temperature, config.sampling.top_k, config.steps) == ("dynamic", 1.0, 4, 8)
    assert args.part(TargetSettings) == TargetSettings(exact=True)
    assert args.decode_config(16).block_length == 16 and SpotArgs.parse({"block_length": "8"}).block_length == 8
    with pytest.raises(ValueError, match=r"unknown model_args policy; known: .*unmasking"):
        parse(OPTIONS, {"policy": "threshold"})  # the field's name is not the option's
