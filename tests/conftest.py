"""Shared fixtures: tiny randomly initialised Qwen3 targets, built in the test (no files, no hub)."""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from spot.targets.block_causal import BlockCausalTarget

VOCAB = 64
MASK_ID = 63
EOS_ID = 62

# The commands tests start inherit one OpenMP thread (this process takes one in `one_thread`): the tiny models are
# overhead-bound, and with pytest-xdist's workers on every core a second thread per process only spins. Set when
# this file loads, before the test modules copy os.environ into the environments they give their commands.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _tiny(model_class, config_class, seed: int, scale: float, **fields) -> PreTrainedModel:
    """A tiny randomly initialised model: 4 heads (2 KV heads), 512 positions, a wide initialisation and
    an output head scaled by `scale`, so that outputs vary and distributions are peaked like a trained
    model's (confidences spread over (0, 1), which exercises the threshold policies)."""
    torch.manual_seed(seed)
    hidden = fields["hidden_size"]
    config = config_class(
        intermediate_size=2 * hidden,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        initializer_range=0.3,
        attn_implementation="sdpa",
        **fields,
    )
    model = model_class(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


def tiny_qwen3(seed: int = 0, vocab: int = VOCAB, hidden: int = 32, layers: int = 2, scale: float = 2.0) -> Qwen3ForCausalLM:
    """A 2-layer Qwen3."""
    return _tiny(Qwen3ForCausalLM, Qwen3Config, seed, scale, vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers)


def tiny_qwen3_moe(seed: int = 0, vocab: int = VOCAB, hidden: int = 32, layers: int = 2, scale: float = 2.0) -> Qwen3MoeForCausalLM:
    """A 2-layer Qwen3-MoE shaped like SDAR-30B-A3B (Qwen3-30B-A3B): every layer sparse, top-k routing
    renormalised over the chosen experts (norm_topk_prob), here 8 experts and 2 a token."""
    return _tiny(
        Qwen3MoeForCausalLM, Qwen3MoeConfig, seed, scale, vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
        moe_intermediate_size=hidden // 2, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[],
    )


def tiny_target(
    block_length: int = 16, seed: int = 0, eos_ids=frozenset({EOS_ID}), dtype: torch.dtype = torch.float32, exact: bool = False
) -> BlockCausalTarget:
    model = tiny_qwen3(seed).to(dtype)
    return BlockCausalTarget(model, mask_id=MASK_ID, eos_ids=eos_ids, block_length=block_length, exact=exact)


def write_checkpoint(
    path: Path, config_overrides: dict | None = None, tokenizer_vocab: int = 64, model: PreTrainedModel | None = None
) -> Path:
    """A tiny SDAR-style model directory: Qwen3 weights (or `model`'s), block_size 16, a word-level
    tokenizer (token i is the word "t<i>"), no chat template."""
    model = model or tiny_qwen3()
    model.config.block_size = 16
    model.config.mask_token_id = MASK_ID
    model.config.eos_token_id = EOS_ID
    model.save_pretrained(path)
    vocab = {f"t{i}": i for i in range(tokenizer_vocab)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=f"t{EOS_ID}").save_pretrained(path)
    if config_overrides:
        raw = json.loads((path / "config.json").read_text())
        raw.update(config_overrides)
        (path / "config.json").write_text(json.dumps({k: v for k, v in raw.items() if v is not None}))
    return path


def run_cli(capsys, *args: str) -> SimpleNamespace:
    """`spot-eval ARGS` in this process (`spot_eval.cli.main`, what the console script calls): its exit status,
    stdout and stderr, as subprocess.run would give them."""
    from spot_eval.cli import main

    return _as_a_process(capsys, lambda: main(list(args)))


LM_EVAL = str(Path(sys.executable).with_name("lm_eval"))
SPOT_TASKS = ["spot_gsm8k", "spot_math500", "spot_humaneval", "spot_mbpp"]  # tasks/spot_all.yaml's members


def run_lm_eval_here(capsys, *args: str, cwd: Path, env: dict[str, str] | None = None) -> SimpleNamespace:
    """`lm_eval ARGS` in this process, as the console script runs it: the start-up hook of the installed .pth
    (registration.cli_startup: `spot` registered, lm-eval's task index cached, our errors as one `error:` line),
    then lm-eval's entry point (lm_eval.__main__.cli_evaluate); an uncaught exception goes to the hook that the
    start-up installed, as in a fresh process. Its exit status, stdout and stderr, as subprocess.run gives them.

    A fresh `lm_eval` spends ~6 s of CPU importing torch, transformers, lm-eval and MLflow, which this process has
    paid: tests about the evaluation run it here, and the tests about the process (the console script, `python -m
    lm_eval`, accelerate, signals, a fresh HF_HOME or offline start) start the real command."""
    import lm_eval.utils
    from lm_eval.__main__ import cli_evaluate

    from spot_eval.harness import registration

    def main() -> None:
        registration.cli_startup()
        try:
            cli_evaluate()
        except Exception:
            sys.excepthook(*sys.exc_info())  # ours: one `error:` line and exit 2; any other: the traceback
            raise SystemExit(1) from None

    lm_eval_log = logging.getLogger("lm_eval")
    kept = (lm_eval_log.handlers[:], lm_eval_log.level, lm_eval_log.propagate)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        patch.setattr(sys, "argv", [LM_EVAL, *args])
        patch.setattr(sys, "excepthook", sys.__excepthook__)
        patch.setattr(lm_eval.utils, "_LOGGING_CONFIGURED", False)  # its handler writes to this run's stderr
        for name, value in {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **(env or {})}.items():
            patch.setenv(name, value)  # what the commands the tests start are given
        try:
            return _as_a_process(capsys, main)
        finally:
            lm_eval_log.handlers[:], lm_eval_log.level, lm_eval_log.propagate = kept


def _as_a_process(capsys, main: Callable[[], None]) -> SimpleNamespace:
    """main() with what a fresh process would print on stderr: every warning, and WARNING log records (logging's
    last resort), which pytest otherwise keeps for its own report. Its exit status, stdout and stderr."""
    capsys.readouterr()
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    logging.getLogger().addHandler(handler)
    formatwarning = warnings.formatwarning
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: print(
                warnings.formatwarning(message, category, filename, lineno, line), end="", file=sys.stderr)
            main()
        code = 0
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            code = exit_.code or 0
        else:  # sys.exit("message"): printed, status 1
            print(exit_.code, file=sys.stderr)
            code = 1
    finally:
        logging.getLogger().removeHandler(handler)
        warnings.formatwarning = formatwarning
    out = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)


