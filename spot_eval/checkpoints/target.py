"""Loading a target checkpoint directory, and the prompt encoding every command shares."""

from __future__ import annotations

from pathlib import Path

import torch

from spot.targets import CheckpointInfo, SDARTarget, read_checkpoint
from spot_eval.checkpoints.fingerprint import weights_digest


def checkpoint_info(path: str | Path) -> CheckpointInfo:
    """What a target directory says about itself (ids, block size), read without loading weights."""
    if not Path(path).is_dir():
        raise FileNotFoundError(f"target {path} is not a directory; pass --target PATH to a model directory")
    return read_checkpoint(path)[1]


def load_target(path: str | Path, block_length: int | None, device: str = "cpu", exact: bool = False) -> SDARTarget:
    checkpoint_info(path)
    dtype = torch.float32 if str(device).startswith("cpu") else torch.bfloat16
    return SDARTarget.from_pretrained(path, block_length=block_length, device=device, dtype=dtype, exact=exact)


def encode_prompt(target: SDARTarget, prompt: str, chat: bool) -> list[int]:
    tokenizer = target.tokenizer
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"--chat needs a chat template, and the tokenizer of {target.name} has none; drop --chat")
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    return tokenizer(prompt, add_special_tokens=False)["input_ids"]


def target_id(path: str | Path) -> str:
    """A name for the target that is the same on every checkout: its directory name and weights digest."""
    return f"{Path(path).name}@{weights_digest(Path(path))[:12]}"
