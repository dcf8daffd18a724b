"""Retry timing: jittered exponential backoff, and the server's ``Retry-After``.

>>> Backoff(base=1.0, cap=8.0, jitter=0.0).delay(5)
8.0
>>> Backoff().delay(0, retry_after=3.0)
3.0
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.core.outcomes import parse_retry_after as _parse_retry_after

__all__ = ["Backoff", "parse_retry_after"]


@dataclass(frozen=True, slots=True)
class Backoff:
    """``base * factor**attempt`` seconds, at most ``cap``, spread by ±``jitter`` (a fraction).

    A server's ``Retry-After`` wins (at most ``max_retry_after``): waiting less than it asked only
    sends more requests to something that already said it is overloaded.
    """

    base: float = 0.25
    factor: float = 2.0
    cap: float = 30.0
    jitter: float = 0.5
    max_retry_after: float = 300.0

    def delay(
        self,
        attempt: int,
        retry_after: float | None = None,
        rand: Callable[[], float] = random.random,
    ) -> float:
        """Seconds to wait before retry number ``attempt + 1`` (``attempt`` counts from 0)."""
        if retry_after is not None and retry_after >= 0:
            return min(retry_after, self.max_retry_after)
        raw = min(self.cap, self.base * self.factor ** min(attempt, 64))
        spread = 1.0 + self.jitter * (2.0 * rand() - 1.0)
        return min(self.cap, raw * spread)


def parse_retry_after(value: str | None, now: Callable[[], float] = time.time) -> float | None:
    """Seconds from a ``Retry-After`` header: delay-seconds or an HTTP date; ``None`` if absent.

    >>> parse_retry_after("2")
    2.0
    >>> parse_retry_after("Sat, 21 Nov 2026 07:00:10 GMT", now=lambda: 1795244400.0)
    10.0
    """
    return _parse_retry_after(value, now())
