"""The webhook request (seed §2.2, §4.1), sent with aiohttp, guarded.

One ``ClientSession`` per worker, shared by every destination. Redirects are not followed. TLS
certificates are verified against the system's trust store (``SSL_CERT_FILE`` adds one): a receiver
with a self-signed certificate fails the handshake, so no request is ever sent to it.

Guards, per host (scheme, host, port) or per endpoint (webhook URL):

- **SSRF guard.** Host names are resolved by ``GuardedResolver``, which drops every address the
  ``AddressPolicy`` refuses; aiohttp connects only to the addresses it returns, so the address
  checked is the address connected to (no DNS-rebinding gap). IP-literal hosts, which aiohttp does
  not resolve, are checked before the request, and every socket is checked once more as it is
  created. Refused → ``blocked_address``, no connection made.
- **Concurrency limit**, per host: at most ``max_connections_per_host`` requests in flight; the
  delivery timeout starts once a request has its slot, so waiting for a slot is never a timeout.
- **Circuit breakers.** Per endpoint: after a run of retryable failures of that URL it is not
  tried for a cool-down; its records go to the next retry tier at once instead of tying up the
  worker. One SaaS host serves many customers' webhooks, each on its own path: a failing path
  opens its own circuit, and its neighbours on the host go on. Per host as well, for failures of
  the host itself (connection refused or reset, DNS, TLS handshake): those say nothing about a
  path, and a host that is down would otherwise cost a run of failures per URL on it. Any answer
  from the host (even a 500) closes the host's circuit. A record's final attempt (the last slot
  before its deadline) is made all the same: no record is dead-lettered without a last request.
- **Rate limit** per destination, when configured: the group's, of which each process sends the
  share of the partitions it holds (``set_share``).

aiohttp and not httpx on this path: with 64 requests in flight httpx 0.28 falls to about 130
requests/s on this machine while aiohttp sends 11,000-15,000 (docs/decisions.md).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from pipeline.core.address_policy import AddressPolicy
from pipeline.core.circuit import CircuitBreaker, CircuitState
from pipeline.core.config import Destination
from pipeline.core.log_entries import RESPONSE_SNIPPET_BYTES
from pipeline.core.outcomes import RETRYABLE, Failure, UrlResult, classify, parse_retry_after
from pipeline.core.rate_limit import TokenBucket
from pipeline.core.settings import Settings
from pipeline.core.signing import SIGNATURE_HEADER, sign, standard_webhooks_headers
from pipeline.http.slots import Slots

__all__ = ["WebhookSender", "USER_AGENT", "BlockedAddressError", "GuardedResolver", "Probe"]

#: Seed §2.2 and §9.3: ``<product_token>/1.0``.
USER_AGENT = "pipeline-webhooks/1.0"
#: How much of a response body we read (and keep a little of, for the dead-letter record).
_MAX_RESPONSE_BYTES = 64 * 1024
#: How much of a test event's answer the console shows.
PROBE_BODY_BYTES = 4096


@dataclass(frozen=True, slots=True)
class Probe:
    """One POST's whole answer (the console's test event); ``error`` when none came."""

    url: str
    status: int | None
    headers: list[tuple[str, str]]
    body: str
    seconds: float
    error: str | None = None


_DETAIL_CHARS = 200


class BlockedAddressError(OSError):
    """The address is refused by the SSRF guard."""


class GuardedResolver(AbstractResolver):
    """Resolves with aiohttp's threaded resolver, then drops addresses the policy refuses."""

    def __init__(self, policy: AddressPolicy) -> None:
        self._policy = policy
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        allowed = [r for r in results if self._policy.allows(r["host"])]
        if not allowed:
            refusals = sorted({str(self._policy.refusal(r["host"])) for r in results})
            raise BlockedAddressError(
                f"{host} resolves only to blocked addresses: {'; '.join(refusals)}"
            )
        return allowed

    async def close(self) -> None:
        await self._inner.close()


