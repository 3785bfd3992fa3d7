"""Bad input never costs a run: one `error:` line, exit status 2, no traceback, and (where the input can
be checked without the weights) no model loaded and no MLflow run opened.

The `spot-eval` forms run in-process through `spot_eval.cli.main`; the `lm_eval --model spot` forms build
`SpotLM` in-process (the error reaches lm-eval's command line as the ValueError below, which the start-up
hook turns into one line; the hook is run in-process too, and one real `lm_eval` run checks the whole path).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import write_checkpoint

from spot.targets.block_causal import BlockCausalTarget
from spot_eval.checkpoints.shipped import shipped_drafter
from spot_eval.cli import main
from spot_eval.harness import lm
from spot_eval.harness.settings import AUTO_CAP, parse_batch_size, resolve_batch_size, resolve_device
from spot_eval.tracking.store import check_uri

SPIFFY_GRAPH = str(shipped_drafter("spiffy", 32))
SPOT_CHECKPOINT = str(shipped_drafter("spot", 32))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    """A tiny block-16 checkpoint without a chat template."""
    return str(write_checkpoint(tmp_path_factory.mktemp("bad") / "ckpt"))


@pytest.fixture
def no_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model loaded before the bad input was found")

    monkeypatch.setattr(BlockCausalTarget, "from_pretrained", refuse)
    monkeypatch.setattr(lm, "open_tracker", refuse)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


DECODE = ["decode", "--prompt", "x"]
# (arguments, part of the message): checked before the model loads.
CLI_CASES = [
    ([*DECODE, "--temperature", "inf"], "temperature must be a finite number, got inf"),
    ([*DECODE, "--temperature", "nan"], "temperature must be a finite number, got nan"),
    ([*DECODE, "--temperature", "abc"], "argument --temperature: invalid float value: 'abc'"),
    ([*DECODE, "--temperature", "-1"], "temperature must be >= 0"),
    ([*DECODE, "--top-k", "2.5"], "argument --top-k: invalid int value: '2.5'"),
    ([*DECODE, "--top-k", "-3"], "top_k must be >= 0"),
    ([*DECODE, "--top-p", "0"], "top_p must be in (0, 1]"),
    ([*DECODE, "--top-p", "1.5"], "top_p must be in (0, 1]"),
    ([*DECODE, "--threshold", "1.5"], "threshold must be in (0, 1]"),
    ([*DECODE, "--threshold", "nan"], "threshold must be a finite number"),
    ([*DECODE, "--device", "foo"], "--device='foo' is not a device; use auto, cpu, cuda or cuda:N"),
    ([*DECODE, "--device", "mps"], "--device='mps': spot decodes on cpu or cuda devices"),
    ([*DECODE, "--device", "cuda"], "--device='cuda' but this torch has no usable CUDA; use --device=cpu"),
    ([*DECODE, "--method", "random", "--budget", "-1"], "needs --budget >= 1"),
    ([*DECODE, "--budget", "abc"], "--budget must be a whole number or auto, got 'abc'"),
    ([*DECODE, "--method", "random", "--budget", "auto"], "--budget auto needs a drafter with calibrated reach probabilities"),
    ([*DECODE, "--method", "spot", "--budget", "auto", "--max-budget", "0"], "--max-budget must be >= 1, got 0"),
    ([*DECODE, "--block-length", "16.5"], "argument --block-length: invalid int value: '16.5'"),
    ([*DECODE, "--block-length", "0"], "block_length must be >= 1"),
    ([*DECODE, "--gen-length", "0"], "gen_length must be >= 1"),
    ([*DECODE, "--method", "spot", "--budget", "4", "--drafter", SPIFFY_GRAPH],
     "is not an order-model checkpoint (.pt, spot-eval train-drafter), which method spot reads"),
    ([*DECODE, "--method", "spiffy", "--budget", "3", "--drafter", SPOT_CHECKPOINT],
     "is not a Spiffy graph (.json, spot-eval spiffy-calibrate), which method spiffy reads"),
    ([*DECODE, "--block-length", "7", "--method", "spot", "--budget", "4"],
     "no spot drafter ships for block length 7 under policy single (shipped policies: single, threshold): train one "
     "for this target (spot-eval collect, then train-drafter) and pass it (lm_eval: methods=spot:PATH; spot-eval decode: --drafter PATH)"),
    ([*DECODE, "--method", "sets", "--budget", "8"],
     "no sets drafter ships for block length 32 under policy single (shipped policies: threshold)"),
    ([*DECODE, "--method", "spot", "--budget", "8", "--unmasking", "dynamic"],
     "no spot drafter ships for block length 32 under policy dynamic (shipped policies: single, threshold)"),
    ([*DECODE, "--method", "spot", "--budget", "4", "--drafter", "/nowhere.pt"], "spot drafter file /nowhere.pt does not exist"),
    ([*DECODE, "--seed", "4294967296"], "seed must be in [0, 2**32), got 4294967296"),
    ([*DECODE, "--seed", "-1"], "seed must be in [0, 2**32), got -1"),
    ([*DECODE, "--method", "nope"], "unknown method 'nope'"),
    ([*DECODE, "--budget", "3"], "method draft_free takes no budget or --drafter"),
    ([*DECODE, "--unmasking", "greedy"], "unknown unmasking 'greedy'; choose one of single"),
    ([*DECODE, "--target", "/nowhere"], "--pretrained /nowhere is not a directory, nor a hub id"),
    (["collect", "--out", "x", "--prompts", "0"], "--prompts (0), --shard-size (32), --topk (32) and --workers (1) must be >= 1"),
    (["collect", "--out", "x", "--prompts", "2", "--workers", "0"], "--workers (0) must be >= 1"),
    (["collect", "--out", "x", "--prompts", "2", "--temperatures", "a,b"], "--temperatures takes comma-separated numbers"),
    (["collect", "--out", "x", "--prompts", "2", "--seed", "4294967296"], "seed must be in [0, 2**32)"),
    (["collect", "--out", "x", "--prompts", "2", "--policy", "greedy"], "unknown unmasking 'greedy'; choose one of single"),
    (["collect", "--out", "x", "--prompts", "2", "--hidden-dims", "-1"], "--hidden-dims (-1) must be >= 0 and --embedding-dims (32) >= 1"),
    (["train-drafter", "--trajectories", "/nowhere", "--out", "x.pt"], "/nowhere holds no trajectories"),
    (["train-refresh", "--trajectories", "/nowhere", "--order-model", "o.pt", "--out", "x.pt", "--steps", "0"],
     "steps (0) and batch_size (512) must be >= 1"),
    (["train-refresh", "--trajectories", "/nowhere", "--order-model", "o.pt", "--out", "x.pt"], "/nowhere holds no trajectories"),
    (["train-refresh", "--trajectories", "/nowhere", "--order-model", "o.pt", "--out", "x.pt", "--order-temperature", "0"],
     "--order-temperature must be positive, got 0.0; leave it out to fit one"),
    (["train-refresh", "--trajectories", "/nowhere", "--order-model", "o.pt", "--out", "x.pt", "--reach-budget", "0"],
     "--reach-budget (0) and --max-blocks (200) must be >= 1"),
    (["calibrate-reach", "--drafter", "x.pt", "--trajectories", "/nowhere", "--order-temperature", "0"],
     "--order-temperature must be positive, got 0.0; leave it out to choose one"),
    (["calibrate-reach", "--drafter", "x.pt", "--trajectories", "/nowhere", "--max-blocks", "0"], "--max-blocks must be >= 1, got 0"),
    (["fit-gamma", "--drafter", "x.pt", "--trajectories", "/nowhere", "--budget", "0"], "--budget must be >= 1, got 0"),
    (["spiffy-calibrate", "--out", "g.json", "--prompts", "0"], "--prompts (0), --max-nodes (10), --max-depth (6) and --topk (8) must be >= 1"),
    (["spiffy-calibrate", "--out", "g.json", "--seed", "-5"], "seed must be in [0, 2**32)"),
    (["nightly", "--suite", "/nowhere.toml"], "suite file /nowhere.toml does not exist"),
    (["nightly", "--tracking-uri", "garbage"], "--tracking-uri='garbage' is not a tracking URI that MLflow can open"),
    (["compare", "--experiment", "e", "--tracking-uri", "garbage"], "--tracking-uri='garbage' is not a tracking URI"),
    (["sync", "--tracking-uri", "htps://x"], "--tracking-uri='htps://x' is not a tracking URI"),
    (["compare"], "compare needs --experiment NAME (MLflow) or --results FILE..."),
    (["train-target", "--out", "t", "--steps", "0"], "steps must be >= 1, got 0"),
    (["nonsense"], "argument command: invalid choice: 'nonsense'"),
    ([*DECODE, "--threads", "0"], "--threads must be >= 1, got 0"),
    ([*DECODE, "--method", "spot", "--budget", "1000000000"], "spot@1000000000 needs 1000000001 pieces"),
    (["collect", "--out", "x", "--prompts", "2", "--threads", "0"], "--threads must be >= 1, got 0"),
]


@pytest.mark.parametrize(("args", "message"), CLI_CASES, ids=[" ".join(a[:1] + a[3:])[:60] for a, _ in CLI_CASES])
def test_the_command_line_refuses_bad_input_before_loading(args, message, capsys, no_load, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as end:
        main(args)
    assert end.value.code == 2
    assert message in one_error_line(capsys)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--chat"], "--chat needs a chat template, and the tokenizer of"),
        (["--gen-length", "1000"], "needs 1008 positions (whole blocks of 16); the model has 512"),
    ],
)
def test_what_only_the_loaded_model_can_tell_is_one_line_too(tiny, args, message, capsys):
    with pytest.raises(SystemExit) as end:
        main(["decode", "--target", tiny, "--prompt", "t1 t2", *args])
    assert end.value.code == 2 and message in one_error_line(capsys)


# (model_args as lm-eval hands them over, part of the message). lm-eval coerces numbers: `budgets=-1`
# arrives as -1.0 and `top_k=2.5` as 2.5; everything else as a string.
LM_CASES = [
    ({"temperature": "inf"}, "temperature must be a finite number, got inf"),
    ({"temperature": "abc"}, "temperature='abc' is not a number"),
    ({"temperature": -0.5}, "temperature must be >= 0"),
    ({"top_k": 2.5}, "top_k=2.5 is not a whole number"),
    ({"top_p": 0}, "top_p must be in (0, 1]"),
    ({"threshold": 2}, "threshold must be in (0, 1]"),
    ({"confidence": "low"}, "unknown confidence 'low'; choose one of probability, margin, entropy, random"),
    ({"stop_at_eos": "maybe"}, "stop_at_eos='maybe' is not a boolean; write stop_at_eos=true or stop_at_eos=false"),
    ({"mask_in_softmax": "perhaps"}, "mask_in_softmax='perhaps' is not a boolean"),
    ({"first_token_commit": 2}, "first_token_commit=2 is not a boolean"),
    ({"alg_temp": -1}, "alg_temp must be >= 0 (0 = the most confident positions), got -1"),
    ({"alg_temp": 0.5}, "alg_temp applies to the timestep policy with a confidence other than random"),
    ({"unmasking": "timestep", "steps": 0}, "steps must be in [1, block_length = 32], got 0"),
    ({"unmasking": "threshold", "capped": "true"}, "capped needs steps: a step commits at most block_length / steps"),
    ({"capped": "true", "steps": 4}, "capped caps the threshold policy's steps (Fast-dLLM's Dream confidence_threshold), "
                                     "not policy 'single'"),
    ({"confidence_dtype": "bf16"}, "unknown confidence_dtype 'bf16'; choose one of float64, model"),
    ({"eps": 0.5}, "eps sets the timestep policy's schedule (Dream's), not policy 'single''s; drop eps"),
    ({"tie_break": "rightmost"}, "unknown tie_break 'rightmost'; choose one of leftmost, topk"),
    ({"cfg_scale": 1.5}, "cfg_scale=1.5: LLaDA's classifier-free guidance, which spot-eval does not run (every step would "
                         "need a second forward with the prompt masked out); drop cfg_scale"),
    ({"logits_eos_inf": "true"}, "logits_eos_inf=true: LLaDA's ban of the EOS token from every step, which spot-eval does "
                                 "not run; drop logits_eos_inf (LLaDA's default, false, is what spot-eval decodes)"),
    ({"confidence_eos_eot_inf": "yes"}, "confidence_eos_eot_inf=yes: LLaDA's exclusion of EOS and EoT from the confidences"),
    ({"cfg_scale": "none"}, "cfg_scale='none' is not a number"),
    ({"seed": 4294967296}, "seed must be in [0, 2**32), got 4294967296"),
    ({"device": "foo"}, "device='foo' is not a device; use auto, cpu, cuda or cuda:N"),
    ({"device": "cuda:7"}, "device='cuda:7' but "),  # no CUDA here, or fewer than 8 devices
    ({"device": "mps"}, "device='mps': spot decodes on cpu or cuda devices"),
    ({"mlflow_tracking_uri": "garbage"}, "mlflow_tracking_uri='garbage' is not a tracking URI that MLflow can open"),
    ({"mlflow_tracking_uri": "sqlit:///x.db"}, "mlflow_tracking_uri='sqlit:///x.db' is not a tracking URI"),
    ({"dtype": "int4"}, "unknown dtype 'int4'; choose one of auto, float32, bfloat16, float16"),
    ({"budgets": -1.0}, "method 'spot': budget must be >= 1, got -1"),
    ({"budgets": "abc"}, "budgets='abc' is not a whole number"),
    ({"budgets": 8.5}, "budgets='8.5' is not a whole number"),
    ({"block_length": 16.5}, "block_length=16.5 is not a whole number"),
    ({"block_length": 7}, "no spot drafter ships for block length 7"),
    ({"gen_length": 8}, "gen_length 8 is below one block (32)"),
    ({"gen_length": "many"}, "gen_length='many' is not a whole number"),
    ({"fail_on_divergence": "ture"}, "fail_on_divergence='ture' is not a boolean; write fail_on_divergence=true or fail_on_divergence=false"),
    ({"exact": "maybe"}, "exact='maybe' is not a boolean"),
    ({"cross_block": "maybe"}, "cross_block='maybe' is not a boolean"),
    ({"methods": "sets@8"}, "no sets drafter ships for block length 32 under policy single (shipped policies: threshold)"),
    ({"reference": False}, "reference=False leaves nothing to compare the methods with"),
    ({"methods": "spott"}, "unknown method 'spott'"),
    ({"methods": "", "budgets": "8"}, "budgets=8 given without a drafter-based method"),
    ({"methods": "spot", "spot_gamma": ""}, "list items are joined with '+'"),
    ({"methods": "oracle@0"}, "budget must be >= 1"),
    ({"methods": "oracle@auto"}, "method 'oracle@auto': budget auto needs calibrated reach probabilities"),
    ({"methods": "spot@auto", "max_budget": 0}, "max_budget=0: budget=auto's cap must be >= 1"),
    ({"budgets": "auto", "methods": "random"}, "method 'random': budget auto needs calibrated reach"),
    ({"methods": "spot:/nowhere.pt"}, "spot drafter file /nowhere.pt does not exist"),
    ({"methods": f"spot:{SPIFFY_GRAPH}"}, "is not an order-model checkpoint"),
    ({"methods": f"spiffy@3:{SPOT_CHECKPOINT}"}, "is not a Spiffy graph"),
    ({"unmasking": "greedy"}, "unknown unmasking 'greedy'; choose one of single"),
    ({"pretrained": "/nowhere"}, "pretrained=/nowhere is not a directory, nor a hub id"),
    ({"nonsense": 1}, "unknown model_args nonsense"),
    ({"threads": 0}, "threads=0: use threads >= 1"),
    ({"threads": 1.5}, "threads=1.5 is not a whole number"),
    ({"budgets": 1e9}, "spot@1000000000 needs 1000000001 pieces of 32 positions in one verify forward, and the free "
                       "memory of cpu holds at most"),
    ({"methods": "freedave@4", "budgets": "", "output_dir": "/proc/spot-out"},
     "output_dir='/proc/spot-out' cannot be created: /proc is not a writable directory"),
]


@pytest.mark.parametrize(("model_args", "message"), LM_CASES, ids=[str(a)[:50] for a, _ in LM_CASES])
def test_model_args_are_refused_before_loading_and_before_mlflow(model_args, message, no_load, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises((ValueError, FileNotFoundError)) as err:
        lm.SpotLM(**{"device": "cpu", **model_args})
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_llada_generates_own_options_at_their_defaults_change_nothing():
    """A line copied from LLaDA's settings (cfg_scale=0, logits_eos_inf=False) runs as without them."""
    from spot_eval.harness.model_args import SpotArgs

    assert SpotArgs.parse({"cfg_scale": 0.0, "logits_eos_inf": "false", "confidence_eos_eot_inf": False}) == SpotArgs.parse({})


