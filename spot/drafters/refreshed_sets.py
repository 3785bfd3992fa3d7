"""SPOT-RS: SPOT-Sets' tree with refreshed distributions [INF: our design].

SPOT-Sets scores every node of its tree from the root's stale distribution (spot.drafters.sets), d + 1 steps stale at
depth d. SPOT-R's refresh head (spot.drafters.refresh) gives a node the distribution the target would have at the
node's own state, from what the node's path committed since the stale forward; a node is accepted only when its
path was right, so the drafter may read the path's commits as the target's. Here a threshold node reads it: its
tokens are the refreshed distribution's draw under the node step's noise, and its inclusion probabilities the
stale-confidence rule (spot.drafters.sets.StaleSets) on that draw's refreshed confidence c_p:

    logit pi_p = a_d (log c_p - log tau) + b_d + e_d [p is the node's most confident masked position],

with (a_d, b_d, e_d) fitted per depth by likelihood on threshold trajectories whose hidden states were recorded in
the head's own projection (spot.drafters.sets.fit_stale_sets reading `refreshed_set_examples`). One head call per
frontier of the best-first growth, no set model.

Shapes: F nodes, K block length, k top-k, R hidden components.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from spot.drafters.order_examples import RecordedBlock
from spot.drafters.order_model import step_noise_at_topk
from spot.drafters.refresh import RefreshedTokens
from spot.drafters.sets import Nodes, StaleSets


class RefreshedSets:
    """The refreshed-confidence set predictor (spot.drafters.sets.SetPredictor): the refresh head and the rule."""

    def __init__(self, tokens: RefreshedTokens, rule: StaleSets) -> None:
        self.tokens = tokens
        self.rule = rule
        self.topk = tokens.head.config.topk
        self.device = tokens.device

    @torch.inference_mode()
    def node_sets(self, groups: Sequence[Nodes]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per group (one draft's nodes), the rule's inclusion probabilities [F, K] and the refreshed draws [F, K]."""
        out = []
        for g in groups:
            stale = g.stale
            if stale.hidden is None:
                raise ValueError("SPOT-RS reads the target's hidden states behind the stale logits, which this target "
                                 "does not expose")
            noise = None
            if stale.noise is not None:  # [F, K, k] each node step's noise at the stale top-k
                noise = stale.noise[torch.tensor([min(d, stale.noise.shape[0] - 1) for d in g.depths], device=self.device)]
            fresh = self.tokens.refreshed(stale.lp, stale.ids, self.tokens.hidden(stale.hidden), stale.stale_state,
                                          g.states, g.depths, stale.temperature, noise).prediction
            probs = [self.rule.probs(c, m, d, stale.threshold) for c, m, d in zip(fresh.probs[..., 0], g.masked, g.depths, strict=True)]
            out.append((torch.stack(probs), fresh.tokens[..., 0]))
        return out


def refreshed_set_examples(blocks: Sequence[RecordedBlock], tokens: RefreshedTokens,
                           depth: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """spot.drafters.sets.set_examples with the refreshed confidence: every (root step s >= 1, depth d) of the blocks,
    the confidence of the token the node's step draws under the head's distribution for the node (the true state of
    step s + d, drafted from the forward behind step s - 1), the node's masked positions and the set step s + d
    committed. The blocks' hidden states must be in the head's projection. Returns ([B, K] float64, [B, K] bool,
    [B, K] bool)."""
    conf, masked, chosen = [], [], []
    k = tokens.head.config.topk
    for block in blocks:
        if block.hidden is None or block.topk_ids.shape[-1] < k:
            raise ValueError(f"fitting SPOT-RS needs threshold trajectories with hidden states and a top-{k} (collect "
                             f"--projections-from SPOT_R.pt --topk {k} or more), got top-{block.topk_ids.shape[-1]}"
                             f"{'' if block.hidden is not None else ' without hidden states'}")
        n_steps = block.states.shape[0] - 1
        for s in range(1, n_steps - depth):
            lp, ids = block.topk_logprobs[s - 1, :, :k].float(), block.topk_ids[s - 1, :, :k].long()  # [K, k]
            noise = None
            if block.temperature > 0:
                noise = step_noise_at_topk(block.seed, block.request, block.block, [s + depth], ids)  # [1, K, k]
            node, after = block.states[s + depth], block.states[s + depth + 1]
            fresh = tokens.refreshed(lp, ids, block.hidden[s - 1].float(), block.states[s - 1], node[None], [depth],
                                     block.temperature, noise).prediction
            conf.append(fresh.probs[0, :, 0].double())
            masked.append(node == block.mask_id)
            chosen.append((node == block.mask_id) & (after != block.mask_id))
    if not conf:
        return torch.empty(0, 0, dtype=torch.float64), torch.empty(0, 0, dtype=torch.bool), torch.empty(0, 0, dtype=torch.bool)
    return torch.stack(conf), torch.stack(masked), torch.stack(chosen)