#: Failures of the host, not of the path: they also count against the host's circuit.
HOST_FAILURES = frozenset({Failure.CONNECTION_ERROR, Failure.TLS_ERROR})


def _breaker(settings: Settings) -> CircuitBreaker:
    return CircuitBreaker(
        failures=settings.circuit_failures,
        cool_down=settings.circuit_cool_down,
        cool_down_max=settings.circuit_cool_down_max,
        probe_timeout=settings.delivery_timeout,
    )


class _Host:
    """One origin (scheme, host, port): its connection slots and its circuit for host failures."""

    __slots__ = ("origin", "slots", "breaker")

    def __init__(self, origin: str, settings: Settings) -> None:
        self.origin = origin
        self.slots = Slots(settings.max_connections_per_host, interval=_SILENCE_CHECK)
        self.breaker = _breaker(settings)


class _Target:
    """One webhook URL (an endpoint), worked out once: its host and its own circuit, or why it
    cannot be requested.

    The address policy is fixed for the sender's life, so an IP-literal host's verdict is too.
    """

    __slots__ = (
        "url",
        "host",
        "breaker",
        "failure",
        "detail",
        "_refusals",
        "in_flight",
        "quiet_since",
        "latency",
    )

    def __init__(
        self,
        url: str,
        host: _Host | None,
        settings: Settings,
        failure: Failure | None = None,
        detail: str = "",
    ) -> None:
        self.url = url
        self.host = host
        self.breaker = _breaker(settings)
        self.failure = failure
        self.detail = detail
        self._refusals: dict[bool, UrlResult] = {}
        #: Requests to this URL now, and since when none of them has come back (monotonic).
        self.in_flight = 0
        self.quiet_since = 0.0
        #: How long it takes to answer (a moving average of answered requests; None: unknown).
        self.latency: float | None = None

    def silent(self, now: float, at_most: float) -> bool:
        """Requests are out and none has come back for ten times its usual answer time (at
        least ``QUIET_MIN``, at most ``at_most``; ``QUIET_MIN`` before its first answer): it
        hangs, likely."""
        if not self.in_flight:
            return False
        quiet = (
            QUIET_MIN if self.latency is None else min(at_most, max(QUIET_MIN, 10 * self.latency))
        )
        return now - self.quiet_since > quiet

    def answered(self, seconds: float) -> None:
        self.latency = seconds if self.latency is None else 0.8 * self.latency + 0.2 * seconds

    def refuses(self) -> bool:
        """Is the endpoint's or its host's circuit open? (Asked without taking a probe.)"""
        assert self.host is not None
        return self.breaker.refuses() or self.host.breaker.refuses()

    def silenced(self) -> UrlResult:
        """The result of not waiting for this URL: it is silent (see ``silent``)."""
        return UrlResult(
            self.url,
            failure=Failure.CIRCUIT_OPEN,
            detail="not tried: it has requests out and answered none lately",
        )

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


#: How often a record waiting for a host's slot checks whether its endpoint fell silent.
_SILENCE_CHECK = 0.1
#: How often ``_AwakeClock`` notes that the event loop runs, and the lateness of a note that is
#: the timer's, not a block of the loop.
_BEAT = 0.05
_BEAT_SLACK = 0.005


