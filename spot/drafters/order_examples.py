"""Training examples for the order model, cut from draft-free trajectories.

An example is a (root step s, depth d) pair of one recorded block: the root is the state before
step s, the stale distribution is the one recorded at step s - 1 (the previous forward), the node
is the true state d steps later (its extra commits marked as hypothetical, the one of step
s + d - 1 also as the node's last commit), the node is scored with the noise of step s + d, and
the label is the position the target committed at step s + d.
Depth 0 is the metric of the published checkpoints (held-out next-commit accuracy); deeper
examples teach the model the tree levels it scores at inference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spot.drafters.order_model import features, predict, step_noise_at_topk


@dataclass(frozen=True)
class RecordedBlock:
    """One block of a draft-free `single`-policy trajectory with its stale inputs.

    states: [S + 1, K] int64; topk_logprobs, topk_ids: [S, K, k] (the logits behind step s).
    """

    states: torch.Tensor
    topk_logprobs: torch.Tensor
    topk_ids: torch.Tensor
    mask_id: int
    seed: int
    request: int
    block: int
    temperature: float

    def committed_positions(self) -> torch.Tensor:
        """[S] the one position each step committed (the `single` policy)."""
        changed = self.states[1:] != self.states[:-1]  # [S, K]
        if not bool((changed.sum(-1) == 1).all()):
            raise ValueError("this trajectory commits several positions in one step: it was not recorded with policy 'single'")
        return changed.float().argmax(-1)


@dataclass(frozen=True)
class ExampleBatch:
    """feats [B, K, F], buckets [B, K], candidates [B, K] bool, labels [B], depths [B]."""

    feats: torch.Tensor
    buckets: torch.Tensor
    candidates: torch.Tensor
    labels: torch.Tensor
    depths: torch.Tensor


def example_index(block: RecordedBlock, max_depth: int) -> list[tuple[int, int]]:
    """Every (s, d) with a stale distribution (s >= 1) and a recorded label (s + d < S)."""
    n_steps = block.states.shape[0] - 1
    return [(s, d) for s in range(1, n_steps) for d in range(min(max_depth, n_steps - s))]


def make_examples(block: RecordedBlock, pairs: list[tuple[int, int]], buckets: int) -> ExampleBatch:
    labels_all = block.committed_positions()
    s = torch.tensor([p[0] for p in pairs])
    d = torch.tensor([p[1] for p in pairs])
    stale_lp, stale_ids = block.topk_logprobs[s - 1].float(), block.topk_ids[s - 1].long()  # [B, K, k]
    noise = None
    if block.temperature > 0:
        noise = torch.stack(
            [step_noise_at_topk(block.seed, block.request, block.block, int(step), ids) for step, ids in zip(s + d, stale_ids, strict=True)]
        )
    prediction = predict(stale_lp, stale_ids, block.temperature, noise)
    root_masked = block.states[s] == block.mask_id  # [B, K]
    node_masked = block.states[s + d] == block.mask_id  # [B, K]
    last = torch.nn.functional.one_hot(labels_all[s + d - 1], block.states.shape[1]).bool()  # [B, K]
    feats, token_buckets = features(stale_lp, stale_ids, prediction, node_masked, root_masked & ~node_masked, last, buckets)
    return ExampleBatch(feats, token_buckets, node_masked, labels_all[s + d], d)
