"""SPOT's order model: which masked position does the target commit next?

A 0.62M-parameter transformer (3 layers, d_model 128, 8 heads) over the block's K positions. It
reads only the target's own output distributions: the one behind the root's step ("stale" top-32
log-probabilities per position) and the top-1 of the one before it ("prior"), never the target's
hidden states or the tokens' meaning beyond a hashed id bucket. [INF: the published card names the size and the stale top-32 inputs; the exact
features below are this project's design.]

Per position the input is:
    the stale top-k log-probabilities (sorted, temperature 1, mask token excluded);
    the predicted token's confidence c under the node's step: at T > 0 the token is the Gumbel-max
        of (stale top-k logits / T + that step's counter-keyed noise), exactly the draw the target
        makes, so c tracks the target's real confidence; at T = 0 it is the stale top-1;
    log c, and whether the predicted token is the stale top-1;
    the runner-up token's probability, and the margin by which the predicted token leads the
        runner-up in the ranking score (logits / T + noise, or the log-probability gap at T = 0):
        how firmly the predicted token, and so its confidence, will hold when the logits move;
    whether the position is masked in the node's state, and whether an earlier tree level
        hypothetically committed it (so one model scores every depth of the tree);
    the rank of c among the node's masked positions;
    whether the step into the node committed it (the tree edge into the node, or at the root the
        target's last real step): the target's next commit is often beside its last one, because
        a fresh token sharpens its neighbours' distributions, which the stale inputs cannot show;
    the signed distance to that last commit and the distances to the nearest committed position
        on either side (the block's writing front);
    the trend since the forward before the stale one ("prior"): the change of the top-1
        log-probability, whether the top-1 token is the same, and whether a prior exists (a
        block's second step has none);
    a learned embedding of the position in the block and of the predicted token's id bucket.
The output is a logit per position; the softmax over the node's masked positions is
P(committed next).

Shapes: B batch, K block length, k top-k, F features.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from spot.noise import gumbel_at, step_key
from spot.targets import rows

# The scalar inputs per position, in feature order after the k log-probabilities.
SCALARS = (
    "confidence", "log_confidence", "is_top1", "runner_up", "margin", "masked", "hypothetical", "rank",
    "last_commit", "to_last_commit", "to_committed_left", "to_committed_right", "prior_rise", "prior_same", "prior_present",
)
N_SCALARS = len(SCALARS)
LOGPROB_FLOOR = -30.0
MARGIN_CAP = 20.0  # ranking margins beyond this are "certain" for the model's purpose


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
    margin: [..., K] the first-ranked token's lead in the ranking score (>= 0).
    """

    tokens: torch.Tensor
    probs: torch.Tensor
    margin: torch.Tensor


@dataclass(frozen=True)
class Prior:
    """The top-1 of the forward before the stale one, per position: logprobs [..., K], ids [..., K];
    present [...] bool, False where there was none (a block's second step)."""

    logprobs: torch.Tensor
    ids: torch.Tensor
    present: torch.Tensor


def predict(
    topk_logprobs: torch.Tensor, topk_ids: torch.Tensor, temperature: float, noise: torch.Tensor | None
) -> Prediction:
    """Rank the stale top-k tokens the way the target draws: by logits / T + noise (T > 0) or by logits.

    The probabilities are the target's confidences, softmax(logits / T) over the whole vocabulary.
    Only the top-k is known; the rest of the vocabulary holds 1 - sum(exp(top-k log-probs)) of the
    mass at T = 1, and is counted as if it all sat at the k-th log-probability: exact at T = 1, an
    upper bound of the tail's share below it and a lower bound above. (Renormalising over the top-k
    alone overstates a confidence by the position's tail mass, about 19% on the embedded target at
    T = 1, which varies between positions: it cost the "argmax confidence" heuristic 0.04 of
    next-commit accuracy there.)

    Args:
        topk_logprobs, topk_ids: [..., K, k] stale log-softmax top-k (descending) and their ids.
        noise: [..., K, k] the step's Gumbel noise at those ids (None at T = 0).
    """
    if temperature > 0:
        lp = topk_logprobs.double()
        z = lp / temperature
        tail = (1.0 - lp.exp().sum(-1)).clamp_min(0.0).log() + lp[..., -1] * (1.0 / temperature - 1.0)  # [..., K]
        probs = (z - torch.logaddexp(torch.logsumexp(z, dim=-1), tail)[..., None]).exp()
        ranked = torch.topk(z + noise, 2, dim=-1)  # [..., K, 2]
        order, margin = ranked.indices, ranked.values[..., 0] - ranked.values[..., 1]
    else:
        probs = topk_logprobs.double().exp()
        order = torch.arange(2, device=topk_ids.device).expand(*topk_ids.shape[:-1], 2)
        margin = topk_logprobs[..., 0].double() - topk_logprobs[..., 1].double()
    return Prediction(tokens=topk_ids.gather(-1, order), probs=probs.gather(-1, order).float(), margin=margin.float())


