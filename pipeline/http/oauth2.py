"""OAuth2 client credentials for a destination's requests (``oauth2`` in its config).

One token per (token URL, client, scope) in a process, shared by every request: fetched on first
use (a single request however many wait for it), refreshed once it is within ``REFRESH_BEFORE``
of its expiry (or a tenth of its life, for short-lived tokens), and dropped when a receiver
answers 401 with it (``spoiled``), so the next request fetches a fresh one. A token endpoint that
fails makes the attempt fail as ``auth_error`` (retried); its failure is remembered for
``FAILURE_HOLD`` seconds so that a backlog does not hammer it, and logged at most once per
``LOG_EVERY`` seconds. Tokens and the client secret never reach a log line.

The request is RFC 6749 §4.4: ``grant_type=client_credentials`` (and ``scope``), the client
authenticated with HTTP Basic (§2.3.1), the answer ``{"access_token", "expires_in"}``.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import quote

import orjson

from pipeline.core.config import OAuth2

__all__ = ["TokenError", "Tokens", "FormPost"]

log = logging.getLogger("pipeline.oauth2")

#: A token is refreshed this long before it expires (at most a tenth of its life).
REFRESH_BEFORE = 30.0
#: A token endpoint's answer without ``expires_in`` is taken to hold this long.
DEFAULT_LIFETIME = 300.0
#: After a failed fetch, requests fail at once for this long rather than fetch again.
FAILURE_HOLD = 1.0
#: A failing token endpoint is logged at most this often.
LOG_EVERY = 30.0

#: POSTs a form: (url, form, headers) → (status, body); raises ``OSError``/``TimeoutError`` or
#: the client's errors when no answer came (the sender's guarded session).
FormPost = Callable[[str, dict[str, str], dict[str, str]], Awaitable[tuple[int, bytes]]]


class TokenError(Exception):
    """No token: why, in words that carry no secret."""


@dataclass(slots=True)
class _Held:
    token: str | None = None
    refresh_at: float = 0.0
    failed: str | None = None
    failed_until: float = 0.0
    logged_at: float = float("-inf")


#: A client's tokens: its secret is part of it, so a changed secret fetches a new token.
Key = tuple[str, str, str, str | None]


def _key(oauth: OAuth2) -> Key:
    return (oauth.token_url, oauth.client_id, oauth.client_secret, oauth.scope)


class Tokens:
    """The process's OAuth2 tokens; ``post`` makes the token requests."""

    def __init__(self, post: FormPost, clock: Callable[[], float] = time.monotonic) -> None:
        self._post = post
        self._clock = clock
        self._held: dict[Key, _Held] = {}
        self._locks: dict[Key, asyncio.Lock] = {}

    async def token(self, oauth: OAuth2) -> str:
        """A token for ``oauth`` (fetched if there is none fresh); ``TokenError`` if none can be
        had now."""
        key = _key(oauth)
        held = self._held.setdefault(key, _Held())
        now = self._clock()
        if held.token is not None and now < held.refresh_at:
            return held.token
        if held.failed is not None and now < held.failed_until:
            raise TokenError(held.failed)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:  # one fetch for all who wait
            now = self._clock()
            if held.token is not None and now < held.refresh_at:
                return held.token
            if held.failed is not None and now < held.failed_until:
                raise TokenError(held.failed)
            try:
                token, lifetime = await self._fetch(oauth)
            except TokenError as exc:
                held.failed, held.failed_until = str(exc), self._clock() + FAILURE_HOLD
                if self._clock() - held.logged_at >= LOG_EVERY:
                    held.logged_at = self._clock()
                    log.warning("oauth2: no token for client %s: %s", oauth.client_id, exc)
                raise
            held.failed = None
            held.token = token
            held.refresh_at = self._clock() + lifetime - min(REFRESH_BEFORE, lifetime / 10)
            return token

    def spoiled(self, oauth: OAuth2, token: str) -> None:
        """A receiver answered 401 to ``token``: the next request fetches a new one (unless
        another request already did)."""
        held = self._held.get(_key(oauth))
        if held is not None and held.token == token:
            held.token = None

    async def _fetch(self, oauth: OAuth2) -> tuple[str, float]:
        form = {"grant_type": "client_credentials"}
        if oauth.scope:
            form["scope"] = oauth.scope
        login = f"{quote(oauth.client_id, safe='')}:{quote(oauth.client_secret, safe='')}"
        headers = {
            "Authorization": "Basic " + base64.b64encode(login.encode()).decode(),
            "Accept": "application/json",
        }
        where = f"token endpoint {oauth.token_url}"
        try:
            status, body = await self._post(oauth.token_url, form, headers)
        except Exception as exc:  # the OS's or the client's errors: no answer
            raise TokenError(f"{where} did not answer: {type(exc).__name__}") from None
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError:
            answer = None
        if status != 200 or not isinstance(answer, dict):
            error = answer.get("error") if isinstance(answer, dict) else None
            said = f" ({str(error)[:100]})" if isinstance(error, str) else ""
            raise TokenError(f"{where} answered {status}{said}")
        token = answer.get("access_token")
        if not isinstance(token, str) or not token:
            raise TokenError(f"{where} answered without an access_token")
        lifetime = answer.get("expires_in", DEFAULT_LIFETIME)
        if not isinstance(lifetime, int | float) or isinstance(lifetime, bool) or lifetime <= 0:
            lifetime = DEFAULT_LIFETIME
        return token, float(lifetime)