def test_a_tracking_server_that_does_not_answer_is_said_in_one_line_before_loading(tmp_path, monkeypatch, no_load):
    """No server on port 9: one warning, before the model loads, naming the spool and the command that syncs it."""
    monkeypatch.chdir(tmp_path)
    with pytest.warns(RuntimeWarning) as said, pytest.raises(AssertionError, match="the model loaded"):
        lm.SpotLM(device="cpu", mlflow_tracking_uri="http://127.0.0.1:9")
    [line] = [str(w.message) for w in said if "MLflow" in str(w.message)]
    assert line.startswith("no MLflow server answers at http://127.0.0.1:9 (")
    assert line.endswith(f"log it with: spot-eval sync --spool {tmp_path / 'spot-eval-spool'}")


def test_an_output_dir_that_cannot_be_made_is_refused_before_loading(tmp_path, no_load):
    existing = tmp_path / "a-file"
    existing.write_text("x")
    for path, message in ((existing, "is an existing file; name a directory"),
                          (existing / "run", "is not a writable directory")):
        with pytest.raises(ValueError, match=message):
            lm.SpotLM(device="cpu", output_dir=str(path))


OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
COMMAND_LINE_CASES = [
    ("temperature=inf", "error: temperature must be a finite number, got inf"),
    ("budgets=-1", "error: method 'spot': budget must be >= 1, got -1"),
    ("output_dir={file}", "is an existing file; name a directory"),
    ("device=cuda:7", "error: device='cuda:7' but "),
    ("mlflow_tracking_uri=garbage", "error: mlflow_tracking_uri='garbage' is not a tracking URI"),
]