def step_noise_at_topk(
    seed: int, request: int, block: int, step: int | Sequence[int], topk_ids: torch.Tensor
) -> torch.Tensor:
    """The verifier's noise for one step at the stale top-k ids only ([K, k] float64), or for
    several steps in one batched draw ([D, K, k] for D steps; topk_ids: [K, k] shared by every
    step, or [D, K, k] one set per step)."""
    positions = torch.arange(topk_ids.shape[-2], device=topk_ids.device)[:, None]  # [K, 1]
    if isinstance(step, int):
        return gumbel_at(step_key(seed, request, block, step), positions, topk_ids)
    keys = torch.tensor([step_key(seed, request, block, s) for s in step], device=topk_ids.device)
    return gumbel_at(keys[:, None, None], positions, topk_ids)


def depth_noise(ids: torch.Tensor, ctx, temperature: float) -> torch.Tensor | None:
    """[D, K, k] the verifier's noise at the stale top-k ids (ids: [K, k]) for every step a tree grown
    from `ctx` (a spot.drafters.base.DraftContext) can reach: depth d stands for step ctx.step + d, and a
    tree of budget B has nodes down to depth min(B, masked positions). None at T = 0 (no noise). One
    batched draw of all of them costs about two single draws (about 0.1 ms each on a CPU), less than the
    three or more a tree asks for one by one."""
    if temperature == 0:
        return None
    depths = min(ctx.budget, int((ctx.state == ctx.mask_id).sum())) + 1
    return step_noise_at_topk(ctx.config.seed, ctx.request, ctx.block, range(ctx.step, ctx.step + depths), ids)


def depth_predictions(lp: torch.Tensor, ids: torch.Tensor, ctx, temperature: float) -> list[Prediction]:
    """The Prediction of every depth `depth_noise` covers (one at T = 0, where the ranking has no noise),
    ranked under that step's noise (the verifier's coupled draw). lp, ids: [K, k]."""
    return predictions_under(lp, ids, depth_noise(ids, ctx, temperature), temperature)


def predictions_under(lp: torch.Tensor, ids: torch.Tensor, noise: torch.Tensor | None, temperature: float) -> list[Prediction]:
    """depth_predictions for noise already drawn ([D, K, k], or None at T = 0)."""
    if noise is None:
        return [predict(lp, ids, temperature, None)]
    depths = noise.shape[0]
    batch = predict(lp.expand(depths, -1, -1), ids.expand(depths, -1, -1), temperature, noise)  # [D, K, 2]
    return [Prediction(batch.tokens[d], batch.probs[d], batch.margin[d]) for d in range(depths)]


