"""A token bucket: at most ``rate`` requests per second, bursts up to ``burst``. Pure logic.

>>> now = [0.0]
>>> bucket = TokenBucket(rate=2.0, burst=1.0, clock=lambda: now[0])
>>> bucket.reserve(), bucket.reserve()   # the second waits half a second
(0.0, 0.5)
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["TokenBucket"]


class TokenBucket:
    __slots__ = ("rate", "burst", "_clock", "_tokens", "_updated")

    def __init__(
        self,
        *,
        rate: float,
        burst: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate = rate
        self.burst = burst if burst is not None else max(1.0, rate)
        self._clock = clock
        self._tokens = self.burst
        self._updated = clock()

    def reserve(self) -> float:
        """Take one token; return how many seconds the caller must wait before using it."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
        self._updated = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def waiting(self) -> float:
        """How long a ``reserve()`` now would have to wait, without taking a token."""
        tokens = min(self.burst, self._tokens + (self._clock() - self._updated) * self.rate)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate

    def adjust(self, rate: float) -> None:
        """A new rate (a process's share changed), keeping the tokens taken: a new bucket would
        start with a full burst, and every rebalance would let one through. Turns reserved
        ahead keep their times: the next one comes after them at the new rate (a debt kept in
        tokens would have stretched them, 100-fold at a share falling to its floor, and
        parked every record of the destination for minutes).

        >>> now = [0.0]
        >>> bucket = TokenBucket(rate=10.0, burst=1.0, clock=lambda: now[0])
        >>> _ = [bucket.reserve() for _ in range(6)]   # reserved half a second ahead
        >>> bucket.adjust(0.1); round(bucket.waiting(), 2)   # half a second, then 10 s
        10.5
        """
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
        self._updated = now
        if self._tokens < 0:
            self._tokens = self._tokens / self.rate * rate  # the same seconds ahead
        self.rate = rate
        self.burst = max(1.0, rate)
        self._tokens = min(self._tokens, self.burst)
