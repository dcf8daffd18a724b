"""A clock of the time an event loop was free to run.

An endpoint is silent when none of its requests came back for a while, but answers are read
only when the loop gets to them. Routing a consumed batch of calls for 50 destinations blocks a
worker's loop for a few hundred milliseconds; on the wall clock every endpoint with a request out
then looks silent, and a healthy destination's records would be parked. On this clock the block
does not count: a beat every ``BEAT`` seconds adds up how late it ran, and a block under way
counts from the beat it holds up.
"""

from __future__ import annotations

import asyncio
import time

__all__ = ["AwakeClock"]

#: How often the clock notes that the loop runs, and the lateness of a note that is the timer's,
#: not a block of the loop.
BEAT = 0.05
BEAT_SLACK = 0.005


class AwakeClock:
    """Monotonic seconds, less the time the event loop was blocked since ``start``; before
    ``start`` (or after ``stop``), the monotonic clock less what was counted."""

    def __init__(self) -> None:
        self._blocked = 0.0
        self._due = time.monotonic()
        self._beat_handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Beat on the running loop (once: a second call starts the one chain again)."""
        self.stop()
        self._due = time.monotonic()
        self._beat()

    def stop(self) -> None:
        if self._beat_handle is not None:
            self._beat_handle.cancel()
            self._beat_handle = None

    def _beat(self) -> None:
        now = time.monotonic()
        self._blocked += max(0.0, now - self._due - BEAT_SLACK)
        self._due = now + BEAT
        self._beat_handle = asyncio.get_running_loop().call_later(BEAT, self._beat)

    def __call__(self) -> float:
        now = time.monotonic()
        if self._beat_handle is None:
            return now - self._blocked
        return now - self._blocked - max(0.0, now - self._due - BEAT_SLACK)
