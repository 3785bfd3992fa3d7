"""Training examples for the order model, cut from draft-free trajectories.

An example is a (root step s, depth d) pair of one recorded block: the root is the state before
step s, the stale distribution is the one recorded at step s - 1 (the previous forward), its prior
the top-1 recorded at step s - 2 (none at s = 1), the node
is the true state d steps later (its extra commits marked as hypothetical, the one of step
s + d - 1 also as the node's last commit), the node is scored with the noise of step s + d, and
the label is the position the target committed at step s + d.
Depth 0 is the metric of the published checkpoints (held-out next-commit accuracy); deeper
examples teach the model the tree levels it scores at inference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spot.drafters.order_model import Prior, features, predict, step_noise_at_topk


@dataclass(frozen=True)
class RecordedBlock:
    """One block of a draft-free trajectory with its stale inputs (`single` for the order model, `threshold` for sets).

    states: [S + 1, K] int64; topk_logprobs, topk_ids: [S, K, k] (the logits behind step s); hidden:
    [S, K, R] the hidden states behind step s, projected (spot.drafters.set_model.Projection), where
    recorded.
    """

    states: torch.Tensor
    topk_logprobs: torch.Tensor
    topk_ids: torch.Tensor
    mask_id: int
    seed: int
    request: int
    block: int
    temperature: float
    hidden: torch.Tensor | None = None

    def prior(self, s: int | torch.Tensor) -> Prior:
        """What the order model reads as the prior at root step s (an int, or a tensor [B] of them):
        the top-1 behind step s - 2, absent at s < 2 (a block's second step has no forward before
        the stale one; an absent prior gives the same inputs as none at all)."""
        s = torch.as_tensor(s)
        before = (s - 2).clamp_min(0)
        return Prior(self.topk_logprobs[before, :, 0].float(), self.topk_ids[before, :, 0].long(), s >= 2)  # [..., K]

    def drawn_confidence(self, stale_step: int, node_step: int) -> torch.Tensor:
        """[K] float64: under the distribution recorded behind step `stale_step`, the confidence of the token
        step `node_step` draws (with its noise at T > 0): what a drafter reads at a node of that step."""
        lp, ids = self.topk_logprobs[stale_step].float(), self.topk_ids[stale_step].long()
        noise = step_noise_at_topk(self.seed, self.request, self.block, node_step, ids) if self.temperature > 0 else None
        return predict(lp, ids, self.temperature, noise).probs[:, 0].double()

    def token_rank(self, stale_step: int, node_step: int, position: int) -> int:
        """The 0-based rank of the token step `node_step` commits at `position` among the top-k recorded behind
        step `stale_step`, ranked as step `node_step` draws (by logits at T = 0, logits / T + its noise at T > 0);
        k where the token is not in the top-k."""
        lp, ids = self.topk_logprobs[stale_step, position].double(), self.topk_ids[stale_step].long()  # [k], [K, k]
        if self.temperature > 0:
            lp = lp / self.temperature + step_noise_at_topk(self.seed, self.request, self.block, node_step, ids)[position]
        ranked = ids[position, lp.argsort(descending=True, stable=True)]  # [k] the ids best first
        hit = (ranked == self.states[node_step + 1, position]).nonzero().flatten()
        return int(hit[0]) if hit.numel() else ranked.numel()

    def committed_positions(self) -> torch.Tensor:
        """[S] the one position each step committed, -1 where a step committed several (a set policy's
        step, which no single-commit node of SPOT's tree can match)."""
        changed = self.states[1:] != self.states[:-1]  # [S, K]
        return changed.float().argmax(-1).masked_fill(changed.sum(-1) != 1, -1)


@dataclass(frozen=True)
class ExampleBatch:
    """feats [B, K, F], buckets [B, K], candidates [B, K] bool, labels [B], depths [B];
    fresh [B, K]: each position's confidence under the logits the label was decided on (the target's
    real step at the node), the order model's auxiliary target."""

    feats: torch.Tensor
    buckets: torch.Tensor
    candidates: torch.Tensor
    labels: torch.Tensor
    depths: torch.Tensor
    fresh: torch.Tensor


def example_index(block: RecordedBlock, max_depth: int) -> list[tuple[int, int]]:
    """Every (s, d) with a stale distribution (s >= 1) and a recorded label (s + d < S)."""
    n_steps = block.states.shape[0] - 1
    return [(s, d) for s in range(1, n_steps) for d in range(min(max_depth, n_steps - s))]


def order_example_index(block: RecordedBlock, max_depth: int) -> list[tuple[int, int]]:
    """The (s, d) of `example_index` whose label (step s + d) and last commit (step s + d - 1) are single
    commits: all of them under the `single` policy; under a set policy the order model learns the steps
    that commit one position, the only ones a chain of single commits can match."""
    single = (block.committed_positions() >= 0).tolist()
    return [(s, d) for s, d in example_index(block, max_depth) if single[s + d] and single[s + d - 1]]


def make_examples(block: RecordedBlock, pairs: list[tuple[int, int]], buckets: int) -> ExampleBatch:
    labels_all = block.committed_positions()
    s = torch.tensor([p[0] for p in pairs])
    d = torch.tensor([p[1] for p in pairs])
    stale_lp, stale_ids = block.topk_logprobs[s - 1].float(), block.topk_ids[s - 1].long()  # [B, K, k]
    fresh_lp, fresh_ids = block.topk_logprobs[s + d].float(), block.topk_ids[s + d].long()  # [B, K, k]
    noise = fresh_noise = None
    if block.temperature > 0:  # [B, K, k] each: the noise of each example's node step, in one draw
        steps = (s + d).tolist()
        noise = step_noise_at_topk(block.seed, block.request, block.block, steps, stale_ids)
        fresh_noise = step_noise_at_topk(block.seed, block.request, block.block, steps, fresh_ids)
    prediction = predict(stale_lp, stale_ids, block.temperature, noise)
    fresh = predict(fresh_lp, fresh_ids, block.temperature, fresh_noise).probs[..., 0]  # [B, K]
    root_masked = block.states[s] == block.mask_id  # [B, K]
    node_masked = block.states[s + d] == block.mask_id  # [B, K]
    last = torch.nn.functional.one_hot(labels_all[s + d - 1], block.states.shape[1]).bool()  # [B, K]
    feats, token_buckets = features(
        stale_lp, stale_ids, prediction, node_masked, root_masked & ~node_masked, last, block.prior(s), buckets
    )
    return ExampleBatch(feats, token_buckets, node_masked, labels_all[s + d], d, fresh)