def features(
    topk_logprobs: torch.Tensor,
    topk_ids: torch.Tensor,
    prediction: Prediction,
    masked: torch.Tensor,
    hypothetical: torch.Tensor,
    last: torch.Tensor,
    prior: Prior | None,
    buckets: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Model inputs for one or more nodes.

    Args:
        topk_logprobs, topk_ids: [..., K, k] stale log-probabilities and their token ids.
        prediction: the node step's Prediction ([..., K, 2]).
        masked: [..., K] bool, masked in the node's state.
        hypothetical: [..., K] bool, committed by earlier tree levels (masked at the root).
        last: [..., K] bool, committed by the step into the node (at most one position).
        prior: the top-1 of the forward before the stale one ([..., K]), None where none exists.
    Returns:
        (features [..., K, k + N_SCALARS] float32, token buckets [..., K] int64).
    """
    n = masked.shape[-1]
    confidence = prediction.probs[..., 0].clamp_min(1e-12)  # [..., K]
    is_top1 = (prediction.tokens[..., 0] == topk_ids[..., 0]).float()
    margin = prediction.margin.clamp(0.0, MARGIN_CAP) / MARGIN_CAP
    # The rank of the confidence among the node's masked positions (0 = the most confident, ties to the
    # leftmost as in spot.policy.select): near-certain positions differ in confidence by 1e-4 or less,
    # which the model cannot resolve from the raw value, so without it the model fell below the
    # "argmax stale confidence" heuristic at depth 0.
    score = confidence.masked_fill(~masked, -1.0)
    order = torch.argsort(score, dim=-1, descending=True, stable=True)
    index = torch.arange(n, device=masked.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(-1, order, index).float() / n
    # Distances (in blocks) to the last commit and to the nearest committed position on each side
    # (1 + the distance to the block's edge where there is none).
    to_last = (index - last.float().argmax(-1, keepdim=True)).float() / n * last.any(-1, keepdim=True)
    left = index - torch.where(~masked, index, -1).cummax(-1).values
    right = torch.where(~masked, index, n).flip(-1).cummin(-1).values.flip(-1) - index
    if prior is None:
        trend = torch.zeros(*masked.shape, 3, device=masked.device)
    else:
        present = prior.present[..., None].expand_as(masked).float()
        rise = (topk_logprobs[..., 0].float() - prior.logprobs.float()).clamp(-10.0, 10.0) / 10
        same = (prior.ids == topk_ids[..., 0]).float()
        trend = torch.stack([rise * present, same * present, present], dim=-1)
    scalars = torch.cat(
        [
            torch.stack(
                [confidence, confidence.log() / 10, is_top1, prediction.probs[..., 1], margin, masked.float(),
                 hypothetical.float(), rank, last.float(), to_last, left.float() / n, right.float() / n],
                dim=-1,
            ),
            trend,
        ],
        dim=-1,
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
        # Training only: each position's confidence at the target's real step (a logit of it), a dense
        # target beside the one label per example (spot.drafters.order_training).
        self.confidence_head = nn.Linear(d, 1)
        for embedding in (self.position, self.token):
            # nn.Embedding draws N(0, 1), about ten times the projected features in the residual
            # stream: that buries the inputs and slowed learning several-fold in our runs. (Drawn
            # after every layer, so a seeded model is the same as when training re-drew them.)
            nn.init.normal_(embedding.weight, std=0.02)

    def forward(self, feats: torch.Tensor, buckets: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """Logits of "committed next" per position.

        Args:
            feats: [B, K, F]; buckets: [B, K] int64; candidates: [B, K] bool (the node's masked positions).
        Returns:
            [B, K] float32, -inf where not a candidate.
        """
        return self.heads(feats, buckets, candidates)[0]

    def heads(self, feats: torch.Tensor, buckets: torch.Tensor, candidates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(order logits [B, K] as forward, confidence logits [B, K])."""
        k = feats.shape[1]
        if k > self.config.max_block:
            raise ValueError(f"block length {k} exceeds the order model's max_block {self.config.max_block}")
        linear = layer_linear(self)
        positions = torch.arange(k, device=feats.device)
        h = linear(feats, self.inputs.weight, self.inputs.bias) + self.position(positions)[None] + self.token(buckets)  # [B, K, d]
        h = self.norm(self.encode(h))
        logits = linear(h, self.head.weight, self.head.bias)[..., 0]  # [B, K]
        return logits.masked_fill(~candidates, float("-inf")), linear(h, self.confidence_head.weight, self.confidence_head.bias)[..., 0]

    def encode(self, h: torch.Tensor) -> torch.Tensor:
        return encode(self.encoder, h, layer_linear(self))


def layer_linear(model: nn.Module) -> Callable[..., torch.Tensor]:
    """The linear map a drafter's model runs its layers with: in eval mode on fixed chunks of rows
    (spot.targets.rows.linear), so that a node's output does not depend on how many other nodes or
    requests share the call (a matmul's kernel, and so its rounding, changes with the row count), which
    lets the engine batch the drafters of several requests and get each one's batch-1 tree; in training
    F.linear, whose large batches the chunks would slow."""
    return F.linear if model.training else rows.linear


def encode(encoder: nn.TransformerEncoder, h: torch.Tensor, linear: Callable[..., torch.Tensor] = F.linear) -> torch.Tensor:
    """The pre-norm encoder layers ([B, K, d] -> [B, K, d]) as plain ops on their parameters, every
    matmul through `linear` (layer_linear): nn.TransformerEncoder's own forward re-checks its fast-path
    conditions in Python on every call, which cost about a fifth of a drafting call's time at one tree
    per call (no dropout here: the models are built with dropout 0)."""
    b, k, d = h.shape
    for layer in encoder.layers:
        attn = layer.self_attn
        qkv = linear(layer.norm1(h), attn.in_proj_weight, attn.in_proj_bias)  # [B, K, 3d]
        q, key, v = qkv.view(b, k, 3, attn.num_heads, d // attn.num_heads).permute(2, 0, 3, 1, 4)  # [B, H, K, d/H] each
        mixed = F.scaled_dot_product_attention(q, key, v).transpose(1, 2).reshape(b, k, d)
        h = h + linear(mixed, attn.out_proj.weight, attn.out_proj.bias)
        hidden = F.relu(linear(layer.norm2(h), layer.linear1.weight, layer.linear1.bias))  # [B, K, ff]
        h = h + linear(hidden, layer.linear2.weight, layer.linear2.bias)
    return h


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
