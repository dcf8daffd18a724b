"""``pipeline.commands.supervisor``: children restarted with a growing wait while they keep
dying young, all of them stopped (SIGTERM, drained) on SIGTERM, and all stopped when one says
its settings cannot work. Real child processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

from pipeline.commands import supervisor
from pipeline.commands.supervisor import Child, supervise


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


SLEEPER = python("import time\nwhile True: time.sleep(1)")


Start = Callable[[Sequence[str]], subprocess.Popen[bytes]]


def started() -> tuple[list[subprocess.Popen[bytes]], Start]:
    processes: list[subprocess.Popen[bytes]] = []

    def start(command: Sequence[str]) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(command)
        processes.append(process)
        return process

    return processes, start


def sigterm_after(seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    return timer


def test_a_child_that_keeps_dying_young_is_started_again_ever_later() -> None:
    processes, start = started()
    dying, steady = Child("dying", python("raise SystemExit(1)")), Child("steady", SLEEPER)
    timer = sigterm_after(5.5)
    began = time.monotonic()
    try:
        assert supervise([dying, steady], start=start, poll_interval=0.05) == 0
    finally:
        timer.cancel()
    # Started at 0, then again after waits of 1 and 2 s (the next after 4 more): three starts.
    assert dying.starts == 3
    assert steady.starts == 1
    assert time.monotonic() - began < 5.5 + supervisor.GRACE
    assert all(p.poll() is not None for p in processes)  # every child ended
    assert steady.process is not None and steady.process.returncode == -signal.SIGTERM


def test_a_child_whose_settings_cannot_work_stops_them_all() -> None:
    processes, start = started()
    broken, steady = (
        Child("broken", python("import time; time.sleep(0.3); raise SystemExit(2)")),
        Child("steady", SLEEPER),
    )
    timer = sigterm_after(20.0)  # only if the supervisor failed to stop by itself
    try:
        assert supervise([steady, broken], start=start, poll_interval=0.05) == 2
    finally:
        timer.cancel()
    assert broken.starts == 1
    assert all(p.poll() is not None for p in processes)