def command_line_args(model_args: str, existing: Path) -> str:
    return ("" if "device=" in model_args else "device=cpu,") + model_args.format(file=existing)


@pytest.mark.parametrize(("model_args", "message"), COMMAND_LINE_CASES)
def test_lm_evals_command_line_prints_one_line_and_exits_2(model_args, message, tmp_path, monkeypatch, capsys, no_load):
    """What `lm_eval --model spot --model_args ...` does, in-process: lm-eval's own constructor from the argument
    string, and the start-up hook (spot_eval.harness.registration) that turns the error into one line, exit 2."""
    from spot_eval.harness import registration, task_index

    existing = tmp_path / "a-file"
    existing.write_text("x")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["lm_eval", "--model", "spot"])
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    monkeypatch.setattr(registration, "register", lambda: None)  # lm-eval's registry and task index: other tests'
    monkeypatch.setattr(task_index, "install", lambda: None)
    registration.cli_startup()
    with pytest.raises((ValueError, FileNotFoundError)) as raised:
        lm.SpotLM.create_from_arg_string(command_line_args(model_args, existing))
    with pytest.raises(SystemExit) as exited:
        sys.excepthook(raised.type, raised.value, raised.tb)
    assert exited.value.code == 2 and message in one_error_line(capsys)
    assert not (tmp_path / "mlflow.db").exists()  # no MLflow run was opened