class _AwakeClock:
    """Monotonic seconds during which the event loop was free to run: a step that blocks it
    does not count.

    An endpoint is silent when none of its requests came back for a while, but answers are
    read only when the loop gets to them. Routing a consumed batch of calls for 50 destinations
    blocks a worker's loop for a few hundred milliseconds; on the wall clock every endpoint with
    a request out then looked silent, and a healthy destination's records were parked (section
    11 of ``make bench``: 30-600 a run). On this clock the block does not count. A beat every
    ``_BEAT`` seconds adds up how late it ran; a block under way counts from the beat it holds
    up."""

    def __init__(self) -> None:
        self._blocked = 0.0
        self._due = time.monotonic()
        self._beat_handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self.stop()  # one chain of beats, whatever calls it twice
        self._due = time.monotonic()
        self._beat()

    def stop(self) -> None:
        if self._beat_handle is not None:
            self._beat_handle.cancel()
            self._beat_handle = None

    def _beat(self) -> None:
        now = time.monotonic()
        self._blocked += max(0.0, now - self._due - _BEAT_SLACK)
        self._due = now + _BEAT
        self._beat_handle = asyncio.get_running_loop().call_later(_BEAT, self._beat)

    def __call__(self) -> float:
        now = time.monotonic()
        if self._beat_handle is None:  # not started: the wall clock
            return now - self._blocked
        return now - self._blocked - max(0.0, now - self._due - _BEAT_SLACK)


#: The least time without an answer that makes an endpoint silent, and the time before its first.
QUIET_MIN = 0.25
#: How long requests out without a first answer make an endpoint unproven (``unproven``): a
#: receiver that is there answers its first requests within milliseconds, where a worker takes
#: in its first batches.
UNPROVEN_AFTER = 0.05
#: After a silent endpoint's requests time out, the time their failures take to reach its circuit
#: (the timeouts of requests started together end within milliseconds of each other).
_HEARD_AFTER = 0.5
#: The roles that send deliveries; each destination's ``rate_limit`` is split over their shares.
DELIVERY_ROLES = ("deliver", "retry")
#: The least share of a rate limit a process sends at (one that holds no partition yet).
MIN_SHARE = 0.01
#: URLs whose ``_Target`` is remembered; past this the cache starts again (config churn).
_MAX_TARGETS = 10_000


