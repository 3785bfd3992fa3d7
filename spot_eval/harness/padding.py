"""Padding shown as padding: the forwards a decode spends after its answer's first EOS.

A block-diffusion target that ends its answer early fills the rest of the block with EOS, one committed position
a step under single-commit decoding, and the request ends only once every position before the first EOS is
written. Those steps write no answer, and any drafter guesses them (a repeat-the-last-token chain best of all):
a task whose answers are short is then mostly padding, and its forward ratio describes the padding, not the
drafters. So each record keeps how many of its forwards only wrote padding, and the reports show the share and the
ratio counted without them beside the whole-generation ratio that the paper reports.
"""

from __future__ import annotations

from spot import Generation


def after_eos_forwards(generation: Generation, eos_ids: frozenset[int], mask_id: int) -> int:
    """The forwards of `generation` (record=True: its trajectory) every step of which committed only positions after
    its answer's first EOS; 0 where the answer has no EOS (a stop string or the length ended it)."""
    if generation.finish_reason != "eos":
        return 0
    tokens = generation.token_ids
    eos_at = next((i for i, t in enumerate(tokens) if t in eos_ids), len(tokens))  # index in the generated tokens
    padding: list[bool] = []  # per step, in order over the blocks
    offset = 0
    for trace in generation.trajectory or ():
        generated = (trace.states[0] == mask_id).nonzero()[:, 0].tolist()  # the block's generated positions, in order
        index = {p: offset + i for i, p in enumerate(generated)}
        for before, after in zip(trace.states[:-1], trace.states[1:], strict=True):
            committed = (after != before).nonzero()[:, 0].tolist()
            padding.append(bool(committed) and all(index[p] > eos_at for p in committed))
        offset += len(generated)
    count, at = 0, 0
    for length in generation.stats.accepted_lengths:  # a forward's steps: its accepted length
        count += all(padding[at : at + length])
        at += length
    return count
