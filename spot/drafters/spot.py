"""SPOT: grow predicted commit orders into a best-first tree of candidate block states.

For each node the order model gives P(next commit = p) over the node's masked positions; the
stale distribution, ranked with the node's step noise (the coupled draw), gives the token there.
An edge (p, v) scores log P_order(p) + log q(v | p), q the stale probability of v. A position
also branches on its second-ranked token when its first-ranked probability is below the token
gate (default 0.6); otherwise the budget goes to alternative orders. SPOT-gamma reweights each
depth's edge log-scores by a fitted exponent (spot.tree.grow_best_first's gamma).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from spot.drafters.base import DraftContext
from spot.drafters.order_model import OrderModel, features, predict, step_noise_at_topk
from spot.policy import topk_logprobs
from spot.tree import DraftTree, Edge, grow_best_first


class SpotDrafter:
    def __init__(
        self, model: OrderModel, gate: float = 0.6, gamma: Sequence[float] | None = None, name: str = "spot"
    ) -> None:
        if not 0.0 <= gate <= 1.0:
            raise ValueError(f"token gate must be in [0, 1], got {gate}")
        self.model = model.eval()
        self.gate = gate
        self.gamma = tuple(gamma) if gamma else None
        self.name = name

    @torch.inference_mode()
    def draft(self, ctx: DraftContext) -> DraftTree:
        if ctx.stale_logits is None:  # a block's first step: no distribution of this block yet
            return DraftTree.root_only(ctx.state)
        return self.grow(ctx, *topk_logprobs(ctx.stale_logits, self.model.config.topk, ctx.mask_id))

    @torch.inference_mode()
    def grow(self, ctx: DraftContext, lp: torch.Tensor, ids: torch.Tensor) -> DraftTree:
        """The tree from the stale top-k (lp, ids: [K, k]); also used offline on recorded trajectories."""
        device = next(self.model.parameters()).device
        lp, ids = lp.to(device), ids.to(device)
        temperature = ctx.config.sampling.temperature
        root_masked = (ctx.state == ctx.mask_id).to(device)  # [K]
        noise_by_depth: dict[int, torch.Tensor] = {}

        def noise(depth: int) -> torch.Tensor:
            if depth not in noise_by_depth:
                step = ctx.step + depth
                noise_by_depth[depth] = step_noise_at_topk(ctx.config.seed, ctx.request, ctx.block, step, ids)
            return noise_by_depth[depth]

        def expand(states: list[torch.Tensor], depths: list[int]) -> list[list[Edge]]:
            nodes = torch.stack(states).to(device)  # [B, K]
            masked = nodes == ctx.mask_id
            b = nodes.shape[0]
            node_noise = torch.stack([noise(d) for d in depths]) if temperature > 0 else None  # [B, K, k]
            pred = predict(lp.expand(b, -1, -1), ids.expand(b, -1, -1), temperature, node_noise)
            feats, buckets = features(lp.expand(b, -1, -1), ids.expand(b, -1, -1), pred, masked, root_masked & ~masked, self.model.config.buckets)
            order = torch.log_softmax(self.model(feats, buckets, masked), dim=-1)  # [B, K]
            branch = pred.probs[..., 0] < self.gate  # [B, K]: uncertain token, try the runner-up too
            scores = order[..., None] + pred.probs.clamp_min(1e-12).log()  # [B, K, 2]
            scores[..., 1] = scores[..., 1].masked_fill(~branch, float("-inf"))
            return [_ranked_edges(scores[i], pred.tokens[i], budget=ctx.budget) for i in range(b)]

        return grow_best_first(ctx.state, ctx.budget, expand, self.gamma)


def _ranked_edges(scores: torch.Tensor, tokens: torch.Tensor, budget: int) -> list[Edge]:
    """The best `budget` finite edges of one node, best first. scores, tokens: [K, 2]."""
    flat = scores.flatten()  # [2K]
    top = torch.topk(flat, min(budget, flat.numel()))
    out = []
    for value, index in zip(top.values.tolist(), top.indices.tolist(), strict=True):
        if value == float("-inf"):
            break
        out.append(Edge(position=index // 2, token=int(tokens.flatten()[index]), logp=value))
    return out