def own_cache_home(tmp_path: Path) -> Path:
    """An XDG_CACHE_HOME of the test's own (budget=auto's device profiles start empty) in which lm-eval's task index
    (spot_eval.harness.task_index) is the one every other run reads: indexing lm-eval's library again costs ~7 s."""
    from spot_eval.harness import task_index

    shared = task_index.cache_dir()
    shared.mkdir(parents=True, exist_ok=True)
    home = tmp_path / "cache"
    (home / "spot-eval").mkdir(parents=True)
    (home / "spot-eval" / shared.name).symlink_to(shared, target_is_directory=True)
    return home


@functools.cache
def _migrated_store() -> bytes:
    """An MLflow sqlite store as MLflow leaves it after first contact (tables created, migrations run), made once
    per test process."""
    from mlflow import MlflowClient

    with tempfile.TemporaryDirectory() as folder:
        MlflowClient(f"sqlite:///{folder}/mlflow.db").search_experiments()
        return (Path(folder) / "mlflow.db").read_bytes()


def existing_store(folder: Path) -> str:
    """`folder`/mlflow.db as a store that exists already, as on a user's second run; its URI. MLflow creates and
    migrates a fresh sqlite store on first contact (~1.7 s of CPU; an existing one opens in 0.03 s), which each
    evaluation that logs here would otherwise pay. tests/test_tracking.py opens fresh stores, the default one among them."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mlflow.db").write_bytes(_migrated_store())
    return f"sqlite:///{folder / 'mlflow.db'}"


def free_port() -> int:
    """A local TCP port nobody listens on (a dead MLflow server, or one to start)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chromium() -> str:
    """The Chromium the browser tests drive (Playwright launches it; no browser is downloaded); skips the test without one."""
    found = os.environ.get("SPOT_EVAL_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.skip("Chromium is not installed (apt-get install chromium, or set SPOT_EVAL_CHROMIUM); .ci/run installs it")
    return found


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The end-to-end (slow) tests first: pytest-xdist hands tests out in this order, so that the long ones
    start while the short ones can still fill the other workers around them."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """The tiny test models are overhead-bound: on a 2-core machine a second torch thread mostly spins, the more
    so with pytest-xdist's workers on every core."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def target16() -> BlockCausalTarget:
    return tiny_target(16)


# -- a real MLflow tracking server, and an evaluation logged to it (tests/test_tracking.py, tests/test_mlflow_ui.py) --

ROOT = Path(__file__).resolve().parents[1]


class Server:
    """A real `mlflow server` on 127.0.0.1 with an sqlite backend and proxied local artifacts under
    `root`; it can be killed and restarted on the same backend and port."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [
            str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1",
            "--port", str(self.port), "--workers", "1",
            "--backend-store-uri", f"sqlite:///{self.root / 'backend.db'}",
            "--artifacts-destination", str(self.root / "artifacts"),
        ]  # fmt: skip
        # No job runner: one process group less to start and to kill.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with (self.root / "server.log").open("ab") as log:
            # Its own session, so that stop() can kill the server and its uvicorn child as one group.
            self.proc = subprocess.Popen(command, stdout=log, stderr=log, env=env, start_new_session=True)
        deadline = time.monotonic() + 150  # a cold start takes ~20 s on a loaded 2-core machine
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=1):
                    return
            except OSError:
                time.sleep(0.3)
        self.stop()
        pytest.fail(f"mlflow server did not come up: {(self.root / 'server.log').read_text()[-2000:]}")

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.kill()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """A real MLflow server per test module, stopped after it."""
    server = Server(tmp_path_factory.mktemp("mlflow-server"))
    server.start()
    yield server
    server.stop()


def lm_eval_spot(capsys, checkpoint: Path, uri: str, cwd: Path) -> SimpleNamespace:
    """`lm_eval --model spot` on two spot_gsm8k documents (draft-free and oracle@4, on the CPU), logging to `uri`."""
    args = f"pretrained={checkpoint},methods=oracle,budgets=4,gen_length=32,device=cpu,mlflow_tracking_uri={uri}"
    return run_lm_eval_here(capsys, "--model", "spot", "--model_args", args, "--tasks", "spot_gsm8k",
                            "--include_path", str(ROOT / "tasks"), "--limit", "2", cwd=cwd)
