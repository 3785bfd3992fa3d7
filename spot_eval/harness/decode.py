"""One prompt, one method: the `spot-eval decode` command's work, returned as a JSON-ready dict."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from spot import DecodeConfig, generate
from spot.drafters.base import DraftError
from spot_eval import registry
from spot_eval.checkpoints.target import encode_prompt, load_target, read_target
from spot_eval.harness.methods import MethodSpec, auto_methods, build_drafter, drafter_file
from spot_eval.harness.options import build, options, values_of
from spot_eval.harness.placement import plan_placement, wanted
from spot_eval.harness.profile import auto_sizing, drafter_seconds
from spot_eval.harness.settings import (
    DRAFT_TIMEOUT,
    MAX_BUDGET,
    TargetSettings,
    check_budgets,
    resolve_target,
)
from spot_eval.method import PluginError

DRAFT_FREE = "draft_free"


def decode_prompt(
    target: TargetSettings,
    decoder: Mapping[str, object],
    method: str,
    budget: int | str,
    prompt: str,
    chat: bool,
    drafter_path: str | None = None,
    max_budget: int = MAX_BUDGET,
    plugins: tuple[str, ...] = (),
    draft_timeout: float = DRAFT_TIMEOUT,
) -> dict:
    """decoder: DecodeConfig's settings by option name (spot_eval.harness.options); block_length None is the
    checkpoint's. drafter_path: the method's checkpoint or graph (default: the one shipped for the block
    length). With spiffy the budget is D*, the nodes kept by Spiffy's online pruning. budget "auto": each tree
    sized by this device's verify cost (spot.sizing), at most `max_budget` nodes. A lossy method (sets_max:
    max-commit) decodes under its own acceptance rule, and its output differs from draft-free decoding's by design.
    plugins: plugin files or modules whose methods `method` may name (spot_eval.registry.load_plugins); a plugin's
    draft may take `draft_timeout` seconds.

    Raises PluginError where the method's drafter fails (naming the method and where it comes from), never the
    ValueError that bad input gets.

    Returns the output, its figures, and every setting it was decoded under (the decoder's under their option names)."""
    registry.load_plugins(plugins, "--plugins")
    if method != DRAFT_FREE and method not in registry.methods():
        raise ValueError(f"unknown method {method!r}; choose {DRAFT_FREE} or one of {', '.join(registry.methods())} (a "
                         "plugin's method: --plugins FILE, or install its package)")
    if draft_timeout <= 0:
        raise ValueError(f"--draft-timeout must be > 0 seconds, got {draft_timeout:g}")
    if method == DRAFT_FREE and (budget or drafter_path):
        raise ValueError(f"method {DRAFT_FREE} takes no budget or --drafter; pick a drafter method to use them")
    auto = budget == "auto"
    if auto:
        if method not in auto_methods():
            raise ValueError(f"--budget auto needs a drafter with calibrated reach probabilities: {', '.join(auto_methods())}")
        if max_budget < 1:
            raise ValueError(f"--max-budget must be >= 1, got {max_budget}")
        budget = max_budget
    if method != DRAFT_FREE and budget < 1:
        raise ValueError(f"method {method} needs --budget >= 1 (draft nodes per verify forward) or auto, got {budget}")
    # Everything is checked before the weights load.
    path, device, dtype = resolve_target(target)
    checkpoint = read_target(path)  # the one parse of the checkpoint (load_target below takes it)
    block_length = decoder.get("block_length")
    config = build(DecodeConfig, decoder, budget=budget,
                   block_length=checkpoint.info.block_size if block_length is None else block_length)
    spec = None if method == DRAFT_FREE else MethodSpec(method, budget, drafter_path, auto)
    if spec is not None:
        drafter_file(spec, config.block_length, config.policy)
        config = spec.config(config)  # a lossy method's acceptance rule, checked against the policy
    if spec is not None and not auto:
        check_budgets({spec.label: config.verify_pieces(budget)}, config.block_length,
                      checkpoint.info.vocab_size, dtype, device)
    planned = plan_placement(target, device, checkpoint, dtype) if wanted(target) else None
    model = load_target(checkpoint, block_length, device, target.exact, dtype, target.cache,
                        None if planned is None else planned.placement)
    ids = encode_prompt(model, prompt, chat)
    drafter = None
    if spec is not None:
        reference = None
        if spec.needs_reference:
            reference = generate(model, ids, replace(config, budget=0), record=True)
        drafter = build_drafter(spec, model, config.policy, reference, config.threshold, config.rule, draft_timeout)
    try:
        sizing = auto_sizing(model, drafter, config) if auto else None
        result = generate(model, ids, config, drafter=drafter, decode=model.tokenizer.decode, sizing=sizing)
    except DraftError as err:
        raise PluginError(f"method {spec.label} ({spec.origin}) failed: {err}") from err
    s = result.stats
    return {
        "method": method,
        "budget": "auto" if auto else budget,
        "acceptance": config.acceptance,  # max_commit: lossy, the output differs from draft-free decoding's by design
        "max_budget": budget if auto else None,
        "mean_tree_size": s.mean_tree_size,
        "drafter_seconds_per_tree": None if sizing is None else drafter_seconds(sizing),
        "target": str(path),
        "text": result.text,
        "token_ids": list(result.token_ids),
        "finish_reason": result.finish_reason,
        "forwards": s.forwards,
        "commit_steps": s.steps,  # the policy steps taken (the config's own "steps" setting is below)
        "seconds": s.seconds,
        "target_seconds": s.target_seconds,
        "drafter_seconds": s.drafter_seconds,
        "accepted_lengths": list(s.accepted_lengths),
        "prompt_tokens": len(ids),
        **values_of(config, options(DecodeConfig)),
        "exact": target.exact,
        "cache": getattr(model, "cache", None),
        "dtype": str(model.model.dtype).removeprefix("torch."),
    }
