"""Draft-free commit policies as pure functions: (state, logits, noise) -> next state.

Vocabulary used across the library:
    masked     a block position that still holds the mask token.
    committed  a position that holds a real token (prompt tokens in the first block included).
    step       one application of the policy: it commits >= 1 masked positions.
    state      a block's tokens [K], masks included.

Both the draft-free decoder and the verifier call `next_state`; that shared seam is what makes
speculation lossless by construction. Shapes: K = block length, V = vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spot.config import DecodeConfig, Sampling


@dataclass(frozen=True)
class Proposal:
    """What the target would write at every position of a state, and how sure it is.

    tokens: [K] int64, the sampled (or argmax) token per position.
    confidence: [K] float64, its probability under the filtered, temperature-scaled distribution.
    """

    tokens: torch.Tensor
    confidence: torch.Tensor


def filtered_logits(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Temperature, then top-k, then top-p (SDAR's order); the top token always survives.

    Args:
        logits: [K, V] float64, with disallowed tokens already at -inf.
    Returns:
        [K, V] float64 log-weights; removed tokens are -inf.
    """
    z = logits / sampling.temperature if sampling.temperature > 0 else logits
    if 0 < sampling.top_k < z.shape[-1]:
        kth = torch.topk(z, sampling.top_k, dim=-1).values[:, -1:]  # [K, 1]
        z = z.masked_fill(z < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_z, order = torch.sort(z, dim=-1, descending=True)  # [K, V]
        probs = torch.softmax(sorted_z, dim=-1)
        # Drop a token when the mass strictly before it already reaches top_p.
        drop_sorted = (torch.cumsum(probs, dim=-1) - probs) >= sampling.top_p
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        z = z.masked_fill(drop, float("-inf"))
    return z


def propose(logits: torch.Tensor, gumbel: torch.Tensor | None, sampling: Sampling, mask_id: int) -> Proposal:
    """The token and confidence at every position of one state.

    Args:
        logits: [K, V] target logits for the state (any float dtype; computed in float64).
        gumbel: [K, V] float64 noise of this step, or None at temperature 0.
        mask_id: never sampled, so a committed position can never look masked.
    """
    z = logits.to(torch.float64)
    z[:, mask_id] = float("-inf")
    z = filtered_logits(z, sampling)
    tokens = torch.argmax(z + gumbel if sampling.temperature > 0 else z, dim=-1)  # [K]
    confidence = torch.softmax(z, dim=-1).gather(-1, tokens[:, None])[:, 0]  # [K]
    return Proposal(tokens=tokens, confidence=confidence)


def select(masked: torch.Tensor, confidence: torch.Tensor, config: DecodeConfig) -> torch.Tensor:
    """Which masked positions one step commits.

    Args:
        masked: [K] bool, True where the state still holds the mask token (at least one).
        confidence: [K] float64.
    Returns:
        [K] bool, the positions to commit (always >= 1, always a subset of `masked`).
    """
    score = confidence.masked_fill(~masked, float("-inf"))
    chosen = torch.zeros_like(masked)
    chosen[torch.argmax(score)] = True  # ties go to the leftmost position
    if config.policy == "threshold":
        chosen |= masked & (confidence >= config.threshold)
    return chosen


def next_state(
    state: torch.Tensor, logits: torch.Tensor, gumbel: torch.Tensor | None, config: DecodeConfig, mask_id: int
) -> torch.Tensor:
    """One draft-free step: the state the target moves to from `state`.

    Args:
        state: [K] int64 with at least one mask.
        logits: [K, V] the target's logits at `state`.
        gumbel: [K, V] the noise of this step (None at T = 0).
    Returns:
        [K] int64, `state` with the chosen positions committed.
    """
    proposal = propose(logits, gumbel, config.sampling, mask_id)
    chosen = select(state == mask_id, proposal.confidence, config)
    return torch.where(chosen, proposal.tokens, state)


def topk_logprobs(logits: torch.Tensor, k: int, mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-k of log-softmax over the vocabulary without the mask token: ([K, k], [K, k]) on CPU."""
    z = logits.float().clone()  # [K, V]
    z[:, mask_id] = float("-inf")
    top = torch.topk(torch.log_softmax(z, dim=-1), k, dim=-1)
    return top.values.cpu(), top.indices.cpu()
