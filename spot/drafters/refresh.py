"""SPOT-R: SPOT's tree with refreshed tokens.

Every other drafter here takes a node's token from the last forward's distribution, d + 1 steps stale at depth d,
and on the embedded target that token stops being the one the target writes within a few steps
(bench/token_drift.py). A node is accepted only when every node above it was right, so a drafter may read the
path's own commits as the target's: the refresh head re-ranks the stale top-k at each masked position of a node
from what the path (and the target's last real step) committed beside it since the stale forward, the stale
hidden state there and the staleness, trained on the target's fresh distribution at that position
(spot.drafters.refresh_training). Each node is then read as a root whose logits are fresh: its tokens are the
refreshed distribution's draw under the node step's noise, and SPOT's order model, given that distribution where
it reads the stale one at a root, scores its positions. One head call and one order-model call per frontier of
the best-first growth (SPOT calls the model once per tree).

Per position of a node, the head reads:
    the stale top-k log-probabilities and ids (the candidates);
    the stale hidden state, projected (spot.drafters.set_model.Projection);
    the projected embeddings of the tokens committed since the stale forward at the positions within 3 of it;
    the staleness Δ = depth + 1 (capped at the largest it was trained on).
It gives the candidates' fresh log-probabilities (their share among the candidates, and the mass they hold), drawn
from as the stale top-k is (spot.drafters.order_model.predict: plus the node step's coupled noise at T > 0).

Shapes: B nodes, K block length, k top-k, R hidden components, E embedding components.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from spot.drafters.order_model import Prediction, predict, step_noise_at_topk
from spot.drafters.set_model import Projection

OFFSETS = (-3, -2, -1, 1, 2, 3)  # the neighbours whose new tokens the head reads
RADIUS = max(map(abs, OFFSETS))
WINDOW_AT = [offset + RADIUS for offset in OFFSETS]  # each offset's index in a position's window of 2 RADIUS + 1


@dataclass(frozen=True)
class RefreshConfig:
    topk: int = 32
    hidden_dims: int = 64
    embedding_dims: int = 32
    max_staleness: int = 8  # Δ beyond it reads as this (a budget-8 tree's deepest node)
    width: int = 64

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RefreshInputs:
    """What the head reads for N rows (a row: one position of one node).

    lp, ids: [N, k] the stale top-k; hidden: [N, R] projected; near_tokens: [N, 6] the token at each of OFFSETS
    (0 where nothing new); near_new: [N, 6] float, 1 where that neighbour was committed since the stale forward;
    staleness: [N] int64."""

    lp: torch.Tensor
    ids: torch.Tensor
    hidden: torch.Tensor
    near_tokens: torch.Tensor
    near_new: torch.Tensor
    staleness: torch.Tensor


def neighbours(states: torch.Tensor, stale_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For node states [B, K] and the stale forward's state [K]: the tokens at each position's OFFSETS
    neighbours that changed since ([B, K, 6], 0 elsewhere) and where they did ([B, K, 6] float)."""
    # every position's window p - RADIUS .. p + RADIUS, padded with "nothing new" past the block's ends: one gather,
    # not a loop of slices (a tree node refreshes once per frontier of its growth, so this runs per node)
    new = F.pad(states != stale_state, (RADIUS, RADIUS)).unfold(1, 2 * RADIUS + 1, 1)[..., WINDOW_AT]  # [B, K, 6]
    near = F.pad(states, (RADIUS, RADIUS)).unfold(1, 2 * RADIUS + 1, 1)[..., WINDOW_AT]  # [B, K, 6]
    return torch.where(new, near, 0), new.float()


