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
from spot.drafters.order_model import OrderModel, Prediction, features, predict, step_noise_at_topk
from spot.policy import topk_logprobs
from spot.tree import DraftTree, Edge, Frontier, grow_best_first


class SpotDrafter:
    """SPOT's drafter.

    model_depth: tree levels that get a fresh order-model call; a deeper node reuses its parent's
        order logits, renormalised over the positions still masked (a Plackett-Luce chain). With 1
        the model runs once per tree, at the root; None re-scores every node, which costs one
        sequential model call per popped placeholder. The tokens
        and their probabilities always come from the node's own step (its coupled noise).
        Default 1 (one call per tree). Measured with bench/drafter_replay.py on 62 held-out T = 0
        blocks of the embedded target, block 32, with a drafter trained on depths 0-7 (commits per
        verify forward, drafting seconds): budget 8: 2.39 in 2.1 s (1), 2.50 in 5.9 s (2), 2.61 in
        7.6 s (None); budget 20: 2.70 in 3.6 s (1), 2.76 in 10.7 s (2), 3.03 in 18.6 s (None).
        Re-scoring buys 4-12% more commits for 3-5x the drafting time, a loss whenever the
        drafter's time is not negligible against a verify forward. model_depth > 1 needs an order
        model trained on those depths (train-drafter --max-depth); the shipped ones saw depth 0 only.
    """

    def __init__(
        self,
        model: OrderModel,
        gate: float = 0.6,
        gamma: Sequence[float] | None = None,
        name: str = "spot",
        model_depth: int | None = 1,
    ) -> None:
        if not 0.0 <= gate <= 1.0:
            raise ValueError(f"token gate must be in [0, 1], got {gate}")
        if model_depth is not None and model_depth < 1:
            raise ValueError(f"model_depth must be >= 1 (the root needs the model) or None, got {model_depth}")
        self.model = model.eval()
        self.gate = gate
        self.gamma = tuple(gamma) if gamma else None
        self.name = name
        self.model_depth = model_depth

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
        # node id -> [K] its masked positions; the root's parent (-1) is the state of the stale logits,
        # so each node's last commit is where its parent was masked and it is not
        masked_at = {-1: root_masked if ctx.stale_state is None else (ctx.stale_state == ctx.mask_id).to(device)}
        noise_by_depth: dict[int, torch.Tensor] = {}
        order_logits: dict[int, torch.Tensor] = {}  # node id -> [K] logits it was scored with

        def noise(depth: int) -> torch.Tensor:
            if depth not in noise_by_depth:
                step = ctx.step + depth
                noise_by_depth[depth] = step_noise_at_topk(ctx.config.seed, ctx.request, ctx.block, step, ids)
            return noise_by_depth[depth]

        def expand(frontier: Frontier) -> list[list[Edge]]:
            nodes = frontier.states.to(device)  # [B, K]
            masked = nodes == ctx.mask_id
            masked_at.update(zip(frontier.nodes, masked, strict=True))
            last = torch.stack([masked_at[p] for p in frontier.parents]) & ~masked  # [B, K]
            b = nodes.shape[0]
            node_noise = torch.stack([noise(d) for d in frontier.depths]) if temperature > 0 else None  # [B, K, k]
            pred = predict(lp.expand(b, -1, -1), ids.expand(b, -1, -1), temperature, node_noise)
            fresh = [i for i, d in enumerate(frontier.depths) if self.model_depth is None or d < self.model_depth]
            logits = torch.empty(b, nodes.shape[1], device=device)  # [B, K]
            if fresh:
                sub = Prediction(pred.tokens[fresh], pred.probs[fresh])
                feats, buckets = features(
                    lp.expand(len(fresh), -1, -1), ids.expand(len(fresh), -1, -1), sub, masked[fresh],
                    root_masked & ~masked[fresh], last[fresh], self.model.config.buckets,
                )
                logits[fresh] = self.model(feats, buckets, masked[fresh])
            for i, (node, parent) in enumerate(zip(frontier.nodes, frontier.parents, strict=True)):
                if i not in fresh:
                    logits[i] = order_logits[parent]
                order_logits[node] = logits[i]
            order = torch.log_softmax(logits.masked_fill(~masked, float("-inf")), dim=-1)  # [B, K]
            branch = pred.probs[..., 0] < self.gate  # [B, K]: uncertain token, try the runner-up too
            scores = order[..., None] + pred.probs.clamp_min(1e-12).log()  # [B, K, 2]
            scores[..., 1] = scores[..., 1].masked_fill(~branch, float("-inf"))
            scores = scores.masked_fill(~masked[..., None], float("-inf"))  # also clears all-committed rows' NaN
            return _ranked_edges(scores.flatten(1), pred.tokens.flatten(1), ctx.budget)

        return grow_best_first(ctx.state, ctx.budget, expand, self.gamma)


def _ranked_edges(scores: torch.Tensor, tokens: torch.Tensor, budget: int) -> list[list[Edge]]:
    """Per node, its best `budget` finite edges, best first. scores, tokens: [B, 2K] (position-major)."""
    top = torch.topk(scores, min(budget, scores.shape[1]), dim=1)
    picked = tokens.gather(1, top.indices)
    out = []
    for values, indices, toks in zip(top.values.tolist(), top.indices.tolist(), picked.tolist(), strict=True):
        out.append([Edge(i // 2, t, v) for v, i, t in zip(values, indices, toks, strict=True) if v != float("-inf")])
    return out
