"""The settings beside the decoder's, one typed class each, and the checks every front door shares.

`TargetSettings` (which checkpoint, where and how it runs), `RunSettings` (the methods an evaluation compares)
and `TrackingSettings` (where its records go) hold them as fields declared with `spot.config.setting`, as
`DecodeConfig` holds the decoder's: lm_eval's model_args, spot-eval's flags and the model_args reference are
generated from those fields (spot_eval.harness.options).

Everything that can be checked is checked here, before a model loads or an MLflow run opens: types
(lm-eval hands model_args over as strings, or as numbers it coerced: `-1` arrives as `-1.0`), booleans,
the device and dtype, and the run directory. Ranges and finiteness of the decoding settings are
`spot.config`'s (DecodeConfig, Sampling), so both front doors refuse the same values with the same words.
Every error is one ValueError that names the setting, the value and the fix.
"""

from __future__ import annotations

import os
import re
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from spot.config import CACHES, setting
from spot_eval.checkpoints.shipped import EMBEDDED_TARGET

if TYPE_CHECKING:  # torch loads inside the checks that need it: the command line builds its flags from here first
    import torch

TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
DTYPES = ("float32", "bfloat16", "float16")  # torch dtypes by name (resolve_dtype)


MAX_BUDGET = 20  # budget=auto's default cap: the paper's largest budget
DRAFT_TIMEOUT = 60.0  # seconds a plugin's draft may take: a SPOT tree of 20 nodes takes milliseconds on a CPU


@dataclass(frozen=True)
class TargetSettings:
    """Which target, where, and how it runs (lm_eval's model_args and the flags of the commands that load one)."""

    pretrained: str = setting(str(EMBEDDED_TARGET), "a model directory, or a hub id read from the Hugging Face cache",
                              shown="the embedded target", aliases=("target",))
    revision: str | None = setting(None, "the hub id's branch, tag or commit", unset="main")
    device: str = setting("auto", "auto (cuda:0 where CUDA is usable, else cpu), cpu, cuda or cuda:N; a device this "
                                  "machine lacks is refused")
    dtype: str = setting("auto", "auto (float32 on a CPU, bfloat16 elsewhere), float32, bfloat16 or float16",
                         choices=("auto", *DTYPES))
    cache: str | None = setting(None, "LLaDA/Dream only: the KV frozen per block (dual; prefix; none: the uncached "
                                      "decoder; nosuffix: no masked suffix)", choices=CACHES, unset="dual")
    exact: bool = setting(False, "verify each draft piece exactly as a one-piece forward: speculative tokens equal "
                                 "draft-free bit for bit in any dtype")
    threads: int | None = setting(None, "torch CPU threads (1 on a machine shared with other work)",
                                  unset="torch's choice, one per core")
    # Spreading one target over several devices, under lm-eval's hf model's names (spot_eval.harness.placement).
    parallelize: bool = setting(False, "spread the target's layers over the GPUs (accelerate's device_map=auto), as "
                                       "lm-eval's hf model does; under accelerate launch each of N processes takes "
                                       "every N-th GPU")
    device_map: str | None = setting(None, "where each layer goes: a strategy (auto, balanced, balanced_low_0, "
                                           "sequential), module:device pairs joined by + (devices: cpu, disk, N or "
                                           "cuda:N), or a JSON file of that map", unset="the whole target on device")
    max_memory_per_gpu: str | None = setting(None, "the most of the weights each GPU holds (20GiB, 80GB) under "
                                                   "parallelize or a strategy", unset="what is free on each")
    max_cpu_memory: str | None = setting(None, "the most of the weights the CPU holds before the rest goes to disk",
                                         unset="what is free")
    offload_folder: str | None = setting(None, "where the weights no device holds are kept (disk offload, read in "
                                               "layer by layer)", unset="none: a map that needs the disk is refused")


@dataclass(frozen=True)
class RunSettings:
    """What an evaluation compares with draft-free decoding, and what a divergence does."""

    methods: str = setting("spot+spiffy@3", "the methods compared with draft-free decoding; by default SPOT at each "
                                            "of budgets, and Spiffy pruned to D* = 3 (its paper default)")
    budgets: str = setting("8", "+-joined budgets for the methods without @budget, or auto")
    max_budget: int = setting(MAX_BUDGET, "budget=auto's cap (methods=spot@auto)")
    plugins: str | None = setting(None, "+-joined plugin files (.py) or modules whose methods `methods=` may then name "
                                        "(docs/plugins.md)", unset="none: the built-in methods and installed plugins'")
    draft_timeout: float = setting(DRAFT_TIMEOUT, "seconds one draft of a plugin's method may take before the method is "
                                                  "stopped as hung (the run's other methods go on)")
    reference: bool = setting(True, "decode draft-free too, and diff every method against it")
    fail_on_divergence: bool = setting(True, "end with a non-zero exit naming the diverging requests, after everything "
                                             "is logged")


