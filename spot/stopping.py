"""Cutting an output at the earliest stop string: one rule for every method."""

from __future__ import annotations

from collections.abc import Callable, Sequence


def cut_at_stop(
    token_ids: list[int], stop_strings: Sequence[str], decode: Callable[[list[int]], str]
) -> tuple[list[int], str] | None:
    """None when no stop string occurs; else (tokens, text) cut before the earliest stop string.

    The text is cut exactly at the stop string; the tokens are the longest prefix whose text does
    not reach into it (a token that straddles the cut is dropped from the ids, not from the text).
    """
    text = decode(token_ids)
    hits = [i for i in (text.find(s) for s in stop_strings if s) if i >= 0]
    if not hits:
        return None
    cut = min(hits)
    n = len(token_ids)
    while n > 0 and len(decode(token_ids[:n])) > cut:
        n -= 1
    return token_ids[:n], text[:cut]
