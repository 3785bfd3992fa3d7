"""Ctrl-C that lands in a finalizer is still honoured between requests."""

import contextlib
import os
import signal

import pytest

from spot_eval.harness.interrupts import kept_interrupts


@pytest.fixture(autouse=True)
def python_default_sigint():
    """As in a console command (a test runner's worker may have its own handler)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def swallowed_sigint() -> None:
    """What a finalizer does with a KeyboardInterrupt raised inside it: prints it and carries on."""
    with contextlib.suppress(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs at the next bytecode boundary, inside this block


def test_a_sigint_lost_inside_a_request_stops_the_loop_at_the_next_check():
    with kept_interrupts() as check:
        check()  # nothing arrived yet
        swallowed_sigint()
        with pytest.raises(KeyboardInterrupt):
            check()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_block_without_a_sigint_never_raises_and_restores_the_handler():
    with kept_interrupts() as check:
        check()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_someone_elses_handler_is_left_alone():
    mine = []
    previous = signal.signal(signal.SIGINT, lambda *_: mine.append(1))
    try:
        with kept_interrupts() as check:
            os.kill(os.getpid(), signal.SIGINT)
            check()
        assert mine == [1] and signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