class RefreshHead(nn.Module):
    """The candidates' fresh log-probabilities: log_softmax over the candidates of a * stale log-probability + rank
    bias + <candidate's embedding, z>, plus the log of the fresh mass the candidates hold; z mixes the stale hidden
    state, the new neighbours (a linear map per offset) and Δ. About 15,000 parameters at the defaults."""

    def __init__(self, config: RefreshConfig, token_coords: torch.Tensor) -> None:
        super().__init__()
        self.config = config
        self.register_buffer("coords", token_coords.float(), persistent=False)  # [V, E] the target's, not learned
        e = config.embedding_dims
        self.neighbour = nn.Parameter(torch.zeros(len(OFFSETS), e, e))
        self.staleness = nn.Embedding(config.max_staleness + 1, 8)
        self.mix = nn.Sequential(nn.Linear(config.hidden_dims + e + 8, config.width), nn.GELU())
        self.query = nn.Linear(config.width, e)
        self.mass = nn.Linear(config.width, 1)
        self.scale = nn.Parameter(torch.ones(()))
        self.rank = nn.Parameter(torch.zeros(config.topk))

    def forward(self, x: RefreshInputs) -> torch.Tensor:
        """[N, k] the candidates' fresh log-probabilities (over the whole vocabulary)."""
        near = torch.einsum("no,noe,oef->nf", x.near_new, self.coords[x.near_tokens], self.neighbour)  # [N, E]
        delta = self.staleness(x.staleness.clamp(max=self.config.max_staleness))  # [N, 8]
        z = self.mix(torch.cat([x.hidden, near, delta], -1))  # [N, width]
        scores = self.scale * x.lp + torch.einsum("nke,ne->nk", self.coords[x.ids], self.query(z)) + self.rank
        mass = -nn.functional.softplus(-self.mass(z))  # [N, 1] log of a share: <= 0
        return scores.log_softmax(-1) + mass


@dataclass(frozen=True)
class Refreshed:
    """B nodes' refreshed distributions: lp, ids [B, K, k] the candidates' fresh log-probabilities, sorted (as the
    stale top-k is), and each node's Prediction [B, K, 2] under its step's noise (spot.drafters.order_model.predict,
    as the stale tokens are drawn)."""

    lp: torch.Tensor
    ids: torch.Tensor
    prediction: Prediction


@dataclass(frozen=True)
class RefreshedTokens:
    """The head with the target's projections: what SpotDrafter's `tokens` reads to give each node its own tokens."""

    head: RefreshHead
    hidden: Projection

    @property
    def device(self) -> torch.device:
        return next(self.head.parameters()).device

    @torch.inference_mode()
    def project(self, ctx) -> torch.Tensor:
        """[K, R] a DraftContext's stale hidden states, projected: what every node of its tree reads."""
        if ctx.stale_hidden is None:
            raise ValueError("SPOT-R reads the target's hidden states behind the stale logits (DraftContext.stale_hidden), "
                             "and this context has none: draft it from the engine, which hands them over")
        return self.hidden(ctx.stale_hidden.to(self.device))

    @torch.inference_mode()
    def refresh(self, root, states: torch.Tensor, depths: Sequence[int]) -> Refreshed:
        """The refreshed distributions of a SpotDrafter root's nodes (its ctx, stale top-k lp and ids [K, k], its
        projected hidden states [K, R]) with states [B, K] at `depths`."""
        ctx = root.ctx
        noise = None
        if ctx.config.sampling.temperature > 0:  # the node's step's coupled noise at the candidates
            noise = step_noise_at_topk(ctx.config.seed, ctx.request, ctx.block, [ctx.step + d for d in depths], root.ids)
        return self.refreshed(root.lp, root.ids, root.hidden, ctx.stale_state.to(states.device), states, depths,
                              ctx.config.sampling.temperature, noise)

    @torch.inference_mode()
    def refreshed(self, lp: torch.Tensor, ids: torch.Tensor, hidden: torch.Tensor, stale_state: torch.Tensor,
                  states: torch.Tensor, depths: Sequence[int], temperature: float, noise: torch.Tensor | None) -> Refreshed:
        """The refreshed distributions of B nodes with states [B, K] at `depths`, drafted from the stale forward on
        stale_state [K] (its top-k lp, ids [K, k] and projected hidden states [K, R]); noise [B, K, k]: each node
        step's noise at `ids` (None at T = 0)."""
        b, k = states.shape
        near_tokens, near_new = neighbours(states, stale_state)  # [B, K, 6] each
        staleness = torch.tensor([d + 1 for d in depths], device=states.device).repeat_interleave(k)  # [B * K]
        every = lambda x: x.expand(b, -1, -1).flatten(0, 1)  # noqa: E731  [B * K, ...]: a view for one node, most frontiers
        rows = RefreshInputs(every(lp), every(ids), every(hidden), near_tokens.flatten(0, 1), near_new.flatten(0, 1), staleness)
        fresh = self.head(rows).view(b, k, -1)  # [B, K, k]
        lp, order = fresh.sort(dim=-1, descending=True, stable=True)
        ids = ids.expand(b, -1, -1).gather(-1, order)
        return Refreshed(lp, ids, predict(lp, ids, temperature, None if noise is None else noise.gather(-1, order)))