@dataclass(frozen=True)
class TrackingSettings:
    """Where an evaluation's records go."""

    mlflow_tracking_uri: str | None = setting(None, "the MLflow tracking store", unset="sqlite:///mlflow.db here")
    mlflow_experiment: str = setting("spot-eval", "the MLflow experiment of the run")
    output_dir: str | None = setting(None, "the run directory", unset="spot-eval-runs/<time>")


def as_bool(name: str, value: object) -> bool:
    """true/false, 1/0, yes/no, on/off in any case; anything else is refused."""
    text = str(value).strip().lower()
    if text in TRUE or text in FALSE:
        return text in TRUE
    raise ValueError(f"{name}={value!r} is not a boolean; write {name}=true or {name}=false")


def as_int(name: str, value: object) -> int:
    """A whole number: an int, a float without a fraction (lm-eval's `-1.0`), or such a string."""
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is not a whole number")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if re.fullmatch(r"[+-]?\d+(\.0*)?", text):
        return int(float(text)) if "." in text else int(text)
    raise ValueError(f"{name}={value!r} is not a whole number")


def as_float(name: str, value: object) -> float:
    """A number (finiteness and range are spot.config's to check)."""
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is not a number")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} is not a number") from None


def resolve_device(name: str, value: str) -> str:
    """A torch device string that exists here: auto is cuda:0 where CUDA is usable, else cpu. A device this
    machine does not have (CUDA without CUDA, a CUDA index past the visible ones, MPS) is refused, never
    replaced by another: a run meant for a GPU must not quietly measure a CPU."""
    import torch

    if value == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(str(value))
    except RuntimeError:
        raise ValueError(f"{name}={value!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name}={value!r} but this torch has no usable CUDA; use {name}=cpu (or auto)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"{name}={value!r} but only {torch.cuda.device_count()} CUDA device(s) are visible "
                             f"(cuda:0 to cuda:{torch.cuda.device_count() - 1}); pick one of them or set CUDA_VISIBLE_DEVICES")
    elif device.type != "cpu":
        available = device.type == "mps" and torch.backends.mps.is_available()
        raise ValueError(f"{name}={value!r}: spot decodes on cpu or cuda devices"
                         f"{'' if available else f' (and this machine has no {device.type})'}; use {name}=cpu")
    return str(device)


def fall_back_device(value: str) -> str:
    """The device lm-eval passes beside model_args (its --device, or its default cuda:0), where that device is not
    usable here: `auto`, with one warning line, as lm-eval's own `hf` model falls back (to CUDA where usable, else
    the CPU). A device typed in model_args goes through `resolve_device` and is refused instead."""
    try:
        resolve_device("--device", value)
    except ValueError as err:
        chosen = resolve_device("device", "auto")
        warnings.warn(f"lm-eval's device {value!r} is not usable here ({str(err).split(' but ', 1)[-1].split(';')[0]}); "
                      f"decoding on {chosen} (device=... in --model_args chooses)", RuntimeWarning, stacklevel=2)
        return "auto"
    return value


def resolve_dtype(name: str, value: str, device: str) -> torch.dtype:
    """auto is float32 on a CPU and bfloat16 elsewhere (what SDAR ships)."""
    import torch

    if value == "auto":
        return torch.float32 if device == "cpu" else torch.bfloat16
    if value not in DTYPES:
        raise ValueError(f"unknown {name} {value!r}; choose auto, {', '.join(DTYPES)}")
    return getattr(torch, value)


def resolve_target(target: TargetSettings) -> tuple[Path, str, torch.dtype]:
    """The checkpoint directory (a hub id resolved through the HF cache), the device and the dtype of `target`
    (or of the command line's flags of the same names), each checked before any weights load."""
    from spot_eval.checkpoints.target import resolve_checkpoint  # torch and transformers: not at import

    device = resolve_device("--device", target.device)
    dtype = resolve_dtype("--dtype", target.dtype, device)
    return resolve_checkpoint(target.pretrained, target.revision, option="--pretrained"), device, dtype


