"""Loading a target checkpoint (a local directory or a hub id), and the prompt encoding every command shares."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from spot.targets import Checkpoint, Placement, from_pretrained, read_checkpoint
from spot.targets.base import LoadedTarget
from spot_eval.checkpoints.fingerprint import weights_digest
from spot_eval.checkpoints.model_types import discover

CONFIG_FILES = ("*.json", "*.model", "*.txt", "*.tiktoken")  # config, tokenizer and weight index: no weights
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")  # org/name, as the hub spells repository ids


def resolve_checkpoint(pretrained: str | Path, revision: str | None = None, option: str = "pretrained",
                       files: tuple[str, ...] | None = None) -> Path:
    """The local directory of a checkpoint: `pretrained` itself when it is a directory, else the snapshot
    of the hub id `pretrained` (at `revision`) in the Hugging Face cache. Where the hub is reachable a
    missing snapshot is downloaded; with HF_HUB_OFFLINE=1 only the cache is read.

    option: how the user set it (lm_eval's model_arg `pretrained`, or spot-eval's `--pretrained`), for the errors.
    files: only the hub files matching these patterns (CONFIG_FILES: what a plan reads, without the weights).

    Raises:
        FileNotFoundError: one line naming the checkpoint and the command that fetches it.
    """
    if Path(pretrained).is_dir():
        return Path(pretrained)
    name = str(pretrained)
    said = f"{option} {name}" if option.startswith("--") else f"{option}={name}"
    if not _HUB_ID.match(name):
        raise FileNotFoundError(f"{said} is not a directory, nor a hub id (org/name); pass a model directory or a hub id")
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled

    try:
        return Path(snapshot_download(name, revision=revision, allow_patterns=list(files) if files else None))
    except (LocalEntryNotFoundError, OfflineModeIsEnabled, HfHubHTTPError, OSError) as err:
        at = f" at revision {revision}" if revision else ""
        fetch = f"hf download {name}" + (f" --revision {revision}" if revision else "")
        why = "HF_HUB_OFFLINE=1" if constants.HF_HUB_OFFLINE else f"the hub did not answer: {type(err).__name__}"
        raise FileNotFoundError(
            f"{said}{at} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and cannot be fetched "
            f"here ({why}); fetch it once where the hub is reachable, with the same HF_HOME: {fetch}"
        ) from None


def read_target(path: str | Path) -> Checkpoint:
    """A checkpoint directory parsed (config, ids, block size) without loading weights: the one parse that
    `load_target` and everything else that asks about the checkpoint share. The installed target plugins are
    discovered first (spot_eval.checkpoints.model_types), so that a plugin's model_type loads in every command."""
    if not Path(path).is_dir():
        raise FileNotFoundError(f"{path} is not a model directory; pass one as pretrained=PATH (spot-eval: --pretrained PATH)")
    discover()
    return read_checkpoint(path)


def load_target(
    checkpoint: str | Path | Checkpoint,
    block_length: int | None,
    device: str = "cpu",
    exact: bool = False,
    dtype: torch.dtype | None = None,
    cache: str | None = None,
    placement: Placement | None = None,
) -> LoadedTarget:
    """The target in a checkpoint directory (`resolve_checkpoint` finds one; or as `read_target` parsed it), as its
    family decodes it (spot.targets.from_pretrained); dtype: float32 on a CPU and bfloat16 elsewhere unless given;
    cache: a bidirectional target's frozen-cache decoder (dual by default, spot.targets.dual_cache);
    placement: the weights spread over devices in place of `device` (spot_eval.harness.placement plans it)."""
    if not isinstance(checkpoint, Checkpoint):
        checkpoint = read_target(checkpoint)
    if dtype is None:
        dtype = torch.float32 if str(device).startswith("cpu") else torch.bfloat16
    return from_pretrained(checkpoint, block_length=block_length, device=device, dtype=dtype, exact=exact, cache=cache,
                           placement=placement)


def encode_prompt(target: LoadedTarget, prompt: str, chat: bool) -> list[int]:
    tokenizer = target.tokenizer
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"--chat needs a chat template, and the tokenizer of {target.name} has none; drop --chat")
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    return tokenizer(prompt, add_special_tokens=False)["input_ids"]


def target_id(pretrained: str | Path, path: str | Path) -> str:
    """A name for the target that is the same on every checkout: what the user called it (a directory's
    name, or the hub id) and the digest of the weights in its directory `path`."""
    name = str(pretrained) if not Path(pretrained).is_dir() else Path(pretrained).name
    return f"{name}@{weights_digest(Path(path))[:12]}"