def test_lm_evals_own_device_falls_back_in_one_line_but_a_typed_device_is_refused(monkeypatch, capsys, no_load):
    """lm-eval passes its --device (default cuda:0) beside model_args. One this machine lacks falls back as lm-eval's
    `hf` model does (CUDA where usable, else the CPU), in one `warning:` line; a device= typed in --model_args that
    this machine lacks is refused before the model loads, whatever lm-eval passes beside it."""
    from spot_eval.harness import registration, task_index

    missing = f"cuda:{torch.cuda.device_count()}"  # cuda:0 on a machine without CUDA
    built = {}
    monkeypatch.setattr(sys, "argv", ["lm_eval", "--model", "spot"])
    monkeypatch.setattr(registration, "register", lambda: None)
    monkeypatch.setattr(task_index, "install", lambda: None)
    registration.cli_startup()  # our warnings as one `warning:` line
    with monkeypatch.context() as patch:
        patch.setattr(lm.SpotLM, "__init__", lambda self, **kwargs: built.update(kwargs))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            lm.SpotLM.create_from_arg_string("", {"device": missing, "batch_size": 1})
        assert built["device"] == "auto" and built["batch_size"] == 1
        [warning] = caught
        line = warnings.formatwarning(warning.message, warning.category, warning.filename, warning.lineno)
        chosen = "cuda:0" if torch.cuda.is_available() else "cpu"
        assert line.startswith(f"warning: lm-eval's device '{missing}' is not usable here (") and line.count("\n") == 1
        assert line.endswith(f"); decoding on {chosen} (device=... in --model_args chooses)\n")
        built.clear()
        lm.SpotLM.create_from_arg_string("", {"device": "cpu"})  # a usable one is kept
        assert built["device"] == "cpu"
    with pytest.raises(ValueError, match=f"device='{missing}' but"):
        lm.SpotLM.create_from_arg_string(f"device={missing}", {"device": "cpu"})