def check_output_dir(name: str, path: str | Path | None) -> None:
    """A directory the run makes and writes (the run directory, the offload folder) can be: not an existing file,
    and under a folder where a directory can really be made (tried, and removed again: permission bits say nothing
    for root, nor for /proc or a read-only mount). Nothing is left behind."""
    if path is None:
        return
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{name}={str(path)!r} is an existing file; name a directory (it is created if missing)")
    existing = next(p for p in (path, *path.absolute().parents) if p.exists())
    try:
        if not existing.is_dir():
            raise NotADirectoryError(str(existing))
        os.rmdir(tempfile.mkdtemp(prefix=".spot-eval-probe-", dir=existing))
    except OSError as err:
        raise ValueError(f"{name}={str(path)!r} cannot be created: {existing} is not a writable directory "
                         f"({err.strerror or type(err).__name__}); name a directory that can be written") from None


def check_budgets(budgets: dict[str, int], block_length: int, vocab_size: int, dtype: torch.dtype, device: str) -> None:
    """Refuse, before the weights load, a budget whose verify could not fit in the device's free memory for any
    target (spot.targets.memory.pieces_bound: its logits alone); the engine checks the exact figure per request.
    budgets: label -> the pieces one verify holds (DecodeConfig.verify_pieces)."""
    import torch

    from spot.targets.memory import pieces_bound

    room = pieces_bound(block_length, vocab_size, torch.empty((), dtype=dtype).element_size(), torch.device(device))
    for label, pieces in budgets.items():
        if pieces > room:
            raise ValueError(f"{label} needs {pieces} pieces of {block_length} positions in one verify forward, and "
                             f"the free memory of {device} holds at most {room} (their logits alone); use a budget of at "
                             f"most {max(room - 1, 0)}")


# The prompt tokens `--batch_size auto` plans each request's cache for: lm-eval's few-shot prompts run to about 1k.
AUTO_PROMPT = 1024
AUTO_CAP = 64  # lm-eval's own --max_batch_size default


@dataclass(frozen=True)
class Batching:
    """--batch_size as given: a size, or auto (size None) at most `cap`."""

    size: int | None
    cap: int


def parse_batch_size(name: str, value: object, max_batch_size: object = None) -> Batching:
    """A whole number >= 1, or lm-eval's auto (and its auto:N, whose N lm-eval uses to re-measure: one measure
    here), capped by --max_batch_size."""
    if value is None:
        return Batching(1, 1)
    if str(value).strip().lower().startswith("auto"):
        cap = AUTO_CAP if max_batch_size is None else as_int("--max_batch_size", max_batch_size)
        if cap < 1:
            raise ValueError(f"--max_batch_size={max_batch_size!r}: use a whole number >= 1")
        return Batching(None, cap)
    try:
        size = as_int(name, value)
    except ValueError:
        raise ValueError(f"{name}={value!r}: use a whole number >= 1 (requests decoded at once) or auto") from None
    if size < 1:
        raise ValueError(f"{name}={value!r}: use a whole number >= 1 (requests decoded at once) or auto")
    return Batching(size, size)


def resolve_batch_size(batching: Batching, target, gen_length: int, pieces: int) -> int:
    """auto: as many requests of `pieces` pieces each (an AUTO_PROMPT-token prompt and gen_length tokens) as half the
    free GPU memory holds (Target.max_pieces), at most the cap; 1 on a CPU, whose forward is compute-bound already
    (docs/guides/batching.md). A size given on a GPU that the same estimate says will not fit is warned about."""
    if target.device.type != "cuda":
        return 1 if batching.size is None else batching.size
    room = target.max_pieces(AUTO_PROMPT + gen_length)
    if batching.size is None:
        return max(1, min(batching.cap, room // pieces))
    if batching.size * pieces > room:  # an estimate on the safe side: said, not refused
        warnings.warn(f"--batch_size {batching.size}: {batching.size} requests of up to {pieces} pieces need about "
                      f"{batching.size * pieces} pieces in one forward; the free GPU memory holds about {room} for "
                      f"{AUTO_PROMPT}-token prompts. If the run runs out of memory, lower it or use --batch_size auto",
                      UserWarning, stacklevel=2)
    return batching.size
