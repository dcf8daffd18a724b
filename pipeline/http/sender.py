"""The webhook request (seed §2.2, §4.1), sent with aiohttp, guarded. It only sends: the health of
the endpoints it sends to (circuits, silence, answer times, pace) is ``EndpointHealth``'s, which
it tells of every request.

One ``ClientSession`` per worker, shared by every destination. Redirects are not followed. TLS
certificates are verified against the system's trust store (``SSL_CERT_FILE`` adds one): a receiver
with a self-signed certificate fails the handshake, so no request is ever sent to it.

- **SSRF guard.** Host names are resolved by ``GuardedResolver``, which drops every address the
  ``AddressPolicy`` refuses; aiohttp connects only to the addresses it returns, so the address
  checked is the address connected to (no DNS-rebinding gap). IP-literal hosts, which aiohttp does
  not resolve, are checked before the request, and every socket is checked once more as it is
  created. Refused → ``blocked_address``, no connection made.
- **Concurrency limit**, per host: at most ``max_connections_per_host`` requests in flight; the
  delivery timeout starts once a request has its slot, so waiting for a slot is never a timeout.
  A record waiting for a slot stops waiting once its endpoint falls silent.
- **Circuits.** An endpoint whose circuit (or its host's) is open is not requested; a record's
  final attempt (the last slot before its deadline) is made all the same: no record is
  dead-lettered without a last request.
- **Every exception is a failure through one table** (``failure_of``), for deliveries and for
  the console's test events alike.

aiohttp and not httpx on this path: with 64 requests in flight httpx 0.28 falls to about 130
requests/s on this machine while aiohttp sends 11,000-15,000 (docs/decisions.md).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import aiohttp

from pipeline.core.address_policy import AddressPolicy
from pipeline.core.config import ClientTls, Destination, OAuth2
from pipeline.core.endpoint_health import EndpointHealth
from pipeline.core.outcomes import Failure, UrlResult
from pipeline.core.secret_rotation import signing_secrets
from pipeline.core.settings import Settings
from pipeline.core.signing import SIGNATURE_HEADER, sign, standard_webhooks_headers
from pipeline.http.address_guard import BlockedAddressError, GuardedResolver, is_ip_literal
from pipeline.http.answers import DETAIL_CHARS, answered, unanswered
from pipeline.http.oauth2 import TokenError, Tokens
from pipeline.http.request_tracing import passed_on, traced_post
from pipeline.http.slots import OutSlots, Slots
from pipeline.runtime import tracing
from pipeline.runtime.awake_clock import AwakeClock
from pipeline.runtime.client_tls import ClientTlsError, client_tls_context
from pipeline.runtime.tracing import TraceHeaders

if TYPE_CHECKING:
    from pipeline.http.h1_post import H1Poster
    from pipeline.http.reqwest_post import ReqwestPoster

__all__ = ["WebhookSender", "USER_AGENT", "BlockedAddressError", "GuardedResolver", "Probe"]

log = logging.getLogger("pipeline.sender")

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


#: How often a record waiting for a host's slot checks whether its endpoint fell silent.
SILENCE_CHECK = 0.1
#: A destination's TLS files are read again this often (seconds).
TLS_REREAD = 60.0
#: How long a target host's verdict behind a proxy holds (as aiohttp's DNS cache).
DNS_VERDICT_SECONDS = 60.0
#: URLs whose ``_Target`` is remembered; past this the cache starts again (config churn).
_MAX_TARGETS = 10_000


class _Target:
    """One webhook URL as the sender sees it, worked out once: its host's connection slots, or
    why it cannot be requested at all (a URL that does not parse, an IP literal the SSRF guard
    refuses). The address policy is fixed for the sender's life, so the verdict is too."""

    __slots__ = ("url", "host", "port", "slots", "failure", "detail")

    def __init__(
        self,
        url: str,
        slots: Slots | None,
        failure: Failure | None = None,
        detail: str = "",
        host: str = "",
        port: int = 0,
    ) -> None:
        self.url = url
        self.host = host
        self.port = port
        self.slots = slots
        self.failure = failure
        self.detail = detail


