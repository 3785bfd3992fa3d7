"""The device memory a verify forward may plan on."""

from __future__ import annotations

import os
from pathlib import Path

import torch

SAFE_FRACTION = 0.5  # of the free memory one verify may plan to use: the estimates leave out temporaries


def free_bytes(device: torch.device) -> int:
    """Free memory on `device`: CUDA's own count, else the host's available memory."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        meminfo = Path("/proc/meminfo").read_text()
        return int(next(line.split()[1] for line in meminfo.splitlines() if line.startswith("MemAvailable:"))) * 1024
    except (OSError, StopIteration):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def pieces_bound(block_length: int, vocab_size: int, element: int, device: torch.device) -> int:
    """The most pieces a verify could hold on `device` whatever the model: each piece's logits alone (and their
    float32 copy) take block_length x vocab_size x (element + 4) bytes, a lower bound of every target's
    `max_pieces` cost, so it can be told before the weights load."""
    return int(SAFE_FRACTION * free_bytes(device) // (block_length * vocab_size * (element + 4)))


def layer_row_bytes(config, element: int, keys: int) -> int:
    """One token row's transient bytes in one layer: its attention scores over `keys` keys (fp32, the math
    path) and its MLP activations (`element` bytes per value)."""
    return config.num_attention_heads * keys * 4 + 4 * config.intermediate_size * element
