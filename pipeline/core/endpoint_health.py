"""The health of the endpoints a worker delivers to, and the pace it may send at. Pure logic;
the clock is an argument.

Kept per webhook URL (an *endpoint*) and per origin (scheme, host and port: a *host*):

- **Circuits.** Each endpoint has a breaker for its retryable failures, and each host one more
  for failures of the host itself (refused or reset connections, DNS, TLS): those say nothing
  about a path, and a host that is down would otherwise cost a run of failures per URL on it.
  Any answer from the host, even a 500, closes the host's circuit.
- **Silence.** An endpoint with requests out and none back for ten times its usual answer time
  (at least ``QUIET_MIN``, at most half the delivery timeout) is *silent*: it likely hangs, and
  its next records should not wait behind those requests.
- **Unproven.** An endpoint whose first requests have been out ``UNPROVEN_AFTER`` without any
  answer yet: nothing says its receiver is there at all.
- **Pace.** A destination's ``rate_limit`` (lowered while its receiver answers 429) is the
  deployment's; this process sends its share of it from a token bucket per destination. The
  shares, the lowered pace and a ``Retry-After`` pause come from ``pace`` (``PaceBook``), which
  the delivery processes keep in step through a topic; before any member has reported, the share
  is the process's share of the partitions (``set_share``).

The sender reports each request (``admit``, ``started``, ``ended``); the delivery handler and the
router read one ``Health`` snapshot per destination.

    >>> health = EndpointHealth(Settings(circuit_failures=1), clock=lambda: 0.0)
    >>> hook = health.endpoint("https://a.example/hook")
    >>> health.started(hook); health.ended(hook, UrlResult(hook.url, 503, Failure.SERVER_ERROR))
    >>> health.admit(hook) is not None  # refused: its circuit opened
    True
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from urllib.parse import urlsplit

from pipeline.core.circuit import CircuitBreaker, CircuitState
from pipeline.core.config import Destination
from pipeline.core.outcomes import RETRYABLE, Failure, UrlResult
from pipeline.core.pace import PaceBook
from pipeline.core.rate_limit import TokenBucket
from pipeline.core.settings import Settings

__all__ = [
    "EndpointHealth",
    "Endpoint",
    "Health",
    "QUIET_MIN",
    "UNPROVEN_AFTER",
    "DELIVERY_ROLES",
]

#: The least time without an answer that makes an endpoint silent, and the time before its first.
QUIET_MIN = 0.25
#: How long requests out without a first answer make an endpoint unproven: a receiver that is
#: there answers its first requests within milliseconds, where a worker takes in its first batches.
UNPROVEN_AFTER = 0.05
#: After a silent endpoint's requests time out, the time their failures take to reach its circuit
#: (the timeouts of requests started together end within milliseconds of each other).
HEARD_AFTER = 0.5
#: The roles that send deliveries; each destination's ``rate_limit`` is split over their shares.
DELIVERY_ROLES = ("deliver", "retry")
#: The least share of a rate limit a process sends at (one that holds no partition yet).
MIN_SHARE = 0.01
#: Endpoints remembered; past this the memory starts again (config churn).
MAX_ENDPOINTS = 10_000
#: Failures of the host, not of the path: they also count against the host's circuit.
HOST_FAILURES = frozenset({Failure.CONNECTION_ERROR, Failure.TLS_ERROR})


@dataclass(frozen=True, slots=True)
class Health:
    """What a destination's endpoints say now. ``reopens_in``: seconds until one of its webhooks
    may be tried again, when every one is refused by an open circuit (its own or its host's);
    ``silence_ends_in``: when every webhook is silent, the time until one answers at the latest
    (its oldest request out times out and its circuit hears of it); ``unproven``: one webhook's
    first requests are out unanswered; ``rate_wait``: how long the next request would wait for
    its turn under ``rate_limit``; ``paused_for``: seconds left of the pause its receiver asked
    for (``Retry-After``); ``queue``: how long the records this process parked by choice (for
    their turns, for a free slot under ``max_in_flight``) to come back within a second or two
    (the queue's head), not yet back, would take to go at the group's pace (its ``rate_limit``,
    or its lowered pace), or else at the pace its receiver accepted here lately (0: unknown);
    ``behind``: the same of all it parked by choice;
    ``accepting``: that pace, its 2xx answers a second here lately."""

    reopens_in: float | None = None
    silence_ends_in: float | None = None
    unproven: bool = False
    rate_wait: float = 0.0
    paused_for: float = 0.0
    queue: float = 0.0
    behind: float = 0.0
    accepting: float = 0.0


def _breaker(settings: Settings) -> CircuitBreaker:
    return CircuitBreaker(
        failures=settings.circuit_failures,
        cool_down=settings.circuit_cool_down,
        cool_down_max=settings.circuit_cool_down_max,
        probe_timeout=settings.delivery_timeout,
    )


class _Host:
    """One origin's circuit, for failures of the host itself."""

    __slots__ = ("origin", "breaker")

    def __init__(self, origin: str, settings: Settings) -> None:
        self.origin = origin
        self.breaker = _breaker(settings)


class Endpoint:
    """One webhook URL: its circuit and its host's, and what its requests out say.

    ``host`` is ``None`` for a URL that cannot be parsed (the sender refuses it before any
    request; it is never refused by a circuit)."""

    __slots__ = (
        "url",
        "host",
        "breaker",
        "in_flight",
        "quiet_since",
        "latency",
        "_refusals",
        "silence_check",
    )

    def __init__(self, url: str, host: _Host | None, settings: Settings) -> None:
        self.url = url
        self.host = host
        self.breaker = _breaker(settings)
        #: Requests to this URL now, and since when none of them has come back (the clock's).
        self.in_flight = 0
        self.quiet_since = 0.0
        #: How long it takes to answer (a moving average of answered requests; None: unknown).
        self.latency: float | None = None
        self._refusals: dict[bool, UrlResult] = {}
        #: ``EndpointHealth.silent`` of this endpoint, one callable for every request to it (set
        #: by ``EndpointHealth.endpoint``): a slot's waiters on it share one verdict a check.
        self.silence_check: Callable[[], bool] = lambda: False

    def silent(self, now: float, at_most: float) -> bool:
        """Requests are out and none has come back for ten times its usual answer time (at
        least ``QUIET_MIN``, at most ``at_most``; ``QUIET_MIN`` before its first answer)."""
        if not self.in_flight:
            return False
        quiet = (
            QUIET_MIN if self.latency is None else min(at_most, max(QUIET_MIN, 10 * self.latency))
        )
        return now - self.quiet_since > quiet

    def refuses(self) -> bool:
        """Is the endpoint's or its host's circuit open? (Asked without taking a probe.)"""
        return self.host is not None and (self.breaker.refuses() or self.host.breaker.refuses())

    def refusal(self) -> UrlResult:
        """The result of not trying this URL because a circuit is open (made once per cause: a
        hanging endpoint's records all take it)."""
        assert self.host is not None
        by_host = not self.breaker.refuses()
        refusal = self._refusals.get(by_host)
        if refusal is None:
            why = (
                f"{self.host.origin} could not be reached repeatedly"
                if by_host
                else "it failed repeatedly"
            )
            refusal = self._refusals[by_host] = UrlResult(
                self.url, failure=Failure.CIRCUIT_OPEN, detail=f"not tried: {why}; circuit open"
            )
        return refusal

    def silenced(self) -> UrlResult:
        """The result of not waiting for this URL: it is silent."""
        return UrlResult(
            self.url,
            failure=Failure.CIRCUIT_OPEN,
            detail="not tried: it has requests out and answered none lately",
        )


class EndpointHealth:
    """Every endpoint's and host's health, and every destination's pace, in one process.

    ``clock``: monotonic seconds for silence (the worker's counts only the time its event loop
    was free to read answers: ``pipeline.runtime.awake_clock``)."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.monotonic,
        pace: PaceBook | None = None,
    ) -> None:
        self._settings = settings
        self.pace = pace or PaceBook(uuid.uuid4().hex[:12])
        self._clock = clock
        self._silent_after = settings.delivery_timeout / 2
        self._endpoints: dict[str, Endpoint] = {}
        self._hosts: dict[str, _Host] = {}
        self._buckets: dict[str, TokenBucket] = {}
        self._shares: dict[str, float] = {}
        self._share = 1.0

    # ---- endpoints -----------------------------------------------------------------------------

    def endpoint(self, url: str) -> Endpoint:
        """``url``'s endpoint, made on first use and remembered."""
        found = self._endpoints.get(url)
        if found is None:
            if len(self._endpoints) >= MAX_ENDPOINTS:
                self._endpoints.clear()
            found = self._endpoints[url] = Endpoint(url, self._host_of(url), self._settings)
            found.silence_check = partial(self.silent, found)
        return found

    def _host_of(self, url: str) -> _Host | None:
        try:
            parts = urlsplit(url)
            default = 443 if parts.scheme == "https" else 80
            origin = f"{parts.scheme}://{parts.hostname or ''}:{parts.port or default}"
        except ValueError:
            return None
        host = self._hosts.get(origin)
        if host is None:
            host = self._hosts[origin] = _Host(origin, self._settings)
        return host

    def admit(self, endpoint: Endpoint) -> UrlResult | None:
        """Before a request (not a record's final attempt): its refusal when a circuit is open,
        else ``None``, the half-open probe taken if it is one."""
        if endpoint.refuses():
            return endpoint.refusal()
        endpoint.breaker.allow()
        if endpoint.host is not None:
            endpoint.host.breaker.allow()
        return None

    def started(self, endpoint: Endpoint) -> None:
        if not endpoint.in_flight:
            endpoint.quiet_since = self._clock()
        endpoint.in_flight += 1

    def ended(self, endpoint: Endpoint, result: UrlResult | None) -> None:
        """A request came back (``result``; ``None``: it was given up without one)."""
        endpoint.in_flight -= 1
        endpoint.quiet_since = self._clock()
        if result is None:
            return
        if result.status is not None:
            seconds = result.duration
            latency = endpoint.latency
            endpoint.latency = seconds if latency is None else 0.8 * latency + 0.2 * seconds
        failure = result.failure
        if failure is None:
            endpoint.breaker.record(ok=True)
        elif failure is Failure.RATE_LIMITED:
            pass  # "slow down" is answered by the pace (``answered``), not by the circuit
        elif failure in RETRYABLE:
            endpoint.breaker.record(ok=False)
        host = endpoint.host
        if host is not None:
            if failure in HOST_FAILURES:
                host.breaker.record(ok=False)
            elif result.status is not None:
                host.breaker.record(ok=True)  # the host answered, whatever it said

    def silent(self, endpoint: Endpoint) -> bool:
        return endpoint.silent(self._clock(), self._silent_after)

    # ---- destinations --------------------------------------------------------------------------

    def snapshot(self, destination: Destination) -> Health:
        """What ``destination``'s webhooks say now (see ``Health``). Takes no probe and no
        rate-limit token."""
        return Health(
            self._reopens_in(destination),
            self._silence_ends_in(destination),
            self._unproven(destination),
            self.rate_wait(destination),
            self.pace.paused_for(destination.id),
            *self.queue(destination),
            self.pace.accepting(destination.id),
        )

    def refusals(self, destination: Destination) -> list[UrlResult] | None:
        """The results of an attempt at ``destination`` when every webhook's circuit is open,
        known without a request; ``None`` when any webhook may be tried. Takes no probe."""
        results = []
        for hook in destination.webhooks:
            endpoint = self.endpoint(hook.url)
            if not endpoint.refuses():
                return None
            results.append(endpoint.refusal())
        return results

    def paused_refusals(self, destination: Destination) -> list[UrlResult] | None:
        """The results of not trying ``destination`` because its receiver asked for a pause
        that has not ended (heard from any process); ``None`` when it is not paused."""
        if self.pace.paused_for(destination.id) <= 0:
            return None
        detail = "not tried: its receiver asked for a pause (Retry-After)"
        return [
            UrlResult(hook.url, failure=Failure.CIRCUIT_OPEN, detail=detail)
            for hook in destination.webhooks
        ]

    def open_circuits(self, destination: Destination) -> int:
        """How many of ``destination``'s webhooks have an open or half-open circuit (their own or
        their host's)."""
        count = 0
        for hook in destination.webhooks:
            endpoint = self.endpoint(hook.url)
            host = endpoint.host
            if host is not None and (
                endpoint.breaker.state is not CircuitState.CLOSED
                or host.breaker.state is not CircuitState.CLOSED
            ):
                count += 1
        return count

    def _reopens_in(self, destination: Destination) -> float | None:
        soonest: float | None = None
        for hook in destination.webhooks:
            endpoint = self.endpoint(hook.url)
            host = endpoint.host
            if host is None or not endpoint.refuses():
                return None
            wait = max(endpoint.breaker.retry_in(), host.breaker.retry_in())
            soonest = wait if soonest is None else min(soonest, wait)
        return soonest

    def _silence_ends_in(self, destination: Destination) -> float | None:
        now = self._clock()
        timeout = self._settings.delivery_timeout
        soonest: float | None = None
        for hook in destination.webhooks:
            endpoint = self._endpoints.get(hook.url)
            if endpoint is None or not endpoint.silent(now, self._silent_after):
                return None
            ends = endpoint.quiet_since + timeout - now + HEARD_AFTER
            soonest = ends if soonest is None else min(soonest, ends)
        return soonest

    def _unproven(self, destination: Destination) -> bool:
        now = self._clock()
        waited = False
        for hook in destination.webhooks:
            endpoint = self._endpoints.get(hook.url)
            if endpoint is None:
                continue
            if endpoint.latency is not None:
                return False
            if endpoint.in_flight and now - endpoint.quiet_since > UNPROVEN_AFTER:
                waited = True
        return waited

    # ---- pace ----------------------------------------------------------------------------------

    def set_share(self, role: str, share: float) -> None:
        """This process's share of the group's work for ``role`` (the partitions it holds, out
        of all): until the members' reports say otherwise, each process sends the mean of its
        shares of the two delivery roles (a role it does not run counts 0). Each role's shares
        add up to 1 over the group, so the means do too, however the roles' partitions are
        spread."""
        self._shares[role] = share
        self._share = sum(self._shares.values()) / len(DELIVERY_ROLES)

    def reserve(self, destination: Destination) -> float:
        """Take ``destination``'s next turn: how long to wait for it (0: now, or no limit)."""
        bucket = self._bucket(destination)
        if bucket is None:
            return 0.0
        self.pace.taken(destination.id)
        wait = bucket.reserve()
        if wait > 0:
            self.pace.waited(destination.id)
        return wait

    def rate_wait(self, destination: Destination) -> float:
        """How long the next request to ``destination`` would wait for its turn (0: none)."""
        bucket = self._bucket(destination)
        if bucket is None:
            return 0.0
        return bucket.waiting()

    def queue(self, destination: Destination) -> tuple[float, float]:
        """``Health.queue`` and ``Health.behind`` of ``destination``, in seconds of the
        group's pace: this process's own rate swings with its share (to ``MIN_SHARE`` of it
        before the others' reports), and a queue reckoned in it looked minutes long (300 calls
        at 20/s across two workers were parked a minute; bench section 14 saw 0.12 of the
        limit). Each process's head is then up to 30 s of the group's pace, not of its own."""
        head, parked = self.pace.parked(destination.id)
        if not parked:
            return 0.0, 0.0
        rate = self.group_rate(destination) or self.pace.accepting(destination.id)
        return (head / rate, parked / rate) if rate > 0 else (0.0, 0.0)

    def rate_of(self, destination: Destination) -> float | None:
        """The requests per second this process sends ``destination`` at most (``None``: no
        limit)."""
        bucket = self._bucket(destination)
        return None if bucket is None else bucket.rate

    def group_rate(self, destination: Destination) -> float | None:
        """The requests per second the whole deployment sends ``destination`` at most: its
        ``rate_limit``, or less while its pace is lowered (``None``: no limit)."""
        limit, lowered = destination.rate_limit, self.pace.pace(destination.id)
        if lowered is None:
            return limit
        return lowered if limit is None else min(limit, lowered)

    def answered(self, destination: Destination, results: list[UrlResult]) -> None:
        """An attempt's answers, for ``destination``'s pace (429s, ``Retry-After``)."""
        for result in results:
            self.pace.answered(destination.id, result.status, result.retry_after)

    def _bucket(self, destination: Destination) -> TokenBucket | None:
        limit = self.group_rate(destination)
        if limit is None:
            return None
        share = self.pace.share(destination.id, fallback=self._share)
        rate = limit * max(share, MIN_SHARE)
        bucket = self._buckets.get(destination.id)
        if bucket is None:
            bucket = self._buckets[destination.id] = TokenBucket(rate=rate)
        elif bucket.rate != rate:
            bucket.adjust(rate)
        return bucket