class WebhookSender:
    """Sends deliveries and test events; tells ``health`` of every request (a health of its own
    when none is given, on the loop's awake clock)."""

    def __init__(
        self,
        settings: Settings,
        *,
        health: EndpointHealth | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._settings = settings
        self._ssl = ssl_context or ssl.create_default_context()
        self._policy = AddressPolicy.parse(settings.allowed_networks)
        self._resolver: GuardedResolver | None = None  # made by start(), on the event loop
        self._proxy = settings.secret("http_proxy")  # PIPELINE_HTTP_PROXY, for every destination
        #: Behind a proxy the final target's host is resolved here too, to judge it: by host,
        #: (when the verdict expires, the refusal or ``None``).
        self._verdicts: dict[str, tuple[float, str | None]] = {}
        self._session: aiohttp.ClientSession | None = None
        #: Requests without TLS settings or a proxy of their own, unless PIPELINE_HTTP_CLIENT is
        #: aiohttp (which serves the others).
        self._poster: H1Poster | ReqwestPoster | None = None
        self._slots: dict[str, Slots] = {}
        self._out = OutSlots()
        self._targets: dict[str, _Target] = {}
        self._tls: dict[ClientTls, tuple[float, ssl.SSLContext | str]] = {}
        self._tokens = Tokens(self._post_form)
        self._awake = AwakeClock()
        self.health = health or EndpointHealth(settings, clock=self._awake)

    async def start(self) -> WebhookSender:
        self._resolver = GuardedResolver(self._policy)
        connector = aiohttp.TCPConnector(
            limit=0,
            limit_per_host=0,  # our per-host slots limit concurrency, outside the timeout
            ssl=self._ssl,
            ttl_dns_cache=60,
            resolver=self._resolver,
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
        if self._settings.http_client == "httptools":
            from pipeline.http.h1_post import H1Poster

            self._poster = H1Poster(
                self._resolver,
                self._settings.delivery_timeout,
                max_bytes=_MAX_RESPONSE_BYTES,
                ssl_context=self._ssl,
            )
        elif self._settings.http_client == "reqwest":
            from pipeline.http.reqwest_post import ReqwestPoster

            self._poster = await ReqwestPoster(
                self._resolver,
                self._settings.delivery_timeout,
                max_bytes=_MAX_RESPONSE_BYTES,
                threads=self._settings.http_threads,
            ).start()
        self._awake.start()
        return self

    async def aclose(self) -> None:
        self._awake.stop()
        if self._poster is not None:
            await self._poster.aclose()
            self._poster = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _guarded_socket(self, addr_info: Any) -> socket.socket:
        family, kind, proto, _, address = addr_info
        refusal = self._policy.refusal(str(address[0]))
        trusted = self._resolver.trusted if self._resolver is not None else ()
        if refusal is not None and (str(address[0]), address[1]) not in trusted:
            raise BlockedAddressError(refusal)
        return socket.socket(family=family, type=kind, proto=proto)

    def signed_headers(
        self, destination: Destination, body: bytes, message_id: str
    ) -> dict[str, str]:
        """The headers every webhook of ``destination`` gets for ``body`` (signed once): content
        type, user agent, and the signature when the destination has a secret."""
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
        if destination.shared_secret is None and destination.signing_key is None:
            return headers
        now = time.time()
        every: list[str] = []
        if destination.shared_secret:
            # During a rotation window X-Signature keeps the old secret; Standard Webhooks signs
            # with every live one (``signing_secrets``).
            signing, every = signing_secrets(destination, now)
            headers[SIGNATURE_HEADER] = sign(body, signing)
            if not destination.standard_webhooks:
                every = []
        key = destination.signing_key  # Ed25519: a v1a signature beside the v1 ones
        if every or key:
            headers.update(
                standard_webhooks_headers(message_id, int(now), body, *every, signing_key=key)
            )
        return headers

    async def attempt(
        self,
        destination: Destination,
        body: bytes,
        message_id: str = "",
        *,
        final: bool = False,
        turn: float | None = None,
        trace: TraceHeaders = (),
        resends: int = 0,
    ) -> list[UrlResult]:
        """POST ``body`` to every webhook of ``destination`` at once, at its turn under its
        pace (``turn``: taken already, monotonic seconds; ``None``: taken now).

        ``final``: the record's last attempt before its deadline; an open circuit does not stop it.
        ``trace``: the call's trace context, ``resends``: its attempts so far
        (``pipeline.http.request_tracing``).
        """
        if turn is None:
            wait = self.health.reserve(destination)
        else:
            wait = turn - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
            # A pause heard while it waited for its turn (another process was answered 429 or
            # 503 with Retry-After): not sent, and parked by the caller.
            paused = None if final else self.health.paused_refusals(destination)
            if paused is not None:
                return paused
        async with self._out.of(destination):  # max_in_flight out; admission bounds who waits
            signed = self.signed_headers(destination, body, message_id)
            tls = self.tls_of(destination)
            proxy = self.proxy_of(destination)
            hooks = destination.webhooks
            oauth, token = destination.oauth2, None
            if oauth is not None:
                try:
                    token = await self._tokens.token(oauth)
                except TokenError as exc:  # no request without its token: retried as auth_error
                    detail = str(exc)[:DETAIL_CHARS]
                    return [
                        UrlResult(h.url, failure=Failure.AUTH_ERROR, detail=detail) for h in hooks
                    ]
                signed = {**signed, "Authorization": f"Bearer {token}"}

            def post(url: str, headers: dict[str, str]) -> Awaitable[UrlResult]:
                if not trace or not tracing.recording(trace):  # no span: the context passes on
                    if trace and destination.trace_context:
                        headers = passed_on(headers, trace)
                    return self._guarded_post(url, headers, body, final, tls, proxy)
                return traced_post(
                    lambda sent: self._guarded_post(url, sent, body, final, tls, proxy),
                    url,
                    headers,
                    trace,
                    resends,
                    destination.id,
                    message_id,
                    destination.trace_context,
                )

            if len(hooks) == 1:  # the common case: no gather, no extra task
                hook = hooks[0]
                results = [await post(hook.url, merged_headers(hook.headers, signed))]
            else:
                results = list(
                    await asyncio.gather(
                        *(post(hook.url, merged_headers(hook.headers, signed)) for hook in hooks)
                    )
                )
            if token is not None and any(result.status == 401 for result in results):
                assert oauth is not None
                results = await self._with_a_new_token(
                    destination, oauth, token, results, signed, post
                )
            self.health.answered(destination, results)
            return results

    async def _with_a_new_token(
        self,
        destination: Destination,
        oauth: OAuth2,
        token: str,
        results: list[UrlResult],
        signed: dict[str, str],
        post: Callable[[str, dict[str, str]], Awaitable[UrlResult]],
    ) -> list[UrlResult]:
        """A receiver answered 401 to ``token``: one new token, and those requests once more
        (the others' results stand). A 401 to the new token stands (a 4xx: the credentials are
        wrong); no new token makes them ``auth_error`` (retried)."""
        self._tokens.spoiled(oauth, token)
        try:
            fresh = await self._tokens.token(oauth)
        except TokenError as exc:  # no new token to try: retried as auth_error, not a 4xx
            detail = str(exc)[:DETAIL_CHARS]
            return [
                UrlResult(r.url, failure=Failure.AUTH_ERROR, detail=detail)
                if r.status == 401
                else r
                for r in results
            ]
        signed = {**signed, "Authorization": f"Bearer {fresh}"}
        again = []
        for hook, result in zip(destination.webhooks, results, strict=True):
            if result.status == 401:
                result = await post(hook.url, merged_headers(hook.headers, signed))
            again.append(result)
        return again

    async def bearer(self, destination: Destination) -> dict[str, str]:
        """The ``Authorization`` header of ``destination``'s OAuth2 token ({} without oauth2);
        ``TokenError`` when none can be had."""
        if destination.oauth2 is None:
            return {}
        return {"Authorization": f"Bearer {await self._tokens.token(destination.oauth2)}"}

    async def _post_form(
        self, url: str, form: dict[str, str], headers: dict[str, str]
    ) -> tuple[int, bytes]:
        """A token request (``pipeline.http.oauth2``), through the guarded session."""
        assert self._session is not None, "WebhookSender.start() was not awaited"
        async with self._session.post(
            url, data=form, headers=headers, allow_redirects=False
        ) as response:
            return response.status, await response.content.read(_MAX_RESPONSE_BYTES)

    def _target(self, url: str) -> _Target:
        """``url``'s target, worked out on first use and remembered."""
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
            port = parts.port or (443 if parts.scheme == "https" else 80)
            origin = f"{parts.scheme}://{host}:{port}"
        except ValueError as exc:
            return _Target(url, None, Failure.INVALID_URL, str(exc))
        if is_ip_literal(host):
            refusal = self._policy.refusal(host)
            if refusal is not None:
                return _Target(url, None, Failure.BLOCKED_ADDRESS, refusal)
        slots = self._slots.get(origin)
        if slots is None:
            slots = self._slots[origin] = Slots(
                self._settings.max_connections_per_host, interval=SILENCE_CHECK
            )
        return _Target(url, slots, host=host, port=port)

    async def _refusal_behind_proxy(self, host: str) -> str | None:
        """Why ``host`` may not be reached (``None``: it may), judged on its addresses here: any
        blocked address refuses it (a proxy resolves it again and may fall back to any of them;
        its answer is not checked). IP literals were judged already. A verdict holds for
        ``DNS_VERDICT_SECONDS``."""
        if is_ip_literal(host):
            return None
        now = time.monotonic()
        known = self._verdicts.get(host)
        if known is not None and known[0] > now:
            return known[1]
        refusal: str | None = None
        assert self._resolver is not None, "WebhookSender.start() was not awaited"
        try:
            addresses = await self._resolver.every_address(host)
        except OSError:
            addresses = []  # not resolvable here: the proxy may know it; it answers for it
        refusals = sorted({r for a in addresses if (r := self._policy.refusal(a)) is not None})
        if refusals:
            refusal = f"{host} resolves to blocked addresses: {'; '.join(refusals)}"
        if len(self._verdicts) >= _MAX_TARGETS:
            self._verdicts.clear()
        self._verdicts[host] = (now + DNS_VERDICT_SECONDS, refusal)
        return refusal

    def proxy_of(self, destination: Destination) -> str | None:
        """The proxy ``destination``'s requests go through (its own, else the worker's)."""
        return destination.proxy or self._proxy

    def tls_of(self, destination: Destination) -> ssl.SSLContext | str | None:
        """The TLS context of ``destination``'s requests (``None``: the session's), or why it
        cannot be made on this machine."""
        return None if destination.mtls is None else self._tls_for(destination.mtls)

    def _tls_for(self, mtls: ClientTls) -> ssl.SSLContext | str:
        """The TLS context of a destination's ``mtls``, made afresh every ``TLS_REREAD``
        seconds (a certificate renewed in place, a file deployed late); or why it cannot be
        made here (a file missing on this worker: its requests fail as connection errors)."""
        now = time.monotonic()
        known = self._tls.get(mtls)
        if known is None or known[0] <= now:
            if len(self._tls) >= _MAX_TARGETS:
                self._tls.clear()
            context: ssl.SSLContext | str
            try:
                context = client_tls_context(mtls)
            except ClientTlsError as exc:
                context = f"mTLS: {exc}"
                log.error("webhook TLS settings unusable on this worker: %s", exc)
            known = self._tls[mtls] = (now + TLS_REREAD, context)
        return known[1]

    async def _guarded_post(
        self,
        url: str,
        headers: dict[str, str],
        body: bytes,
        final: bool = False,
        tls: ssl.SSLContext | str | None = None,
        proxy: str | None = None,
    ) -> UrlResult:
        target = self._target(url)
        if target.slots is None:
            assert target.failure is not None
            return UrlResult(url, failure=target.failure, detail=target.detail)
        if isinstance(tls, str):
            return UrlResult(url, failure=Failure.CONNECTION_ERROR, detail=tls[:DETAIL_CHARS])
        if proxy is not None:  # the proxy connects to the target: judge the target here
            blocked = await self._refusal_behind_proxy(target.host)
            if blocked is not None:
                return UrlResult(url, failure=Failure.BLOCKED_ADDRESS, detail=blocked)
            assert self._resolver is not None, "WebhookSender.start() was not awaited"
            self._resolver.trust(proxy)
        health = self.health
        endpoint = health.endpoint(url)
        # A record waiting behind a hanging endpoint would hold the worker's in-flight slot for
        # nothing: it stops waiting once the endpoint falls silent.
        give_up = None if final else endpoint.silence_check
        if not await target.slots.acquire(give_up):
            return endpoint.silenced()
        try:
            if not final:
                refusal = health.admit(endpoint)  # takes the half-open probe, if it is one
                if refusal is not None:
                    return refusal
            health.started(endpoint)
            result: UrlResult | None = None
            try:
                if self._poster is not None and tls is None and proxy is None:
                    result = await self._poster.post(url, target.host, target.port, headers, body)
                else:
                    result = await self.post(url, headers, body, tls, proxy)
            finally:
                health.ended(endpoint, result)
        finally:
            target.slots.release()
        return result

    async def probe(
        self,
        url: str,
        headers: dict[str, str],
        body: bytes,
        tls: ssl.SSLContext | str | None = None,
        proxy: str | None = None,
    ) -> Probe:
        """POST once, outside every circuit and limit, and keep the whole answer: the console's
        test event. Guarded like every delivery (blocked addresses, no redirects, no cookies);
        ``tls``: the destination's (``tls_of``)."""
        assert self._session is not None, "WebhookSender.start() was not awaited"
        started = time.monotonic()
        target = self._new_target(url)
        if target.failure is not None:
            return Probe(url, None, [], "", 0.0, target.detail)
        if isinstance(tls, str):
            return Probe(url, None, [], "", 0.0, tls)
        options: dict[str, Any] = {} if tls is None else {"ssl": tls}
        if proxy is not None:  # as deliveries: the target judged here, the proxy trusted
            blocked = await self._refusal_behind_proxy(target.host)
            if blocked is not None:
                return Probe(url, None, [], "", 0.0, blocked)
            assert self._resolver is not None
            self._resolver.trust(proxy)
            options["proxy"] = proxy
        try:
            async with self._session.post(
                url, data=body, headers=headers, allow_redirects=False, **options
            ) as response:
                text = await response.content.read(_MAX_RESPONSE_BYTES)
                return Probe(
                    url,
                    response.status,
                    list(response.headers.items()),
                    text[:PROBE_BODY_BYTES].decode("utf-8", "replace"),
                    time.monotonic() - started,
                )
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            _, error = self.failure_of(exc)
        return Probe(url, None, [], "", time.monotonic() - started, error)

    async def post(
        self,
        url: str,
        headers: dict[str, str],
        body: bytes,
        tls: ssl.SSLContext | None = None,
        proxy: str | None = None,
    ) -> UrlResult:
        """One POST and what its answer (or its absence) means; ``tls``: the destination's own
        TLS context (its ``mtls``), else the session's; ``proxy``: the forward proxy to go
        through."""
        assert self._session is not None, "WebhookSender.start() was not awaited"
        started = time.monotonic()
        options: dict[str, Any] = {} if tls is None else {"ssl": tls}
        if proxy is not None:
            options["proxy"] = proxy
        try:
            async with self._session.post(
                url, data=body, headers=headers, allow_redirects=False, **options
            ) as response:
                text = await response.content.read(_MAX_RESPONSE_BYTES)
                return answered(url, response.status, response.headers, text, started)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return unanswered(url, *self.failure_of(exc), started)

    def failure_of(self, exc: BaseException) -> tuple[Failure, str]:
        """What an exception of a request means, and its words: the one table from aiohttp's and
        the OS's exceptions to delivery failures."""
        if isinstance(exc, TimeoutError):
            return Failure.TIMEOUT, f"no answer within {self._settings.delivery_timeout:g} s"
        if isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
            return Failure.TLS_ERROR, _describe(exc)
        if isinstance(exc, aiohttp.ClientHttpProxyError):  # the proxy refused: as a connection
            return Failure.CONNECTION_ERROR, f"proxy answered {exc.status}: {exc.message}"
        if isinstance(exc, aiohttp.ClientConnectorError):
            for cause in (exc.os_error, exc.__cause__):
                if isinstance(cause, BlockedAddressError):
                    return Failure.BLOCKED_ADDRESS, str(cause)
            return Failure.CONNECTION_ERROR, _describe(exc)
        if isinstance(exc, BlockedAddressError):
            return Failure.BLOCKED_ADDRESS, str(exc)
        if isinstance(exc, aiohttp.InvalidURL):
            return Failure.INVALID_URL, _describe(exc)
        if isinstance(exc, aiohttp.ClientResponseError | aiohttp.ClientPayloadError):
            return Failure.BAD_RESPONSE, _describe(exc)
        return Failure.CONNECTION_ERROR, _describe(exc)


def merged_headers(static: dict[str, str], signed: dict[str, str]) -> dict[str, str]:
    """A webhook's static headers under the signed ones, names compared without case (a
    static ``authorization`` must not ride beside an OAuth2 ``Authorization``)."""
    if not static:
        return signed.copy()
    ours = {name.lower() for name in signed}
    headers = {name: value for name, value in static.items() if name.lower() not in ours}
    headers.update(signed)
    return headers


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