class WebhookSender:
    def __init__(self, settings: Settings, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self._settings = settings
        self._ssl = ssl_context or ssl.create_default_context()
        self._policy = AddressPolicy.parse(settings.allowed_networks)
        self._session: aiohttp.ClientSession | None = None
        self._hosts: dict[str, _Host] = {}
        self._targets: dict[str, _Target] = {}
        self._buckets: dict[str, TokenBucket] = {}
        self._shares: dict[str, float] = {}
        self._share = 1.0
        #: The clock of ``_Target.quiet_since`` and of its silence.
        self._awake = _AwakeClock()

    async def start(self) -> WebhookSender:
        connector = aiohttp.TCPConnector(
            limit=0,
            limit_per_host=0,  # our per-endpoint slots limit concurrency, outside the timeout
            ssl=self._ssl,
            ttl_dns_cache=60,
            resolver=GuardedResolver(self._policy),
            socket_factory=self._guarded_socket,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=self._settings.delivery_timeout),
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding",),
            # Cookies a receiver sets are never sent back, to it or to anyone else.
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        self._awake.start()
        return self

    async def aclose(self) -> None:
        self._awake.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _guarded_socket(self, addr_info: Any) -> socket.socket:
        family, kind, proto, _, address = addr_info
        refusal = self._policy.refusal(str(address[0]))
        if refusal is not None:
            raise BlockedAddressError(refusal)
        return socket.socket(family=family, type=kind, proto=proto)

    def signed_headers(
        self, destination: Destination, body: bytes, message_id: str
    ) -> dict[str, str]:
        """The headers every webhook of ``destination`` gets for ``body`` (signed once): content
        type, user agent, and the signature when the destination has a secret."""
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
        if destination.shared_secret:
            headers[SIGNATURE_HEADER] = sign(body, destination.shared_secret)
            if destination.standard_webhooks:
                headers.update(
                    standard_webhooks_headers(
                        message_id, int(time.time()), body, destination.shared_secret
                    )
                )
        return headers

    async def attempt(
        self, destination: Destination, body: bytes, message_id: str = "", *, final: bool = False
    ) -> list[UrlResult]:
        """POST ``body`` to every webhook of ``destination`` at once.

        ``final``: the record's last attempt before its deadline; an open circuit does not stop it.
        """
        if destination.rate_limit is not None:
            wait = self._bucket(destination, destination.rate_limit).reserve()
            if wait > 0:
                await asyncio.sleep(wait)
        signed = self.signed_headers(destination, body, message_id)
        hooks = destination.webhooks
        if len(hooks) == 1:  # the common case: no gather, no extra task
            hook = hooks[0]
            return [await self._guarded_post(hook.url, _merged(hook.headers, signed), body, final)]
        return list(
            await asyncio.gather(
                *(
                    self._guarded_post(hook.url, _merged(hook.headers, signed), body, final)
                    for hook in hooks
                )
            )
        )

    def set_share(self, role: str, share: float) -> None:
        """This process's share of the group's work for ``role`` (the partitions it holds, out
        of all): a destination's ``rate_limit`` is the group's, and each process sends its share
        of it: the mean of its shares of the two delivery roles (a role it does not run counts
        0). Each role's shares add up to 1 over the group, so the means do too, however the two
        roles' partitions are spread (the larger of the two, as before, summed to up to 1.17
        with 3 deliver and 4 retry partitions over two workers: 44/s against a 40/s limit)."""
        self._shares[role] = share
        self._share = sum(self._shares.values()) / len(DELIVERY_ROLES)

    def _bucket(self, destination: Destination, limit: float) -> TokenBucket:
        rate = limit * max(self._share, MIN_SHARE)
        bucket = self._buckets.get(destination.id)
        if bucket is None:
            bucket = self._buckets[destination.id] = TokenBucket(rate=rate)
        elif bucket.rate != rate:
            bucket.adjust(rate)
        return bucket

    def rate_wait(self, destination: Destination) -> float:
        """How long the next request to ``destination`` would wait for its rate limit (0: none)."""
        if destination.rate_limit is None:
            return 0.0
        return self._bucket(destination, destination.rate_limit).waiting()

    def refused_by_circuits(self, destination: Destination) -> list[UrlResult] | None:
        """The results of an attempt at ``destination`` when every webhook's circuit is open:
        known without waiting for a connection slot, signing or a task. ``None`` when any webhook
        may be tried (or has another problem the attempt itself reports).

        Asks the breakers without taking a half-open probe, and takes no rate-limit token: no
        request is made. Not for a record's final attempt, which goes through open circuits.
        """
        results = []
        for hook in destination.webhooks:
            target = self._target(hook.url)
            if target.host is None or not target.refuses():
                return None
            results.append(target.refusal())
        return results

    def reopens_in(self, destination: Destination) -> float | None:
        """Seconds until one of ``destination``'s webhooks may be tried again, when every one is
        refused by an open circuit (its own or its host's); ``None`` when one may be tried now.
        Takes no probe."""
        soonest: float | None = None
        for hook in destination.webhooks:
            target = self._target(hook.url)
            host = target.host
            if host is None or not target.refuses():
                return None
            wait = max(target.breaker.retry_in(), host.breaker.retry_in())
            soonest = wait if soonest is None else min(soonest, wait)
        return soonest

    def unproven(self, destination: Destination) -> bool:
        """Has one of ``destination``'s webhooks had requests out for ``UNPROVEN_AFTER`` while
        none of them has answered a request (any status) in this process yet? Nothing then says
        its receiver is there at all: its next records should not wait behind those requests
        for the ``QUIET_MIN`` that makes it silent (``DeliveryHandler._park_reason``)."""
        now = self._awake()
        waited = False
        for hook in destination.webhooks:
            target = self._targets.get(hook.url)
            if target is None:
                continue
            if target.latency is not None:
                return False
            if target.in_flight and now - target.quiet_since > UNPROVEN_AFTER:
                waited = True
        return waited

    def silent(self, destination: Destination) -> bool:
        """Is every webhook of ``destination`` silent: requests out and none back for ten times
        its usual answer time (at most half the delivery timeout)? Its next records should not
        take in-flight slots to wait behind them (the first seconds of a hang, before its
        circuit can open)."""
        return self.silence_ends_in(destination) is not None

    def silence_ends_in(self, destination: Destination) -> float | None:
        """When ``destination`` is ``silent``, the time until one of its webhooks answers at the
        latest: its oldest request out times out (it started when the webhook last answered, or
        when nothing was out) and its circuit hears of it. ``None`` when it is not silent.

        Its next records wait that long. A hang's first seconds then cost one park a record,
        not one a second (``make bench`` section 3, the first run: 0.79 → 0.87 of the healthy
        destination alone); by then its circuit is open, or it answers again. A receiver that
        only paused keeps its records waiting as long, at most the delivery timeout."""
        now = self._awake()
        after = self._settings.delivery_timeout / 2
        soonest: float | None = None
        for hook in destination.webhooks:
            target = self._targets.get(hook.url)
            if target is None or not target.silent(now, after):
                return None
            ends = target.quiet_since + self._settings.delivery_timeout - now + _HEARD_AFTER
            soonest = ends if soonest is None else min(soonest, ends)
        return soonest

    def open_circuits(self, destination: Destination) -> int:
        """How many of ``destination``'s webhooks have an open or half-open circuit (their own or
        their host's): a metric."""
        count = 0
        for hook in destination.webhooks:
            target = self._target(hook.url)
            host = target.host
            if host is not None and (
                target.breaker.state is not CircuitState.CLOSED
                or host.breaker.state is not CircuitState.CLOSED
            ):
                count += 1
        return count

    def _target(self, url: str) -> _Target:
        """``url``'s target, worked out on first use and remembered (a URL that cannot be
        requested too: the address policy is fixed for the sender's life)."""
        target = self._targets.get(url)
        if target is None:
            if len(self._targets) >= _MAX_TARGETS:
                self._targets.clear()
            target = self._targets[url] = self._new_target(url)
        return target

    def _new_target(self, url: str) -> _Target:
        try:
            parts = urlsplit(url)
            host = parts.hostname or ""
            origin = (
                f"{parts.scheme}://{host}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
            )
        except ValueError as exc:
            return _Target(url, None, self._settings, Failure.INVALID_URL, str(exc))
        if _is_ip_literal(host):
            refusal = self._policy.refusal(host)
            if refusal is not None:
                return _Target(url, None, self._settings, Failure.BLOCKED_ADDRESS, refusal)
        known = self._hosts.get(origin)
        if known is None:
            known = self._hosts[origin] = _Host(origin, self._settings)
        return _Target(url, known, self._settings)

    async def _guarded_post(
        self, url: str, headers: dict[str, str], body: bytes, final: bool = False
    ) -> UrlResult:
        target = self._target(url)
        host = target.host
        if host is None:
            assert target.failure is not None
            return UrlResult(url, failure=target.failure, detail=target.detail)
        # A record waiting behind a hanging endpoint would hold the worker's in-flight slot for
        # nothing: it stops waiting once the endpoint falls silent (``_Target.silent``).
        after = self._settings.delivery_timeout / 2
        give_up = None if final else (lambda: target.silent(self._awake(), after))
        if not await host.slots.acquire(give_up):
            return target.silenced()
        try:
            if not final:
                if target.refuses():
                    return target.refusal()
                target.breaker.allow()  # takes the half-open probe, if it is one
                host.breaker.allow()
            if not target.in_flight:
                target.quiet_since = self._awake()
            target.in_flight += 1
            try:
                result = await self.post(url, headers, body)
            finally:
                target.in_flight -= 1
                target.quiet_since = self._awake()  # it answered (or gave up on) one
        finally:
            host.slots.release()
        if result.status is not None:
            target.answered(result.duration)
        failure = result.failure
        if failure is None:
            target.breaker.record(ok=True)
        elif failure in RETRYABLE:
            target.breaker.record(ok=False)
        if failure in HOST_FAILURES:
            host.breaker.record(ok=False)
        elif result.status is not None:
            host.breaker.record(ok=True)  # the host answered, whatever it said
        return result

    async def probe(self, url: str, headers: dict[str, str], body: bytes) -> Probe:
        """POST once, outside every circuit and limit, and keep the whole answer: the console's
        test event. Guarded like every delivery (blocked addresses, no redirects, no cookies)."""
        assert self._session is not None, "WebhookSender.start() was not awaited"
        started = time.monotonic()
        target = self._new_target(url)
        if target.failure is not None:
            return Probe(url, None, [], "", 0.0, target.detail)
        try:
            async with self._session.post(
                url, data=body, headers=headers, allow_redirects=False
            ) as response:
                text = await response.content.read(_MAX_RESPONSE_BYTES)
                return Probe(
                    url,
                    response.status,
                    list(response.headers.items()),
                    text[:PROBE_BODY_BYTES].decode("utf-8", "replace"),
                    time.monotonic() - started,
                )
        except TimeoutError:
            error = f"no answer within {self._settings.delivery_timeout:g} s"
        except (aiohttp.ClientError, OSError) as exc:
            cause = exc.os_error if isinstance(exc, aiohttp.ClientConnectorError) else exc
            error = str(cause) if isinstance(cause, BlockedAddressError) else _describe(exc)
        return Probe(url, None, [], "", time.monotonic() - started, error)

    async def post(self, url: str, headers: dict[str, str], body: bytes) -> UrlResult:
        assert self._session is not None, "WebhookSender.start() was not awaited"
        started = time.monotonic()

        def result(failure: Failure, detail: str) -> UrlResult:
            return UrlResult(url, None, failure, detail[:_DETAIL_CHARS], time.monotonic() - started)

        try:
            async with self._session.post(
                url, data=body, headers=headers, allow_redirects=False
            ) as response:
                text = await response.content.read(_MAX_RESPONSE_BYTES)
                status = response.status
                failure = classify(status)
                retry_after = None
                if status in (429, 503):
                    retry_after = parse_retry_after(
                        response.headers.get("Retry-After"), time.time()
                    )
                if failure is None:
                    return UrlResult(url, status, None, "", time.monotonic() - started)
                snippet = text[:RESPONSE_SNIPPET_BYTES].decode("utf-8", "replace")
                return UrlResult(
                    url,
                    status,
                    failure,
                    snippet[:_DETAIL_CHARS],
                    time.monotonic() - started,
                    retry_after,
                    snippet,
                )
        except TimeoutError:
            return result(
                Failure.TIMEOUT, f"no answer within {self._settings.delivery_timeout:g} s"
            )
        except (aiohttp.ClientConnectorCertificateError, aiohttp.ClientSSLError) as exc:
            return result(Failure.TLS_ERROR, _describe(exc))
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, BlockedAddressError) or isinstance(
                exc.__cause__, BlockedAddressError
            ):
                return result(Failure.BLOCKED_ADDRESS, str(exc.os_error))
            return result(Failure.CONNECTION_ERROR, _describe(exc))
        except BlockedAddressError as exc:
            return result(Failure.BLOCKED_ADDRESS, str(exc))
        except aiohttp.InvalidURL as exc:
            return result(Failure.INVALID_URL, _describe(exc))
        except (aiohttp.ClientResponseError, aiohttp.ClientPayloadError) as exc:
            return result(Failure.BAD_RESPONSE, _describe(exc))
        except (aiohttp.ClientError, OSError) as exc:
            return result(Failure.CONNECTION_ERROR, _describe(exc))


def _merged(static: dict[str, str], signed: dict[str, str]) -> dict[str, str]:
    if not static:
        return signed.copy()
    headers = dict(static)
    headers.update(signed)
    return headers


def _is_ip_literal(host: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host.split("%", 1)[0])
        return True
    except OSError:
        return False


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
