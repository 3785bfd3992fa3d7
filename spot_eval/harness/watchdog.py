"""A plugin's drafter under a time limit per call: a draft that hangs stops its method, not the run.

The limit is a SIGALRM timer around each `draft` / `draft_batch` call, which interrupts Python code (a loop, a
sleep, a wait) between bytecodes; the engine turns the TimeoutError into the method's DraftError. It applies on
the main thread, where lm_eval and spot-eval decode (a signal reaches no other thread), and cannot interrupt one
native call that never returns: such a call is the plugin's C code, outside what Python can stop.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Sequence
from contextlib import contextmanager

from spot.drafters.base import DraftContext, name_of
from spot.tree import DraftTree


class Watched:
    """`drafter` with every call limited to `seconds`; anything else (its name, `modes`) is the drafter's own."""

    def __init__(self, drafter: object, seconds: float) -> None:
        self.inner = drafter
        self.seconds = seconds
        self.name = name_of(drafter)

    def __getattr__(self, attribute: str) -> object:
        return getattr(self.inner, attribute)

    def draft(self, ctx: DraftContext) -> DraftTree:
        with time_limit(self.seconds):
            return self.inner.draft(ctx)

    @property
    def draft_batch(self) -> Callable[[Sequence[DraftContext]], list] | None:
        """The drafter's own draft_batch under the limit, or None where it has none (the engine then drafts one by one)."""
        batch = getattr(self.inner, "draft_batch", None)
        if batch is None:
            return None

        def limited(ctxs: Sequence[DraftContext]) -> list:
            with time_limit(self.seconds):
                return batch(ctxs)

        return limited


@contextmanager
def time_limit(seconds: float):
    """Raise TimeoutError in the block once it has run `seconds` (on the main thread; elsewhere no limit)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame) -> None:
        raise TimeoutError(f"took longer than the {seconds:g} s one draft may take (draft_timeout={seconds:g}); stopped as hung")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
