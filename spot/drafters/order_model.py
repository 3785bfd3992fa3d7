"""SPOT's order model: which masked position does the target commit next?

A 0.62M-parameter transformer (3 layers, d_model 128, 8 heads) over the block's K positions. It
reads only the target's own output distribution from the previous forward ("stale" top-32
log-probabilities per position), never the target's hidden states or the tokens' meaning beyond a
hashed id bucket. [INF: the published card names the size and the stale top-32 inputs; the exact
features below are this project's design.]

Per position the input is:
    the stale top-k log-probabilities (sorted, temperature 1, mask token excluded);
    the predicted token's confidence c under the node's step: at T > 0 the token is the Gumbel-max
        of (stale top-k logits / T + that step's counter-keyed noise), exactly the draw the target
        makes, so c tracks the target's real confidence; at T = 0 it is the stale top-1;
    log c, and whether the predicted token is the stale top-1;
    whether the position is masked in the node's state, and whether an earlier tree level
        hypothetically committed it (so one model scores every depth of the tree);
    whether the step into the node committed it (the tree edge into the node, or at the root the
        target's last real step): the target's next commit is often beside its last one, because
        a fresh token sharpens its neighbours' distributions, which the stale inputs cannot show;
    a learned embedding of the position in the block and of the predicted token's id bucket.
The output is a logit per position; the softmax over the node's masked positions is
P(committed next).

Shapes: B batch, K block length, k top-k, F features.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from spot.noise import gumbel_at, step_key

N_SCALARS = 7  # confidence, log-confidence, is-top-1, masked, hypothetically committed, confidence rank, last commit
LOGPROB_FLOOR = -30.0


@dataclass(frozen=True)
class OrderModelConfig:
    topk: int = 32
    d_model: int = 128
    heads: int = 8
    layers: int = 3
    ff: int = 512
    buckets: int = 128  # hashed token-id buckets
    max_block: int = 64

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Prediction:
    """What the stale distribution says the target writes at each position, under one step's noise.

    tokens: [..., K, 2] the first- and second-ranked token.
    probs: [..., K, 2] their probabilities under the stale (temperature-scaled) distribution.
    """

    tokens: torch.Tensor
    probs: torch.Tensor


def predict(
    topk_logprobs: torch.Tensor, topk_ids: torch.Tensor, temperature: float, noise: torch.Tensor | None
) -> Prediction:
    """Rank the stale top-k tokens the way the target draws: by logits / T + noise (T > 0) or by logits.

    Args:
        topk_logprobs, topk_ids: [..., K, k] stale log-softmax top-k (descending) and their ids.
        noise: [..., K, k] the step's Gumbel noise at those ids (None at T = 0).
    """
    if temperature > 0:
        z = topk_logprobs.double() / temperature
        probs = torch.softmax(z, dim=-1)  # renormalised over the top-k
        order = torch.topk(z + noise, 2, dim=-1).indices  # [..., K, 2]
    else:
        probs = topk_logprobs.double().exp()
        order = torch.arange(2, device=topk_ids.device).expand(*topk_ids.shape[:-1], 2)
    return Prediction(tokens=topk_ids.gather(-1, order), probs=probs.gather(-1, order).float())


def step_noise_at_topk(
    seed: int, request: int, block: int, step: int, topk_ids: torch.Tensor
) -> torch.Tensor:
    """The verifier's noise for one step, at the stale top-k ids only: [K, k] float64."""
    positions = torch.arange(topk_ids.shape[-2], device=topk_ids.device)[:, None]  # [K, 1]
    return gumbel_at(step_key(seed, request, block, step), positions, topk_ids)


def features(
    topk_logprobs: torch.Tensor,
    topk_ids: torch.Tensor,
    prediction: Prediction,
    masked: torch.Tensor,
    hypothetical: torch.Tensor,
    last: torch.Tensor,
    buckets: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Model inputs for one or more nodes.

    Args:
        topk_logprobs, topk_ids: [..., K, k] stale log-probabilities and their token ids.
        prediction: the node step's Prediction ([..., K, 2]).
        masked: [..., K] bool, masked in the node's state.
        hypothetical: [..., K] bool, committed by earlier tree levels (masked at the root).
        last: [..., K] bool, committed by the step into the node.
    Returns:
        (features [..., K, k + N_SCALARS] float32, token buckets [..., K] int64).
    """
    confidence = prediction.probs[..., 0].clamp_min(1e-12)  # [..., K]
    is_top1 = (prediction.tokens[..., 0] == topk_ids[..., 0]).float()
    # The rank of the confidence among the node's masked positions (0 = the most confident, ties to the
    # leftmost as in spot.policy.select): near-certain positions differ in confidence by 1e-4 or less,
    # which the model cannot resolve from the raw value, so without it the model fell below the
    # "argmax stale confidence" heuristic at depth 0.
    score = confidence.masked_fill(~masked, -1.0)
    order = torch.argsort(score, dim=-1, descending=True, stable=True)
    positions = torch.arange(score.shape[-1], device=score.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(-1, order, positions).float() / score.shape[-1]
    scalars = torch.stack(
        [confidence, confidence.log() / 10, is_top1, masked.float(), hypothetical.float(), rank, last.float()], dim=-1
    )  # [..., K, N_SCALARS]
    logprobs = topk_logprobs.float().clamp_min(LOGPROB_FLOOR) / 10  # [..., K, k]
    return torch.cat([logprobs, scalars], dim=-1), prediction.tokens[..., 0] % buckets


class OrderModel(nn.Module):
    def __init__(self, config: OrderModelConfig = OrderModelConfig()) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.inputs = nn.Linear(config.topk + N_SCALARS, d)
        self.position = nn.Embedding(config.max_block, d)
        self.token = nn.Embedding(config.buckets, d)
        layer = nn.TransformerEncoderLayer(d, config.heads, config.ff, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, config.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 1)

    def forward(self, feats: torch.Tensor, buckets: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """Logits of "committed next" per position.

        Args:
            feats: [B, K, F]; buckets: [B, K] int64; candidates: [B, K] bool (the node's masked positions).
        Returns:
            [B, K] float32, -inf where not a candidate.
        """
        k = feats.shape[1]
        if k > self.config.max_block:
            raise ValueError(f"block length {k} exceeds the order model's max_block {self.config.max_block}")
        positions = torch.arange(k, device=feats.device)
        h = self.inputs(feats) + self.position(positions)[None] + self.token(buckets)  # [B, K, d]
        h = self.norm(self.encoder(h))
        logits = self.head(h)[..., 0]  # [B, K]
        return logits.masked_fill(~candidates, float("-inf"))


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
