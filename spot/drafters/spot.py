"""SPOT: grow predicted commit orders into a best-first tree of candidate block states.

For each node the order model gives P(next commit = p) over the node's masked positions; the
stale distribution, ranked with the node's step noise (the coupled draw), gives the token there.
An edge (p, v) scores log P_order(p) + log q(v | p), q the stale probability of v. A position
also branches on its second-ranked token when its first-ranked probability is below the token
gate (default 0.6); otherwise the budget goes to alternative orders. SPOT-gamma reweights each
depth's edge log-scores by a fitted exponent (spot.tree.grow_best_first's gamma). In mode "stale"
(spot.drafters.stale) the stale confidences stand in for the order model: no network call. SPOT-R
(spot.drafters.refresh) gives each node its own tokens, re-ranked from what its path committed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from spot.drafters.base import DraftContext
from spot.drafters.order_model import OrderModel, Prediction, Prior, depth_predictions, features
from spot.drafters.reach import ReachCalibration
from spot.drafters.refresh import RefreshedTokens
from spot.drafters.stale import StaleOrder
from spot.policy import topk_logprobs
from spot.tree import DraftTree, Edge, Frontier, grow_best_first


class SpotDrafter:
    """SPOT's drafter.

    reach: the calibration of path scores to the probability that the walk reaches a node
        (spot.drafters.reach); with it every tree carries `reach`, which budget=auto sizes by.
    stale: the stale-confidence order (spot.drafters.stale), which a DraftContext of mode "stale"
        drafts with instead of the model; budget=auto offers it when it carries a calibration.
    model_depth: tree levels that get a fresh order-model call; a deeper node reuses its parent's
        order logits, renormalised over the positions still masked (a Plackett-Luce chain). With 1
        the model runs once per tree, at the root; None re-scores every node, which costs one
        sequential model call per popped placeholder. The tokens and their probabilities always
        come from the node's own step (its coupled noise). Default 1 (one call per tree).
        Measured with bench/drafter_replay.py on 62 held-out T = 0 blocks of the embedded target,
        block 32, with a drafter trained on depths 0-7 (commits per verify forward, drafting
        seconds): budget 8: 2.39 in 1.5 s (1), 2.50 in 5.7 s (2), 2.61 in 8.4 s (None); budget
        20: 2.70 in 1.4 s (1), 2.76 in 6.7 s (2), 3.03 in 16.5 s (None). Re-scoring buys 4-12%
        more commits for 4-12x the drafting time, a loss whenever the drafter's time is not
        negligible against a verify forward. model_depth > 1 needs an order model trained on those
        depths (train-drafter --max-depth); the shipped ones saw depth 0 only.

    Nodes that share their order logits (every non-root node at model_depth 1) also share one
    ranked edge table per step's noise (one at T = 0), so such a node costs a walk over at most
    2K edges in Python, not a round of tensor operations: this cut the drafter's share of wall
    time at budget 8 from 10.5% to 8.7% with identical trees.

    tokens: SPOT-R's refreshed tokens (spot.drafters.refresh.RefreshedTokens): each node's tokens and their
        probabilities come from the refresh head on what the node's path committed, one head call per
        frontier, and each node gets its own edge table; its order logits, at the levels model_depth
        scores, come from the order model reading that refreshed distribution (None: every level), or
        in mode "stale" from the refreshed confidences (no model call); None: the stale draw of the
        node's step (SPOT).
    mode: the mode of a context that names none (budget=auto's plan names one per block): "model", or
        "stale", the confidences in place of the order model (needs `stale`, the fitted temperature).
    """

    def __init__(
        self,
        model: OrderModel,
        gate: float = 0.6,
        gamma: Sequence[float] | None = None,
        name: str = "spot",
        model_depth: int | None = 1,
        reach: ReachCalibration | None = None,
        stale: StaleOrder | None = None,
        tokens: RefreshedTokens | None = None,
        mode: str = "model",
    ) -> None:
        if not 0.0 <= gate <= 1.0:
            raise ValueError(f"token gate must be in [0, 1], got {gate}")
        if model_depth is not None and model_depth < 1:
            raise ValueError(f"model_depth must be >= 1 (the root needs the model) or None, got {model_depth}")
        if mode not in ("model", "stale") or (mode == "stale" and stale is None):
            raise ValueError(f"SPOT drafts in mode 'model', or 'stale' given the stale order's temperature; got {mode!r}"
                             f"{' without one' if mode == 'stale' else ''}")
        self.model = model.eval()
        self.mode = mode
        self.gate = gate
        self.gamma = tuple(gamma) if gamma else None
        self.reach = reach
        self.stale = stale
        self.name = name
        self.model_depth = model_depth
        self.tokens = tokens

    @property
    def modes(self) -> dict[str, tuple[float, ...]]:
        """The calibrated modes budget=auto may pick, each with its mean reach by best-first rank (what
        it expects before drafting): "model", and "stale" where the stale order is calibrated."""
        modes = {} if self.reach is None else {"model": self.reach.mean_reach}
        if self.stale is not None and self.stale.reach is not None:
            modes["stale"] = self.stale.reach.mean_reach
        return modes

    def draft(self, ctx: DraftContext) -> DraftTree:
        return self.draft_batch([ctx])[0]

    @torch.inference_mode()
    def draft_batch(self, ctxs: Sequence[DraftContext]) -> list[DraftTree]:
        """The trees of several requests' contexts (one target, so one block length), each the tree `draft`
        grows for it alone: the order model scores every root in one call, whose rows do not depend on the
        others in it (the model's layers are row-invariant in eval mode, spot.drafters.order_model)."""
        roots = [None if ctx.stale_logits is None else self._root(ctx, *self._stale_topk(ctx)) for ctx in ctxs]
        # SPOT-R scores every node, the root too, from its refreshed distribution (in _grow)
        scored = iter(self._root_logits([r for r in roots if r is not None]) if self.tokens is None else [None] * len(roots))
        # a block's first step has no distribution of this block yet: the root alone
        return [DraftTree.root_only(ctx.state) if r is None else self._grow(r, next(scored)) for ctx, r in zip(ctxs, roots, strict=True)]

    @torch.inference_mode()
    def grow(self, ctx: DraftContext, lp: torch.Tensor, ids: torch.Tensor, prior: Prior | None) -> DraftTree:
        """The tree from the stale top-k (lp, ids: [K, k]) and the prior's top-1 ([K] each, or None);
        also used offline on recorded trajectories."""
        root = self._root(ctx, lp, ids, prior)
        return self._grow(root, None if self.tokens is not None else self._root_logits([root])[0])

    def _mode(self, ctx: DraftContext) -> str:
        return ctx.mode or self.mode

    def _stale_topk(self, ctx: DraftContext) -> tuple[torch.Tensor, torch.Tensor, Prior | None]:
        """The stale top-k ([K, k] log-probabilities and ids) and the prior's top-1 the tree reads."""
        if self.tokens is not None and self._mode(ctx) == "stale":
            lp, ids = self._masked_topk(ctx)
        else:
            lp, ids = topk_logprobs(ctx.stale_logits, self.model.config.topk, ctx.mask_id)
        prior = None
        if ctx.prior_logits is not None and self._mode(ctx) != "stale":  # the stale order reads no trend
            prior_lp, prior_ids = topk_logprobs(ctx.prior_logits, 1, ctx.mask_id)
            prior = Prior(prior_lp[:, 0], prior_ids[:, 0], torch.tensor(True))
        return lp, ids, prior

    def _masked_topk(self, ctx: DraftContext) -> tuple[torch.Tensor, torch.Tensor]:
        """SPOT-RC's stale top-k ([K, k] each): the top-k, the costliest part of its draft, at the root's masked rows
        only, zeros at the others. Nothing reads those: with no order model, a committed position's order logit
        is -inf at every node, and each row of the refresh head reads its own inputs only (as each row of top-k)."""
        masked = (ctx.state == ctx.mask_id).cpu()  # [K]
        part_lp, part_ids = topk_logprobs(ctx.stale_logits[masked.to(ctx.stale_logits.device)], self.model.config.topk,
                                          ctx.mask_id)  # [M, k] each, on the CPU
        lp, ids = part_lp.new_zeros(masked.shape[0], part_lp.shape[1]), part_ids.new_zeros(masked.shape[0], part_ids.shape[1])
        lp[masked], ids[masked] = part_lp, part_ids
        return lp, ids

    def _root(self, ctx: DraftContext, lp: torch.Tensor, ids: torch.Tensor, prior: Prior | None) -> _Root:
        if ctx.mode not in (None, "model", "stale"):
            raise ValueError(f"SPOT drafts in mode 'model' or 'stale', not {ctx.mode!r}")
        if self._mode(ctx) == "stale" and self.stale is None:
            raise ValueError("mode 'stale' needs the stale order's temperature: calibrate the drafter (spot-eval calibrate-reach)")
        device = next(self.model.parameters()).device
        lp, ids = lp.to(device), ids.to(device)
        if prior is not None:
            prior = Prior(prior.logprobs.to(device), prior.ids.to(device), prior.present.to(device))
        masked = (ctx.state == ctx.mask_id).to(device)  # [K]
        before = masked if ctx.stale_state is None else (ctx.stale_state == ctx.mask_id).to(device)
        temperature = ctx.config.sampling.temperature
        hidden = None if self.tokens is None else self.tokens.project(ctx)  # once per tree, not per frontier
        # the stale draws of every depth, unless every node draws from its own refreshed distribution (SPOT-R)
        predictions = None if self.tokens is not None else depth_predictions(lp, ids, ctx, temperature)
        return _Root(ctx, lp, ids, prior, predictions, masked, before, hidden)

    def _root_logits(self, roots: Sequence[_Root]) -> list[torch.Tensor]:
        """[K] order logits per root: the stale order's, or the order model's, every root in one call."""
        out: dict[int, torch.Tensor] = {}
        modelled = []
        for i, root in enumerate(roots):
            if self._mode(root.ctx) == "stale":
                out[i] = self.stale.logits(root.prediction(0).probs[:, 0], root.masked)
            else:
                modelled.append(i)
        if modelled:
            inputs = [self._inputs(roots[i], roots[i].masked[None], roots[i].before[None] & ~roots[i].masked[None], [0])
                      for i in modelled]
            feats, buckets = (torch.cat(parts) for parts in zip(*inputs, strict=True))  # [R, K, F], [R, K]
            masked = torch.stack([roots[i].masked for i in modelled])  # [R, K]
            out.update(zip(modelled, self.model(feats, buckets, masked), strict=True))
        return [out[i] for i in range(len(roots))]

    def _inputs(self, root: _Root, masked: torch.Tensor, last: torch.Tensor, depths: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The order model's inputs for F nodes of root's tree (masked, last: [F, K]; their depths):
        features [F, K, k + N_SCALARS] and token buckets [F, K]."""
        f = len(depths)
        pred = [root.prediction(d) for d in depths]
        prediction = Prediction(*(torch.stack([getattr(p, name) for p in pred]) for name in ("tokens", "probs", "margin")))
        return features(root.lp.expand(f, -1, -1), root.ids.expand(f, -1, -1), prediction, masked, root.masked & ~masked, last,
                        root.prior, self.model.config.buckets)

    def _grow(self, root: _Root, root_logits: torch.Tensor | None) -> DraftTree:
        """Best-first growth of root's tree, the root scored by `root_logits` [K] (None: SPOT-R's, scored in growth)."""
        ctx, device = root.ctx, root.masked.device
        stale_mode = self._mode(ctx) == "stale"
        # node id -> [K] its masked positions; the root's parent (-1) is the state of the stale logits,
        # so each node's last commit is where its parent was masked and it is not
        masked_at = {-1: root.before, 0: root.masked}
        order_logits = {} if root_logits is None else {0: root_logits}  # node id -> [K] the order model's logits at that node
        scored_by: dict[int, int] = {}  # node id -> the node whose order logits score it (itself or an ancestor)
        tables: dict[tuple[int, int], list[tuple[float, int, int]]] = {}
        temperature = ctx.config.sampling.temperature
        refreshed: dict[int, Prediction] = {}  # SPOT-R: node id -> its own tokens

        def table(source: int, depth: int, node: int) -> list[tuple[float, int, int]]:
            """The (score, position, token) edges of the source's order logits and the node's tokens (the
            depth's stale draw, or SPOT-R's for the node itself), best first, before renormalising over
            a node's masked positions."""
            # a SPOT-R node's own table keys on ~node (negative), apart from the depths' shared ones
            key = (source, ~node) if node in refreshed else (source, depth if temperature > 0 else 0)
            if key not in tables:
                pred = refreshed[node] if node in refreshed else root.prediction(depth)
                branch = pred.probs[:, 0] < self.gate  # [K]: uncertain token, try the runner-up too
                token_lp = pred.probs.clamp_min(1e-12).log()  # [K, 2]
                token_lp[:, 1] = token_lp[:, 1].masked_fill(~branch, float("-inf"))
                scores = (order_logits[source][:, None] + token_lp).flatten()  # [2K] position-major
                ranked = torch.sort(scores, descending=True, stable=True)
                finite = ranked.values.isfinite()
                indices = ranked.indices[finite]
                tables[key] = list(zip(ranked.values[finite].tolist(), (indices // 2).tolist(),
                                       pred.tokens.flatten()[indices].tolist(), strict=True))
            return tables[key]

        def expand(frontier: Frontier) -> list[list[Edge]]:
            nodes = frontier.states.to(device)  # [B, K]
            masked = nodes == ctx.mask_id
            if self.tokens is not None:  # SPOT-R: every node's tokens and order from its own refreshed distribution
                fresh_at = self.tokens.refresh(root, nodes, frontier.depths)  # [B, K, ...]
                pred = fresh_at.prediction
                scored = [i for i, d in enumerate(frontier.depths) if self.model_depth is None or d < self.model_depth]
                if stale_mode:  # the refreshed confidences order every node: no model call
                    order_logits.update(zip(frontier.nodes, self.stale.logits(pred.probs[..., 0], masked), strict=True))
                elif scored:
                    masked_at.update(zip(frontier.nodes, masked, strict=True))
                    last = torch.stack([masked_at[p] for p in frontier.parents]) & ~masked  # [B, K]
                    # each node read as a root with fresh logits: the order model on its refreshed distribution, the
                    # root's stale top-1 as the forward before it (the model's trend input)
                    prior = Prior(root.lp[:, 0], root.ids[:, 0], torch.tensor(True, device=device))
                    feats, buckets = features(fresh_at.lp[scored], fresh_at.ids[scored],
                                              Prediction(pred.tokens[scored], pred.probs[scored], pred.margin[scored]),
                                              masked[scored], torch.zeros_like(masked[scored]), last[scored], prior,
                                              self.model.config.buckets)
                    logits = self.model(feats, buckets, masked[scored])
                    order_logits.update(zip((frontier.nodes[i] for i in scored), logits, strict=True))
                refreshed.update((n, Prediction(pred.tokens[i], pred.probs[i], pred.margin[i])) for i, n in enumerate(frontier.nodes))
            else:  # SPOT: the order model at the first levels, its logits reused below them
                fresh = [i for i, (n, d) in enumerate(zip(frontier.nodes, frontier.depths, strict=True))
                         if n not in order_logits and (self.model_depth is None or d < self.model_depth)]
                if fresh and stale_mode:
                    logits = self.stale.logits(torch.stack([root.prediction(frontier.depths[i]).probs[:, 0] for i in fresh]), masked[fresh])
                    order_logits.update(zip((frontier.nodes[i] for i in fresh), logits, strict=True))  # [F, K] no model call
                elif fresh:
                    masked_at.update((frontier.nodes[i], masked[i]) for i in fresh)
                    last = torch.stack([masked_at[frontier.parents[i]] for i in fresh]) & ~masked[fresh]  # [F, K]
                    feats, buckets = self._inputs(root, masked[fresh], last, [frontier.depths[i] for i in fresh])
                    logits = self.model(feats, buckets, masked[fresh])  # [F, K], -inf where committed
                    order_logits.update(zip((frontier.nodes[i] for i in fresh), logits, strict=True))
            out = []
            for i, (node, parent) in enumerate(zip(frontier.nodes, frontier.parents, strict=True)):
                scored_by[node] = node if node in order_logits else scored_by[parent]
                edges = table(scored_by[node], frontier.depths[i], node)
                out.append(_renormalised(edges, masked[i].tolist(), order_logits[scored_by[node]], ctx.budget))
            return out

        tree = grow_best_first(ctx.state, ctx.budget, expand, self.gamma)
        reach = self.stale.reach if stale_mode else self.reach
        return tree if reach is None else replace(tree, reach=(1.0, *reach(tree.scores[1:])))


@dataclass(frozen=True)
class _Root:
    """What a tree grown from one context reads, on the order model's device: the stale top-k (lp, ids:
    [K, k]; SPOT-RC's: zeros at the root's committed rows, which it never reads), the prior's top-1, the stale draw
    of every depth the tree can reach (None for SPOT-R), the root's masked positions [K] and the stale state's
    (`before`, [K])."""

    ctx: DraftContext
    lp: torch.Tensor
    ids: torch.Tensor
    prior: Prior | None
    predictions: list[Prediction] | None  # None for SPOT-R, whose nodes each read their own refreshed draw
    masked: torch.Tensor
    before: torch.Tensor
    hidden: torch.Tensor | None  # SPOT-R: [K, R] the stale hidden states, projected (RefreshedTokens.project)

    def prediction(self, depth: int) -> Prediction:  # [K, 2] tokens and probabilities under the step's noise
        return self.predictions[depth if self.ctx.config.sampling.temperature > 0 else 0]  # at T = 0 the ranking is the same at every depth


def _renormalised(table: list[tuple[float, int, int]], masked: list[bool], logits: torch.Tensor, budget: int) -> list[Edge]:
    """A node's best `budget` edges: the table's edges at its masked positions, with the order
    logits renormalised over those positions (a deeper node's Plackett-Luce step). logits: [K]."""
    kept = [v for v, m in zip(logits.tolist(), masked, strict=True) if m and v != float("-inf")]
    if not kept:
        return []
    top = max(kept)
    log_z = top + math.log(sum(math.exp(v - top) for v in kept))
    edges = []
    for score, position, token in table:
        if masked[position]:
            edges.append(Edge(position, token, score - log_z))
            if len(edges) == budget:
                break
    return edges
