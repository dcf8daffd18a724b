"""``pipeline replay``'s Ctrl-C: the first one asks the replay to stop (an event, never an
exception inside a Kafka call), a second one interrupts at once — with real signals."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest

from pipeline.commands.replay import _ctrl_c_sets


@pytest.fixture
def default_sigint() -> Iterator[None]:
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)  # handled before the next bytecode of the main thread


def test_the_first_ctrl_c_sets_the_event_and_a_second_interrupts(default_sigint: None) -> None:
    stop = threading.Event()
    with _ctrl_c_sets(stop):
        ctrl_c()
        assert stop.is_set()
        with pytest.raises(KeyboardInterrupt):
            ctrl_c()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_python_s_default_is_back_after_the_replay(default_sigint: None) -> None:
    stop = threading.Event()
    with _ctrl_c_sets(stop):
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        ctrl_c()
    assert not stop.is_set()


def test_an_ignored_sigint_stays_ignored() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        stop = threading.Event()
        with _ctrl_c_sets(stop):
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            ctrl_c()
        assert not stop.is_set()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
