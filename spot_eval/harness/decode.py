"""One prompt, one method: the `spot-eval decode` command's work, returned as a JSON-ready dict."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from spot import DecodeConfig, Sampling, generate
from spot_eval.checkpoints.target import encode_prompt, load_target, read_target
from spot_eval.harness.methods import AUTO, KNOWN, MAX_BUDGET, MethodSpec, build_drafter, drafter_file
from spot_eval.harness.profile import auto_sizing, drafter_seconds
from spot_eval.harness.settings import resolve_device

DRAFT_FREE = "draft_free"


def decode_prompt(
    target: str | Path,
    method: str,
    budget: int | str,
    policy: str,
    threshold: float,
    block_length: int | None,
    gen_length: int,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int,
    prompt: str,
    chat: bool,
    device: str = "cpu",
    drafter_path: str | None = None,
    exact: bool = False,
    dtype: torch.dtype | None = None,
    steps: int | None = None,
    max_budget: int = MAX_BUDGET,
    cache: str | None = None,
    cross_block: bool = False,
    stop_at_eos: bool = True,
    confidence: str = "probability",
    alg_temp: float = 0.0,
    mask_in_softmax: bool = False,
    first_token_commit: bool = False,
) -> dict:
    """drafter_path: the method's checkpoint or graph (default: the one shipped for the block
    length). With spiffy the budget is D*, the nodes kept by Spiffy's online pruning. exact: verify
    in the per-piece layout (spot.targets.attention). budget "auto": each tree sized by this device's
    verify cost (spot.sizing), at most `max_budget` nodes. A lossy method (sets_max: max-commit) decodes
    under its own acceptance rule, and its output differs from draft-free decoding's by design."""
    if method != DRAFT_FREE and method not in KNOWN:
        raise ValueError(f"unknown method {method!r}; choose {DRAFT_FREE} or one of {', '.join(KNOWN)}")
    if method == DRAFT_FREE and (budget or drafter_path):
        raise ValueError(f"method {DRAFT_FREE} takes no budget or --drafter; pick a drafter method to use them")
    auto = budget == "auto"
    if auto:
        if method not in AUTO:
            raise ValueError(f"--budget auto needs a drafter with calibrated reach probabilities: {', '.join(AUTO)}")
        if max_budget < 1:
            raise ValueError(f"--max-budget must be >= 1, got {max_budget}")
        budget = max_budget
    if method != DRAFT_FREE and budget < 1:
        raise ValueError(f"method {method} needs --budget >= 1 (draft nodes per verify forward) or auto, got {budget}")
    # Everything is checked before the weights load.
    device = resolve_device("--device", device)
    checkpoint = read_target(target)  # the one parse of the checkpoint (load_target below takes it)
    config = DecodeConfig(
        policy=policy,
        threshold=threshold,
        steps=steps,
        block_length=checkpoint.info.block_size if block_length is None else block_length,
        gen_length=gen_length,
        sampling=Sampling(temperature=temperature, top_k=top_k, top_p=top_p),
        seed=seed,
        budget=budget,
        cross_block=cross_block,
        stop_at_eos=stop_at_eos,
        confidence=confidence,
        alg_temp=alg_temp,
        mask_in_softmax=mask_in_softmax,
        first_token_commit=first_token_commit,
    )
    spec = None if method == DRAFT_FREE else MethodSpec(method, budget, drafter_path, auto)
    if spec is not None:
        drafter_file(spec, config.block_length, config.policy)
        config = spec.config(config)  # a lossy method's acceptance rule, checked against the policy
    model = load_target(checkpoint, block_length, device, exact, dtype, cache)
    ids = encode_prompt(model, prompt, chat)
    decode = model.tokenizer.decode
    drafter = None
    if spec is not None:
        reference = None
        if spec.needs_reference:
            reference = generate(model, ids, replace(config, budget=0), record=True)
        drafter = build_drafter(spec, model, policy, reference, threshold, config.rule)
    sizing = auto_sizing(model, drafter, config) if auto else None
    result = generate(model, ids, config, drafter=drafter, decode=decode, sizing=sizing)
    s = result.stats
    return {
        "method": method,
        "budget": "auto" if auto else budget,
        "acceptance": config.acceptance,  # max_commit: lossy, the output differs from draft-free decoding's by design
        "max_budget": budget if auto else None,
        "mean_tree_size": s.mean_tree_size,
        "drafter_seconds_per_tree": None if sizing is None else drafter_seconds(sizing),
        "target": str(target),
        "text": result.text,
        "token_ids": list(result.token_ids),
        "finish_reason": result.finish_reason,
        "forwards": s.forwards,
        "steps": s.steps,
        "seconds": s.seconds,
        "target_seconds": s.target_seconds,
        "drafter_seconds": s.drafter_seconds,
        "accepted_lengths": list(s.accepted_lengths),
        "prompt_tokens": len(ids),
        "block_length": model.block_length,
        "exact": exact,
        "cross_block": cross_block,
        "stop_at_eos": stop_at_eos,
        "confidence": confidence,
        "alg_temp": alg_temp,
        "mask_in_softmax": mask_in_softmax,
        "first_token_commit": first_token_commit,
        "cache": getattr(model, "cache", None),
        "dtype": str(model.model.dtype).removeprefix("torch."),
    }
