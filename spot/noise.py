"""Counter-keyed Gumbel noise: the coupling that keeps speculation exact at T > 0.

The draft-free decoder draws its token at (request, block, step, position) by Gumbel-max with
noise G[seed, request, block, step, position, v]. Here G is not drawn from a stateful generator
but computed from its key with an integer hash, so any step's noise can be regenerated on demand:
a verifier that reaches a state k steps ahead scores it with exactly the noise that the draft-free
run uses at that step ("coupled-noise match", method.md §4.3). Every transition on the accepted
path is then the same deterministic function of (true logits, noise) as in the sequential run.

The hash is a 32-bit xorshift-multiply mixer evaluated in int64 tensors with multipliers below
2**31, so no intermediate overflows and the values are identical on every device.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_MASK32 = 0xFFFFFFFF
# Odd multipliers below 2**31: (x < 2**32) * c < 2**63 never overflows int64.
_C1 = 0x7FEB352D
_C2 = 0x2C1B3C6D
_C3 = 0x297A2D39


def _mix_int(x: int) -> int:
    """The tensor mixer below, on a Python int (for the scalar part of the key)."""
    x &= _MASK32
    x = ((x ^ (x >> 16)) * _C1) & _MASK32
    x = ((x ^ (x >> 15)) * _C2) & _MASK32
    x = ((x ^ (x >> 15)) * _C3) & _MASK32
    return x ^ (x >> 16)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """Bijective 32-bit mixer on an int64 tensor holding values in [0, 2**32)."""
    x = ((x ^ (x >> 16)) * _C1) & _MASK32
    x = ((x ^ (x >> 15)) * _C2) & _MASK32
    x = ((x ^ (x >> 15)) * _C3) & _MASK32
    return x ^ (x >> 16)


def step_key(seed: int, request: int, block: int, step: int) -> int:
    """The scalar part of the key: one value per (seed, request, block, step)."""
    key = 0x9E3779B9
    for part in (seed, request, block, step):
        key = _mix_int(key ^ _mix_int(part))
    return key


def gumbel_at(key: int | torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The noise entries at given (position, token) pairs, equal to the matching entries of
    `gumbel(key, ...)`; drafters use it to score only a position's top-k tokens.

    Args:
        key: a step_key, or an int64 tensor of them broadcastable with positions (several steps).
        positions, tokens: int64 tensors of one broadcastable shape S.
    Returns:
        float64 tensor of shape S.
    """
    row = _mix(positions ^ key)
    h = _mix(_mix(row ^ tokens) ^ 0x85EBCA6B)
    u = (h.to(torch.float64) + 0.5) / 2.0**32  # uniform in (0, 1), never 0 or 1
    return -torch.log(-torch.log(u))


def gumbel(key: int, block_length: int, vocab_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Gumbel(0, 1) noise for one step of one block.

    Returns:
        float64 tensor [K, V]: entry (i, v) belongs to position i of the block and token v.
    """
    positions = torch.arange(block_length, device=device, dtype=torch.int64)[:, None]  # [K, 1]
    tokens = torch.arange(vocab_size, device=device, dtype=torch.int64)[None, :]  # [1, V]
    return gumbel_at(key, positions, tokens)


def block_noise(seed: int, request: int, block: int, block_length: int, vocab_size: int,
                device: torch.device | str = "cpu") -> Callable[[int], torch.Tensor]:
    """step -> the noise of that step of one block ([K, V] float64), each made once, when first asked for: the
    walk and the drafters of one block read the same steps many times."""
    made: dict[int, torch.Tensor] = {}

    def at(step: int) -> torch.Tensor:
        if step not in made:
            made[step] = gumbel(step_key(seed, request, block, step), block_length, vocab_size, device)
        return made[step]

    return at


def silent(step: int) -> None:
    """The noise of a config that reads none (T = 0, no random order, no alg_temp): `block_noise`'s stand-in."""
    return None
