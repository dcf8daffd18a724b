"""``pipeline worker --processes N``: N worker processes, each a member of every group, and the
log-store beside them, under one supervisor, so that one command uses every core of a machine.

The supervisor only watches: it starts each child (``python -m pipeline ...``, with the same
environment and flags), restarts one that ends while nothing asked it to (after 1 s, doubling
while it keeps dying young, up to ``MAX_BACKOFF``), and on SIGINT or SIGTERM passes SIGTERM on
and waits for every child to drain. A child that ends with status 2 (its settings or config
cannot work) ends them all: every child would fail alike. Children get SIGTERM from Linux if the
supervisor dies without stopping them.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Child", "supervise"]

log = logging.getLogger("pipeline.supervisor")

#: The longest wait before a child that keeps dying is started again (seconds).
MAX_BACKOFF = 30.0
#: A child that lived this long was well: its next restart waits 1 s again.
WELL_AFTER = 30.0
#: How long a stopping child may drain before it is killed (seconds).
GRACE = 30.0
#: The status of a child whose settings or config cannot work (``pipeline.commands.cli``).
UNWORKABLE = 2


@dataclass
class Child:
    """One supervised process: its name and command line."""

    name: str
    command: Sequence[str]
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    backoff: float = 1.0
    due: float = 0.0  # when a dead child starts again (monotonic seconds)
    starts: int = 0


def supervise(
    children: list[Child],
    *,
    start: Callable[[Sequence[str]], subprocess.Popen[bytes]],
    poll_interval: float = 0.2,
) -> int:
    """Run ``children`` until SIGINT or SIGTERM (0), or until one of them finds its settings
    unworkable (2). ``start`` starts a command line."""
    stopping = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stopping.set())
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    status = 0
    try:
        for child in children:
            _start(child, start)
        while not stopping.wait(poll_interval):
            now = time.monotonic()
            for child in children:
                if child.process is None:
                    if now >= child.due:
                        _start(child, start)
                    continue
                code = child.process.poll()
                if code is None:
                    continue
                if code == UNWORKABLE:
                    log.error("%s ended with status 2 (its settings): stopping", child.name)
                    status = UNWORKABLE
                    stopping.set()
                    break
                lived = now - child.started_at
                if lived >= WELL_AFTER:
                    child.backoff = 1.0
                wait, child.backoff = child.backoff, min(child.backoff * 2, MAX_BACKOFF)
                log.warning(
                    "%s (pid %d) ended with status %s after %.0f s: starting it again in %g s",
                    child.name,
                    child.process.pid,
                    code,
                    lived,
                    wait,
                )
                child.process, child.due = None, now + wait
    finally:
        _stop_all(children)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return status


def _start(child: Child, start: Callable[[Sequence[str]], subprocess.Popen[bytes]]) -> None:
    child.process = start(child.command)
    child.started_at = time.monotonic()
    if child.starts:
        log.info("%s started again (pid %d)", child.name, child.process.pid)
    else:
        log.info("%s started (pid %d)", child.name, child.process.pid)
    child.starts += 1


def _stop_all(children: list[Child]) -> None:
    """SIGTERM to every child at once, then wait for each to drain (killed after ``GRACE``)."""
    running = [c.process for c in children if c.process is not None and c.process.poll() is None]
    for process in running:
        process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + GRACE
    for process in running:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("pid %d did not drain within %g s: killed", process.pid, GRACE)
            process.kill()
            process.wait()


def die_with_parent(parent: int) -> None:
    """In a child, before exec: ask Linux for SIGTERM when the parent dies. A parent that died
    before the request took effect (killed right after the fork) would never send it: then the
    child goes at once."""
    import sys

    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(1)
