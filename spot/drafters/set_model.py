"""SPOT-Sets' learned set model: which masked positions does a node's next threshold step commit, and with
which tokens? [SRC: the size, 5.1M parameters in 6 layers of d_model 256, and what it reads; INF: the
features, heads and losses below are this project's design.]

A transformer over the block's K positions. Per position it reads
    the order model's inputs (spot.drafters.order_model.features): the stale top-k log-probabilities, the
        drawn token's confidence and margins, the node's masks, its writing front and the trend;
    the drawn token's embedding, projected on the first principal components of the target's token
        embeddings;
    the stale last hidden state (the target's LM-head input behind the stale logits), projected on the
        first principal components of hidden states recorded on the target's own trajectories.
Both projections are whitened (unit variance per component) and belong to the target: they travel
with the model, and calibrating the model for another target refits them.

Outputs per position:
    inclusion: the logit of "the node's next step commits this position" (its sigmoid is pi, the
        product rule's inclusion probability, spot.drafters.sets);
    token scores over the stale top-k slots: the stale log-probabilities plus a learned correction, the
        fresh log-probabilities as the model expects them after the node's commits. The node's token is
        their Gumbel-max under the node step's noise (T > 0) or their argmax: the verifier's coupled
        draw, so the model guesses the token the target will draw, not just a likely one.

Shapes: B batch, K block length, k top-k, d target hidden size, F features.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from spot.drafters.order_model import N_SCALARS, Prediction, Prior, encode, features, layer_linear


@dataclass(frozen=True)
class Projection:
    """x -> (x - mean) @ basis: the first R principal components of some rows, whitened.

    mean: [d]; basis: [d, R], each column a principal direction divided by the square root of its
    variance (so each coordinate has unit variance on the fitted rows).
    """

    mean: torch.Tensor
    basis: torch.Tensor

    @property
    def dims(self) -> int:
        return self.basis.shape[1]

    @staticmethod
    def fit(rows: torch.Tensor, dims: int) -> Projection:
        """PCA of rows [N, d] (by the eigendecomposition of their covariance, in float64). Each direction's
        sign is fixed (its largest entry positive), so that equal rows give equal projections."""
        if not 1 <= dims <= rows.shape[-1]:
            raise ValueError(f"a projection on {dims} components needs 1 <= dims <= {rows.shape[-1]} (the rows' width)")
        if rows.shape[0] < 2:
            raise ValueError(f"fitting a projection needs >= 2 rows, got {rows.shape[0]}")
        x = rows.double()
        mean = x.mean(0)
        centred = x - mean
        values, vectors = torch.linalg.eigh(centred.T @ centred / (x.shape[0] - 1))  # ascending
        values, vectors = values.flip(0)[:dims], vectors.flip(1)[:, :dims]  # [R], [d, R]
        sign = vectors.gather(0, vectors.abs().argmax(0, keepdim=True)).sign()  # [1, R]
        basis = vectors * sign / values.clamp_min(1e-12).sqrt()
        return Projection(mean.float(), basis.float())

    @staticmethod
    def identity(dims: int) -> Projection:
        """x -> x on `dims` components: what reads rows already projected (recorded trajectories' hidden states)."""
        return Projection(torch.zeros(dims), torch.eye(dims))

    def same(self, other: Projection) -> bool:
        """Whether both project alike: the same mean and basis, bit for bit."""
        return torch.equal(self.mean, other.mean) and torch.equal(self.basis, other.basis)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """[..., d] -> [..., R] float32."""
        return (x.float() - self.mean.to(x.device)) @ self.basis.to(x.device)

    def to_dict(self) -> dict[str, torch.Tensor]:
        return {"mean": self.mean, "basis": self.basis}

    @staticmethod
    def from_dict(raw: dict) -> Projection:
        return Projection(raw["mean"].float(), raw["basis"].float())


@dataclass(frozen=True)
class SetModelConfig:
    topk: int = 32
    d_model: int = 256
    heads: int = 8
    layers: int = 6
    ff: int = 1024
    buckets: int = 1024  # hashed token-id buckets
    max_block: int = 64
    embedding_dims: int = 32  # token-embedding principal components read
    hidden_dims: int = 64  # hidden-state principal components read

    @property
    def inputs(self) -> int:
        return self.topk + N_SCALARS + self.embedding_dims + self.hidden_dims

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class SetInputs:
    """The model's inputs for B nodes: feats [B, K, F] and token buckets [B, K]."""

    feats: torch.Tensor
    buckets: torch.Tensor


def set_inputs(
    config: SetModelConfig,
    topk_logprobs: torch.Tensor,
    topk_ids: torch.Tensor,
    prediction: Prediction,
    masked: torch.Tensor,
    hypothetical: torch.Tensor,
    last: torch.Tensor,
    prior: Prior | None,
    token_coords: torch.Tensor,
    hidden_coords: torch.Tensor,
) -> SetInputs:
    """Inputs for one or more nodes ([..., K] masks as in order_model.features; `last` may hold the
    several positions a set step committed).

    Args:
        token_coords: [V, R_e] every token's projected embedding.
        hidden_coords: [..., K, R_h] the projected stale hidden states.
    """
    base, buckets = features(topk_logprobs, topk_ids, prediction, masked, hypothetical, last, prior, config.buckets)
    drawn = token_coords[prediction.tokens[..., 0].to(token_coords.device)].to(base.device)  # [..., K, R_e]
    return SetInputs(torch.cat([base, drawn, hidden_coords.float().expand(*base.shape[:-1], -1)], dim=-1), buckets)


class SetModel(nn.Module):
    def __init__(self, config: SetModelConfig = SetModelConfig()) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.inputs = nn.Linear(config.inputs, d)
        self.position = nn.Embedding(config.max_block, d)
        self.token = nn.Embedding(config.buckets, d)
        layer = nn.TransformerEncoderLayer(d, config.heads, config.ff, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, config.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.inclusion = nn.Linear(d, 1)
        self.correction = nn.Linear(d, config.topk)
        for embedding in (self.position, self.token):
            nn.init.normal_(embedding.weight, std=0.02)  # as the order model's, for the same reason
        nn.init.zeros_(self.correction.weight)  # the token scores start as the stale log-probabilities
        nn.init.zeros_(self.correction.bias)

    def forward(self, inputs: SetInputs, topk_logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(inclusion logits [B, K], token scores [B, K, k]): topk_logprobs [B, K, k] the stale ones the
        scores correct."""
        k = inputs.feats.shape[1]
        if k > self.config.max_block:
            raise ValueError(f"block length {k} exceeds the set model's max_block {self.config.max_block}")
        linear = layer_linear(self)
        positions = torch.arange(k, device=inputs.feats.device)
        h = linear(inputs.feats, self.inputs.weight, self.inputs.bias) + self.position(positions)[None] + self.token(inputs.buckets)  # [B, K, d]
        h = self.norm(encode(self.encoder, h, linear))
        inclusion = linear(h, self.inclusion.weight, self.inclusion.bias)[..., 0]  # [B, K]
        return inclusion, topk_logprobs.float() + linear(h, self.correction.weight, self.correction.bias)


class LearnedSets:
    """The set model as SetsDrafter's predictor (spot.drafters.sets.SetPredictor), with the target's two
    projections; `token_coords` [V, R_e] is every token's projected embedding (the embedding projection
    applied to the target's embedding matrix once, when the drafter is built)."""

    def __init__(self, model: SetModel, hidden: Projection, token_coords: torch.Tensor) -> None:
        config = model.config
        if (hidden.dims, token_coords.shape[-1]) != (config.hidden_dims, config.embedding_dims):
            raise ValueError(f"the set model reads {config.hidden_dims} hidden and {config.embedding_dims} embedding "
                             f"components; the projections give {hidden.dims} and {token_coords.shape[-1]}")
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.hidden = Projection(hidden.mean.to(self.device), hidden.basis.to(self.device))
        self.token_coords = token_coords.float().to(self.device)
        self.topk = config.topk

    @torch.inference_mode()
    def node_sets(self, groups) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """SetPredictor (spot.drafters.sets): every group's nodes in one model call. Each group's inputs and
        outputs are computed apart, and the model's rows do not depend on the others in the call
        (order_model.layer_linear), so that a group's scores are those of a call of its own."""
        if not groups:
            return []
        inputs, tops = [], []
        for g in groups:
            if g.stale.hidden is None:
                raise ValueError("the learned set model reads the target's hidden states, which this target does not expose")
            b = g.masked.shape[0]
            predictions = [g.stale.prediction(d) for d in g.depths]
            prediction = Prediction(*(torch.stack([getattr(p, f) for p in predictions]) for f in ("tokens", "probs", "margin")))
            lp, ids = g.stale.lp.expand(b, -1, -1), g.stale.ids.expand(b, -1, -1)  # [F, K, k]
            inputs.append(set_inputs(self.model.config, lp, ids, prediction, g.masked, g.stale.root_masked & ~g.masked, g.last,
                                     g.stale.prior, self.token_coords, self.hidden(g.stale.hidden)))
            tops.append(lp)
        sizes = [g.masked.shape[0] for g in groups]
        feats = torch.cat([i.feats for i in inputs])  # [sum F, K, F_in]
        inclusion, scores = self.model(SetInputs(feats, torch.cat([i.buckets for i in inputs])), torch.cat(tops))  # [sum F, K], [sum F, K, k]
        out = []
        for g, group_inclusion, group_scores in zip(groups, inclusion.split(sizes), scores.split(sizes), strict=True):
            noise = None
            if g.stale.noise is not None:
                noise = g.stale.noise[torch.tensor([min(d, g.stale.noise.shape[0] - 1) for d in g.depths], device=self.device)]
            tokens = draw_tokens(group_scores, g.stale.ids.expand(len(g.depths), -1, -1), g.stale.temperature, noise)  # [F, K]
            out.append((torch.sigmoid(group_inclusion.double()).masked_fill(~g.masked, 0.0), tokens))
        return out


def draw_tokens(scores: torch.Tensor, ids: torch.Tensor, temperature: float | torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
    """[..., K] the tokens the model's scores [..., K, k] draw over `ids` [..., K, k]: the verifier's coupled
    Gumbel-max under `noise` [..., K, k] (None or T = 0: argmax), on the model's expected fresh log-probabilities.
    `temperature`: one, or one per row broadcastable to [..., 1, 1] (training batches mix T = 0 and T > 0)."""
    ranking = scores.double()
    if noise is not None:
        t = torch.as_tensor(temperature, dtype=torch.float64, device=scores.device)
        ranking = torch.where(t > 0, ranking / t.clamp_min(1e-9) + noise, ranking)
    return ids.gather(-1, ranking.argmax(-1, keepdim=True))[..., 0]