@pytest.mark.slow
def test_the_real_lm_eval_command_prints_one_line_and_exits_2(tmp_path):
    """The real console script, once: the cases above reach lm-eval's command line as it does."""
    model_args, message = COMMAND_LINE_CASES[-1]
    lm_eval = shutil.which("lm_eval", path=str(Path(sys.executable).parent))
    run = subprocess.run(
        [lm_eval, "--model", "spot", "--model_args", command_line_args(model_args, tmp_path / "a-file"),
         "--tasks", "spot_gsm8k", "--include_path", str(Path(__file__).parent.parent / "tasks"), "--limit", "1"],
        capture_output=True, text=True, env=OFFLINE, cwd=tmp_path, timeout=300,
    )
    assert run.returncode == 2, run.stderr[-2000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in run.stderr
    assert not (tmp_path / "mlflow.db").exists()  # no MLflow run was opened


@pytest.mark.parametrize("uri", ["sqlite:///mlflow.db", "sqlite:////abs/m.db", "http://127.0.0.1:5000", "https://mlflow.example.com",
                                 "file:///tmp/mlruns", "file:mlruns", "postgresql://u:p@h/db", "postgresql+psycopg2://u@h/db",
                                 "mysql+pymysql://u@h/db", "databricks", "databricks://profile", "/abs/mlruns", "./mlruns",
                                 "runs/mlruns", "~/mlruns", None])
def test_tracking_uris_mlflow_opens_are_accepted(uri):
    check_uri("mlflow_tracking_uri", uri)


def test_a_device_this_machine_lacks_is_refused_and_auto_picks_one_it_has():
    expected = "cuda:0" if torch.cuda.is_available() else "cpu"
    assert resolve_device("device", "auto") == expected
    with pytest.raises(ValueError, match=f"device='cuda:{torch.cuda.device_count()}' but"):
        resolve_device("device", f"cuda:{torch.cuda.device_count()}")


@pytest.mark.parametrize(("batch_size", "message"), [(0, "--batch_size=0: use a whole number >= 1"),
                                                    ("x", "--batch_size='x': use a whole number >= 1 .* or auto"),
                                                    (2.5, "--batch_size=2.5: use a whole number")])
def test_a_bad_batch_size_is_refused_before_the_model_loads(batch_size, message, no_load):
    with pytest.raises(ValueError, match=message):
        lm.SpotLM.create_from_arg_string("device=cpu", {"batch_size": batch_size})


@pytest.mark.parametrize(("batch_size", "cap", "size"), [(None, None, 1), (1, None, 1), ("16", None, 16), (16, 4, 16),
                                                         ("auto", None, None), ("auto:4", 8, None)])
def test_batch_sizes_parse_as_lm_eval_writes_them(batch_size, cap, size):
    batching = parse_batch_size("--batch_size", batch_size, cap)
    assert batching.size == size and batching.cap == (cap or AUTO_CAP if size is None else size)


def test_auto_batching_is_one_request_on_a_cpu_and_what_free_gpu_memory_holds_on_a_gpu(target16):
    assert resolve_batch_size(parse_batch_size("--batch_size", "auto"), target16, 256, 21) == 1
    assert resolve_batch_size(parse_batch_size("--batch_size", "3"), target16, 256, 21) == 3

    class OnAGpu:
        device = torch.device("cuda", 0)

        def max_pieces(self, context: int) -> int:
            return 10_000 // context  # pieces of this context's requests that fit

    gpu = OnAGpu()
    assert resolve_batch_size(parse_batch_size("--batch_size", "auto"), gpu, 256, 2) == 3  # 7 pieces fit at 1280 positions
    assert resolve_batch_size(parse_batch_size("--batch_size", "auto:4", 2), gpu, 256, 1) == 2  # --max_batch_size caps it
    assert resolve_batch_size(parse_batch_size("--batch_size", "auto"), gpu, 256, 21) == 1  # never below one request
    with pytest.warns(UserWarning, match="--batch_size 4: 4 requests of up to 2 pieces need about 8 pieces in one "
                      "forward; the free GPU memory holds about 7"):
        assert resolve_batch_size(parse_batch_size("--batch_size", "4"), gpu, 256, 2) == 4
