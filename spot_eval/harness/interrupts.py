"""Ctrl-C during an evaluation is never lost.

Python raises KeyboardInterrupt wherever the main thread is when SIGINT lands. When that is a finalizer (a
progress bar's or a tensor's `__del__`, a weakref callback), Python prints "Exception ignored" and drops it,
and the evaluation would carry on to exit 0 as if nobody had asked it to stop. So the handler also notes the
signal, and the request loop asks between requests (`check`), where raising is always safe."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def kept_interrupts() -> Iterator[Callable[[], None]]:
    """Yields `check()`, which raises KeyboardInterrupt if SIGINT arrived since the block began. Outside the
    main thread, or where someone else handles SIGINT, the block changes nothing and `check` never raises."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield lambda: None
        return
    arrived: list[int] = []

    def noted(signum, frame) -> None:
        arrived.append(signum)
        raise KeyboardInterrupt

    def check() -> None:
        if arrived:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, noted)
    try:
        yield check
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
