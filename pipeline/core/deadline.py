"""``Deadline``: a point on a monotonic clock, for loops that wait, retry or poll until a limit.

The clock is injectable, so code that waits can be tested without sleeping.

    >>> now = [100.0]
    >>> deadline = Deadline.after(5.0, clock=lambda: now[0])
    >>> deadline.remaining(), deadline.expired()
    (5.0, False)
    >>> now[0] = 106.0
    >>> deadline.remaining(), deadline.expired()
    (0.0, True)
    >>> Deadline.never().remaining() == float("inf")
    True
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["Clock", "Deadline"]

#: A monotonic clock in seconds (``time.monotonic`` unless a test gives its own).
Clock = Callable[[], float]


class Deadline:
    """When a wait must end. ``remaining()`` is never negative; ``expired()`` once it is 0."""

    __slots__ = ("at", "_clock")

    def __init__(self, at: float, *, clock: Clock = time.monotonic) -> None:
        self.at = at
        self._clock = clock

    @classmethod
    def after(cls, seconds: float | None, *, clock: Clock = time.monotonic) -> Deadline:
        """``seconds`` from now; ``None`` means never."""
        if seconds is None:
            return cls(math.inf, clock=clock)
        return cls(clock() + seconds, clock=clock)

    @classmethod
    def never(cls, *, clock: Clock = time.monotonic) -> Deadline:
        return cls(math.inf, clock=clock)

    def remaining(self) -> float:
        return max(0.0, self.at - self._clock())

    def expired(self) -> bool:
        return self._clock() >= self.at

    def capped(self, seconds: float, floor: float = 0.0) -> float:
        """What to wait now: the remaining time, at most ``seconds`` and at least ``floor``
        (for a poll that must wait a little even at the end)."""
        return max(floor, min(seconds, self.remaining()))

    def renew(self, seconds: float) -> None:
        """Move the deadline to ``seconds`` from now (a periodic timer after it fired)."""
        self.at = self._clock() + seconds

    def __repr__(self) -> str:
        return f"Deadline(remaining={self.remaining():.3f})"
