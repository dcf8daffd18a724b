"""A circuit breaker per webhook endpoint. Pure logic; the clock is an argument.

Closed: requests flow. After ``failures`` retryable failures in a row the circuit opens: records
for the endpoint go to the next retry tier without a request. After ``cool_down`` seconds it half
opens and lets one probe through; the probe's success closes it, its failure opens it again for
twice as long as the last time, up to ``cool_down_max`` (Envoy's outlier ejection grows likewise):
a long-dead endpoint is probed, and its parked records moved, that much less often.

    >>> now = [0.0]
    >>> clock = lambda: now[0]
    >>> breaker = CircuitBreaker(failures=1, cool_down=30.0, cool_down_max=300.0, clock=clock)
    >>> breaker.allow(); breaker.record(ok=False); breaker.allow()
    True
    False
    >>> now[0] = 31.0
    >>> breaker.allow(), breaker.allow()  # half open: one probe only
    (True, False)
    >>> breaker.record(ok=False); breaker.retry_in()  # the probe failed: twice the cool-down
    60.0
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable

__all__ = ["CircuitBreaker", "CircuitState"]

#: What ``retry_in`` answers at least while a probe runs past its timeout (its answer is due).
_LEAST_WAIT = 0.1


class CircuitState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    __slots__ = (
        "failures",
        "cool_down",
        "cool_down_max",
        "probe_timeout",
        "_clock",
        "state",
        "_run",
        "_opened_at",
        "_wait",
        "_probing",
        "_probe_started",
    )

    def __init__(
        self,
        *,
        failures: int = 5,
        cool_down: float = 30.0,
        cool_down_max: float | None = None,
        probe_timeout: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``cool_down_max``: the longest a circuit stays open after failed probes in a row
        (``None``: ``cool_down``, it never grows). ``probe_timeout``: how long a probe can take
        at most (the delivery timeout): what a caller asking ``retry_in`` during a probe waits
        for, at most."""
        self.failures = failures
        self.cool_down = cool_down
        self.cool_down_max = max(cool_down, cool_down_max or cool_down)
        self.probe_timeout = probe_timeout
        self._clock = clock
        self.state = CircuitState.CLOSED
        self._run = 0
        self._opened_at = 0.0
        self._wait = cool_down  # this opening's cool-down
        self._probing = False
        self._probe_started = 0.0

    def allow(self) -> bool:
        """May a request be sent now? (In half-open state, only the one probe.)"""
        if self.refuses():
            return False
        if self.state is not CircuitState.CLOSED:  # cool-down over, or half open: the probe
            self.state = CircuitState.HALF_OPEN
            self._probing = True
            self._probe_started = self._clock()
        return True

    def refuses(self) -> bool:
        """Would ``allow()`` refuse now? Asked without changing the state (no probe is taken).

        >>> breaker = CircuitBreaker(failures=1, cool_down=30.0, clock=lambda: 0.0)
        >>> breaker.refuses(); breaker.record(ok=False); breaker.refuses(), breaker.allow()
        False
        (True, False)
        """
        if self.state is CircuitState.CLOSED:
            return False
        if self.state is CircuitState.OPEN:
            return self._clock() - self._opened_at < self._wait
        return self._probing

    def retry_in(self) -> float:
        """Seconds until ``allow()`` may let a request through again: the rest of the cool-down
        when open; while the half-open probe runs, until its answer is due at the latest (a
        record parked for less would come back to a probe still running, and be parked again);
        0 when closed.

        >>> now = [0.0]
        >>> breaker = CircuitBreaker(failures=1, cool_down=30.0, probe_timeout=5.0, clock=lambda: now[0])
        >>> breaker.record(ok=False); now[0] = 31.0; breaker.allow(); now[0] = 32.0; breaker.retry_in()
        True
        4.0
        """
        if self.state is CircuitState.OPEN:
            return max(0.0, self._wait - (self._clock() - self._opened_at))
        if self.state is CircuitState.HALF_OPEN and self._probing:
            return max(_LEAST_WAIT, self._probe_started + self.probe_timeout - self._clock())
        return 0.0

    def record(self, *, ok: bool) -> None:
        """The outcome of a request: ``ok`` for a success, else a retryable failure."""
        if ok:
            self.state = CircuitState.CLOSED
            self._run = 0
            self._probing = False
            return
        self._run += 1
        if self.state is CircuitState.HALF_OPEN:  # the probe failed
            self._wait = min(self._wait * 2, self.cool_down_max)
        elif self.state is CircuitState.CLOSED:
            if self._run < self.failures:
                return
            self._wait = self.cool_down
        self.state = CircuitState.OPEN  # (open already: a request sent before it opened failed)
        self._opened_at = self._clock()
        self._probing = False
