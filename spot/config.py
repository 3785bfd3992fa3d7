"""Decoding configuration: frozen, validated once, shared by every method.

The draft-free decoder and every speculative method read the same `DecodeConfig`; a speculative
run differs from its reference only in `budget` and the drafter. Validation happens here so that
bad input fails with a message that names the field and the fix, before any tensor is touched.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads where a tensor is made: the command line builds its flags from this module first
    import torch

POLICIES = ("single", "threshold", "static", "dynamic", "timestep")
SCHEDULED = ("static", "dynamic")  # the policies that follow SDAR's per-step commit counts (`steps`)
STEPPED = (*SCHEDULED, "timestep")  # the policies that take `steps`
DREAM_EPS = 1e-3  # the last timestep of Dream's schedule, linspace(1, eps, steps + 1) (its generation_config default)
# The reference-rule options: away from their defaults, what a drafter trained under the defaults has not seen.
RULE_FIELDS = ("confidence", "mask_in_softmax", "first_token_commit", "alg_temp", "capped", "confidence_dtype", "eps",
               "tie_break")
ACCEPTANCES = ("exact", "max_commit")  # how the walk follows the target down a draft tree (spot.acceptance)
CONFIDENCES = ("probability", "margin", "entropy", "random")  # what ranks the masked positions (spot.policy.confidence_of)
CONFIDENCE_DTYPES = ("float64", "model")  # what the confidences are computed and ranked in (spot.policy.propose)
TIE_BREAKS = ("leftmost", "topk")  # which of exactly tied confidences a step commits first (spot.policy.select)
CACHES = ("dual", "prefix", "none", "nosuffix")  # a frozen-cache target's decoders (spot.targets.dual_cache)
SEED_LIMIT = 2**32  # the noise key mixes the seed as one 32-bit word (spot.noise): larger seeds would alias


@dataclass(frozen=True)
class Setting:
    """What a user sets a field by: every front door (lm_eval's model_args, `spot-eval decode`'s flags, the
    model_args reference) is generated from these (spot_eval.harness.options).

    help: one line on what it does. option: its name there, where it differs from the field's (the policy is
    `unmasking`). choices: its allowed values. unset: what leaving it unset means, where a front door may
    (the block length: the checkpoint's). aliases: older names a front door still takes. shown: how the docs
    name a default whose value is this machine's own (a path).
    """

    help: str
    option: str | None = None
    choices: tuple[str, ...] = ()
    unset: str | None = None
    aliases: tuple[str, ...] = ()
    shown: str | None = None


def setting(default: object, help: str, **how: object) -> object:
    """A dataclass field that users set (`Setting`'s fields as keywords)."""
    return field(default=default, metadata={"setting": Setting(help, **how)})


def _whole(name: str, value: object) -> None:
    """Integers only: a float (16.5, or lm-eval's 8.0) or a bool in an integer field is refused by name."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a whole number, got {value!r}")


def _finite(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


@dataclass(frozen=True)
class Sampling:
    """How a token is drawn at each masked position.

    temperature: 0 is argmax; T > 0 is Gumbel-max on logits / T with counter-keyed noise.
    top_k: keep the k most likely tokens (0 = off).
    top_p: keep the smallest set whose probability reaches p (1.0 = off; the top token is always kept).
    """

    temperature: float = setting(0.0, "sampling temperature T; 0 is greedy, above it a Gumbel-max draw with the coupled noise")
    top_k: int = setting(0, "keep the k most likely tokens before the draw (0: off)")
    top_p: float = setting(1.0, "keep the smallest set of tokens whose probability reaches p before the draw (1: off)")

    def __post_init__(self) -> None:
        _finite("temperature", self.temperature)
        _whole("top_k", self.top_k)
        _finite("top_p", self.top_p)
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")


@dataclass(frozen=True)
class DecodeConfig:
    """Everything that determines the draft-free output, plus the draft budget and the acceptance rule.

    policy: "single" commits the most confident masked position per step (SDAR
        low_confidence_static, one token per step); "threshold" also commits every masked
        position whose confidence is >= `threshold` (Fast-dLLM's parallel rule). SDAR's decoders:
        "static" commits the k_s most confident masked positions at step s of a block (SDAR's
        low_confidence_static), "dynamic" every masked position with confidence > `threshold`
        (strictly) when there are at least k_s of them, else the k_s most confident (SDAR's
        low_confidence_dynamic); k_s is SDAR's `get_num_transfer_tokens` split of the block into
        `steps` steps. "timestep" is Dream's schedule: step i of `steps` commits the int(n * (1 - s/t))
        most confident of the n masked positions, t and s its two timesteps of linspace(1, eps, steps + 1)
        in float32, and the last step all of them; a step may commit none (its forward then serves the
        next step too). With confidence "random" it is Dream's `origin`: each masked position is revealed
        with probability 1 - s/t. One block of gen_length is Dream's whole-sequence decoding.
    steps: denoising steps per block for static, dynamic, timestep and capped threshold (SDAR's
        `denoising_steps`, Dream's `steps`; None: the block length, one commit per step for static and dynamic).
    mask_in_softmax: the confidence's softmax (and top-k / top-p) also counts the mask token, as SDAR's, LLaDA's
        and Dream's generators compute it; False (the default) leaves it out. The mask is never drawn.
    first_token_commit: step 0 of every block commits only the block's first generated position, with the
        token drawn from the block-start forward, and the policy takes over from step 1 (Fast-dLLM's Dream
        generators, whose later block-only forwards cannot give that position shifted logits).
    alg_temp: timestep only, Dream's `alg_temp`: > 0 draws the positions to commit from
        softmax(confidence / alg_temp) without replacement (Gumbel-top-k on the step's coupled noise at the
        mask token), instead of taking the most confident.
    block_length: positions per block (K).
    gen_length: the most new tokens to produce.
    seed: the root of the counter-keyed noise; (seed, request) fixes the whole output.
    budget: draft nodes verified beside the current state per forward (0 = draft-free).
    stop_strings: the output is cut before the earliest of these (checked after each block).
    acceptance: "exact" (the default) accepts a drafted node only where it equals the state the target
        itself reaches, so the output is the draft-free decoder's. "max_commit" (lossy, opt-in, threshold
        policy only) also accepts a drafted subset of the target's step (spot.acceptance): its output
        differs from the draft-free decoder's by design, and then depends on the drafter and budget too.
    cross_block: where a drafted node finishes the block, the verify also holds the next block's first
        state behind it (a cross piece, [finished block | next block], block-causal inside), so that the
        forward that finishes a block also takes the next block's first step. Lossless (the output does not
        depend on it); block-causal targets only (spot.targets.base.Target.cross_block).
    stop_at_eos: end the request at the block that writes an EOS (True, what lm-eval users want, and
        faster); False writes every block to gen_length as LLaDA's, Dream's and Fast-dLLM's reference
        generators do: the EOS padding is decoded (and counted in forwards) and kept in the token ids, and
        the text is still the part before the first EOS.
    confidence: what ranks the masked positions, for every policy: "probability" of the drawn token (LLaDA's
        low_confidence, SDAR's, Dream's maskgit_plus), "margin" top-1 minus top-2 probability (Dream's
        topk_margin), "entropy" the negative entropy of the position's distribution (Dream's entropy),
        "random" a uniform draw per position from the counter-keyed noise (LLaDA's and Dream's random
        orders; lossless, since every node of a tree is scored with the same draw).
    capped: threshold only, Fast-dLLM's full-canvas Dream `confidence_threshold`: a step commits the most
        confident masked position and every other one at >= `threshold`, but only among its `cap(step, masked)`
        most confident: block_length / steps a step (needs `steps`), plus the part of their caps the steps
        before left unused (positions under the threshold); positions over it that do not fit wait for the
        next step. From the last of the `steps` steps on the cap is every masked position, and steps are
        added while any is left (the reference adds a step whenever its last one leaves any).
    confidence_dtype: what the confidences are computed, ranked and compared with the threshold in:
        "float64" (the default: no rounding beyond the logits', so two positions tie only where their logits
        make them equal) or "model", the model's own dtype, as LLaDA's generate.py, Dream's sample_tokens and
        SDAR's generator compute them: in bf16 many confidences then tie exactly (`tie_break` says which goes
        first) and the threshold is met as the dtype rounds it (0.9 as 0.8984375 in bf16). Lossless either way
        (verification applies the same rule).
    eps: timestep only, the last timestep of Dream's schedule linspace(1, eps, steps + 1) (Dream's `eps`).
    tie_break: which of exactly tied confidences a step commits first. "leftmost" (the default, the project's
        rule: an order that depends on nothing but the block). "topk": the references' own choice, torch.topk
        with their k on the tensor they rank, the block's confidences padded with -inf to the span of the
        canvas the reference holds at that step (Target.ranked_span), on the same device; its order among
        ties depends on that tensor's length and the device's kernel, not on the values alone, so only that
        call reproduces it. Lossless either way.
    """

    policy: str = setting("single", "the draft-free decoder every method reproduces: single | threshold (Fast-dLLM) | "
                          "static | dynamic (SDAR's low_confidence_static / _dynamic) | timestep (Dream's schedule)",
                          option="unmasking", choices=POLICIES, aliases=("policy",))
    threshold: float = setting(0.9, "the confidence threshold tau of threshold and dynamic")
    steps: int | None = setting(None, "denoising steps per block, for static and dynamic (SDAR's), timestep (Dream's) and "
                                      "threshold with capped (Fast-dLLM's Dream)",
                                unset="the block length")
    block_length: int = setting(32, "positions per block (K)", unset="the checkpoint's block_size")
    gen_length: int = setting(256, "the most new tokens to decode")
    sampling: Sampling = Sampling()
    seed: int = setting(0, "the root of the coupled noise: (seed, request) fixes the whole output; in [0, 2**32)")
    budget: int = 0
    stop_strings: tuple[str, ...] = ()
    acceptance: str = "exact"
    cross_block: bool = setting(False, "a drafted node that finishes its block carries the next block's first state into "
                                       "the verify (lossless; block-causal targets)")
    stop_at_eos: bool = setting(True, "end at the block that writes an EOS; false writes every block to gen_length, as "
                                      "LLaDA's, Dream's and Fast-dLLM's generators do")
    confidence: str = setting("probability", "what ranks the masked positions: probability (LLaDA, SDAR, Dream's "
                                             "maskgit_plus) | margin (Dream's topk_margin) | entropy (Dream's entropy) | "
                                             "random (a counter-keyed random order)", choices=CONFIDENCES)
    mask_in_softmax: bool = setting(False, "the confidence's softmax counts the mask token too, as SDAR's, LLaDA's and "
                                           "Dream's generators do")
    first_token_commit: bool = setting(False, "step 0 of each block commits only its first position, from the block-start "
                                              "forward (Fast-dLLM's Dream)")
    alg_temp: float = setting(0.0, "timestep: draw the positions to commit from softmax(confidence / alg_temp) (Dream's "
                                   "alg_temp; 0: the most confident)")
    capped: bool = setting(False, "threshold: at most block_length / steps positions a step, plus what the steps before "
                                  "left unused; steps added while any is left (Fast-dLLM's full-canvas Dream "
                                  "confidence_threshold; needs steps)")
    confidence_dtype: str = setting("float64", "what the confidences are computed and ranked in: float64 | model (the "
                                               "model's dtype, as LLaDA's generate.py, Dream and SDAR compute them: "
                                               "exact bf16 ties then happen: tie_break says which goes first)", choices=CONFIDENCE_DTYPES)
    eps: float = setting(DREAM_EPS, "timestep: the last timestep of Dream's schedule linspace(1, eps, steps + 1) (Dream's eps)")
    tie_break: str = setting("leftmost", "which of exactly tied confidences a step commits first: leftmost | topk (torch.topk "
                                         "on the tensor the reference generator ranks, as its code calls it, so that bf16 "
                                         "decodes match it tie for tie)", choices=TIE_BREAKS)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown unmasking policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if self.acceptance not in ACCEPTANCES:
            raise ValueError(f"unknown acceptance {self.acceptance!r}; choose exact (lossless, the default) "
                             "or max_commit (lossy, threshold policy only)")
        if self.acceptance == "max_commit" and self.policy != "threshold":
            raise ValueError(f"acceptance max_commit accepts a drafted step whose every position clears the threshold, "
                             f"which the {self.policy!r} policy has no use of; use policy 'threshold' (the harness's unmasking=threshold, "
                             "--unmasking threshold) or acceptance 'exact' (method sets in place of sets_max)")
        _finite("threshold", self.threshold)
        for name in ("cross_block", "stop_at_eos", "mask_in_softmax", "first_token_commit", "capped"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.confidence not in CONFIDENCES:
            raise ValueError(f"unknown confidence {self.confidence!r}; choose one of {', '.join(CONFIDENCES)}")
        if self.confidence_dtype not in CONFIDENCE_DTYPES:
            raise ValueError(f"unknown confidence_dtype {self.confidence_dtype!r}; choose one of {', '.join(CONFIDENCE_DTYPES)}")
        if self.tie_break not in TIE_BREAKS:
            raise ValueError(f"unknown tie_break {self.tie_break!r}; choose one of {', '.join(TIE_BREAKS)}")
        for name in ("block_length", "gen_length", "seed", "budget"):
            _whole(name, getattr(self, name))
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.block_length < 1:
            raise ValueError(f"block_length must be >= 1, got {self.block_length}")
        if self.gen_length < 1:
            raise ValueError(f"gen_length must be >= 1, got {self.gen_length}")
        if self.budget < 0:
            raise ValueError(f"budget must be >= 0 (0 = draft-free decoding), got {self.budget}")
        if not 0 <= self.seed < SEED_LIMIT:
            raise ValueError(f"seed must be in [0, 2**32), got {self.seed}: the noise key holds 32 bits of it")
        if self.capped and self.policy != "threshold":
            raise ValueError(f"capped caps the threshold policy's steps (Fast-dLLM's Dream confidence_threshold), not "
                             f"policy {self.policy!r}; use unmasking=threshold or drop capped")
        if self.capped and self.steps is None:
            raise ValueError("capped needs steps: a step commits at most block_length / steps positions (Fast-dLLM's "
                             "n_masked / steps); set steps")
        if self.capped and self.acceptance == "max_commit":
            raise ValueError("acceptance max_commit may accept more positions over the threshold than capped lets a step "
                             "commit; use acceptance exact (method sets in place of sets_max) or drop capped")
        if self.steps is not None:
            _whole("steps", self.steps)
            if self.policy not in STEPPED and not self.capped:
                raise ValueError(f"steps applies to the {', '.join(STEPPED)} policies and to threshold with capped, not "
                                 f"{self.policy!r}; drop steps")
            if not 1 <= self.steps <= self.block_length:
                raise ValueError(f"steps must be in [1, block_length = {self.block_length}], got {self.steps}")
        _finite("eps", self.eps)
        if not 0 <= self.eps < 1:
            raise ValueError(f"eps must be in [0, 1) (Dream's last timestep; its default {DREAM_EPS}), got {self.eps}")
        if self.eps != DREAM_EPS and self.policy != "timestep":
            raise ValueError(f"eps sets the timestep policy's schedule (Dream's), not policy {self.policy!r}'s; drop eps")
        _finite("alg_temp", self.alg_temp)
        if self.alg_temp < 0:
            raise ValueError(f"alg_temp must be >= 0 (0 = the most confident positions), got {self.alg_temp}")
        if self.alg_temp > 0 and (self.policy != "timestep" or self.confidence == "random"):
            raise ValueError("alg_temp applies to the timestep policy with a confidence other than random (Dream's "
                             f"maskgit_plus, topk_margin, entropy), not policy {self.policy!r} with confidence "
                             f"{self.confidence!r}; drop alg_temp")

    @property
    def noisy(self) -> bool:
        """Whether a step reads its coupled noise: to draw tokens (T > 0), and for the random order and alg_temp's
        draw of positions (the noise at the mask token)."""
        return self.sampling.temperature > 0 or self.confidence == "random" or self.alg_temp > 0

    @property
    def rule(self) -> dict[str, object]:
        """The reference-rule options that differ from the defaults (those that change which position a step
        commits): what a drafter trained under the defaults has not seen, though it stays lossless under them."""
        defaults = self.__dataclass_fields__
        return {name: getattr(self, name) for name in RULE_FIELDS if getattr(self, name) != defaults[name].default}

    def verify_pieces(self, budget: int) -> int:
        """The pieces of one verify forward with `budget` drafted nodes: the root and each node, and under
        cross_block 2 more (a cross piece holds two blocks)."""
        return budget + 1 + (2 if self.cross_block else 0)

    def commit_count(self, step: int, masked: int | None = None) -> int:
        """k_s: how many of the most confident masked positions step `step` of a block commits (at
        least; the threshold rules may add more). SDAR's get_num_transfer_tokens: block_length // steps
        each, the remainder one each to the first steps; 1 for single and threshold; for timestep, Dream's
        int(masked * (1 - s/t)) of the `masked` positions left (all of them at the last step)."""
        if self.policy == "timestep":
            if masked is None:
                raise ValueError("the timestep policy's commit count depends on the masked positions left; pass masked")
            import torch

            fraction = self.transfer_fraction(step)
            return masked if fraction is None else int(torch.tensor(masked, dtype=torch.float32) * fraction)
        if self.policy not in SCHEDULED:
            return 1
        return self._share(step)

    def _share(self, step: int) -> int:
        """Step `step`'s share of the block in SDAR's get_num_transfer_tokens split into `steps` steps."""
        steps = self.steps or self.block_length
        base, remainder = divmod(self.block_length, steps)
        return base + (min(step, steps - 1) < remainder)

    def cap(self, step: int, masked: int) -> int | None:
        """How many of the most confident masked positions step `step` of a block considers under `capped` (None
        without it), `masked` of them left; of those it commits the first and every other at >= threshold.

        Fast-dLLM's Dream gives a step n / steps plus the part of their caps the steps before did not commit
        (its `left_tokens_last_step`). Committed plus unused is then always the shares of the steps so far, so
        the cap is `masked` minus the shares of the steps after this one: every masked position from the last
        step on, where the reference adds a step (of cap: those left) while any is left. Shares are of the block
        length, SDAR's split as `static` uses (Fast-dLLM requires n divisible by steps); a block that starts
        with fewer masks (a partial prompt block) gets 1 a step until the schedule catches up: at least the most
        confident position, which the reference always commits."""
        if not self.capped:
            return None
        later = sum(self._share(j) for j in range(step + 1, self.steps))  # [] from the last step on
        return max(masked - later, 1)

    def transfer_fraction(self, step: int) -> torch.Tensor | None:
        """Dream's 1 - s/t at step `step` (a float32 scalar), None at the last step (and after it), which
        commits every masked position: t = timesteps[step], s = timesteps[step + 1] of
        linspace(1, eps, steps + 1) in float32, as Dream computes them."""
        steps = self.steps or self.block_length
        if step >= steps - 1:
            return None
        timesteps = _dream_timesteps(steps, self.eps)
        return 1 - timesteps[step + 1] / timesteps[step]


@functools.cache
def _dream_timesteps(steps: int, eps: float) -> torch.Tensor:
    """linspace(1, eps, steps + 1) in float32, as Dream's; made once per schedule (every step reads it)."""
    import torch

    return torch.linspace(1, eps, steps + 1)
