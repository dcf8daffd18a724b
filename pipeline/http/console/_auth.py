"""Login, sessions, CSRF and the security headers of every console response.

Sessions live in the console process (a random token in an HttpOnly, SameSite=Strict cookie);
a restart logs everyone out, which is fine for an operator's console and keeps no session secret
on disk. Every POST carries the session's CSRF token (the login form a token of its own, in a
short-lived cookie: double submit). No page runs a script: the Content-Security-Policy allows
none, so even markup that escaped the templates' autoescaping could not run.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import quote

from aiohttp import web
from aiohttp.typedefs import Middleware

from pipeline.core.exceptions import PipelineError

__all__ = [
    "CSP",
    "SESSION",
    "SESSION_COOKIE",
    "Session",
    "Sessions",
    "security_middleware",
]

log = logging.getLogger("pipeline.console")

SESSION_COOKIE = "pipeline_console"
_LOGIN_COOKIE = "pipeline_console_login"
#: A session unused this long is forgotten.
IDLE_LIMIT = 12 * 3600.0
#: And any session this long after its login (a page that refreshes itself stays in use).
LIFETIME = 7 * 86400.0
#: A wrong password costs the one who typed it this long (in its own request only).
_WRONG_PASSWORD_DELAY = 1.0

CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
#: Pages anyone may see: the login form, the stylesheet and the health checks.
_OPEN_PATHS = ("/login", "/static/", "/health", "/ready", "/favicon.ico")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Session:
    token: str
    #: Names the session in the change log (``console:<id>``) without giving its token away.
    id: str
    csrf: str
    started: float
    last_seen: float
    #: One message for the next page (``saved``), shown once.
    flash: list[str] = field(default_factory=list)

    @property
    def who(self) -> str:
        return f"console:{self.id}"


#: The logged-in session of a request (set by ``security_middleware``).
SESSION = web.RequestKey("session", Session)


class Sessions:
    def __init__(self, password: str, *, secure_cookie: bool = False) -> None:
        if not password:
            raise ValueError("the console needs a password")
        self._password = password.encode()
        self._secure = secure_cookie
        self._sessions: dict[str, Session] = {}

    def check_password(self, typed: str) -> bool:
        return hmac.compare_digest(typed.encode(), self._password)

    def start(self, response: web.StreamResponse) -> Session:
        now = time.monotonic()
        for old in [s for s in self._sessions.values() if self._expired(s, now)]:
            del self._sessions[old.token]
        token = secrets.token_urlsafe(32)
        session = Session(token, secrets.token_hex(4), secrets.token_urlsafe(32), now, now)
        self._sessions[token] = session
        response.set_cookie(
            SESSION_COOKIE,
            token,
            httponly=True,
            samesite="Strict",
            secure=self._secure,
            path="/",
        )
        return session

    def find(self, request: web.Request) -> Session | None:
        token = request.cookies.get(SESSION_COOKIE)
        session = self._sessions.get(token) if token else None
        if session is None:
            return None
        now = time.monotonic()
        if self._expired(session, now):
            del self._sessions[session.token]
            return None
        session.last_seen = now
        return session

    @staticmethod
    def _expired(session: Session, now: float) -> bool:
        return now - session.last_seen > IDLE_LIMIT or now - session.started > LIFETIME

    def end(self, session: Session, response: web.StreamResponse) -> None:
        self._sessions.pop(session.token, None)
        response.del_cookie(SESSION_COOKIE, path="/")

    @staticmethod
    def new_login_token() -> str:
        return secrets.token_urlsafe(24)

    @staticmethod
    def login_token_of(request: web.Request) -> str | None:
        token = request.cookies.get(_LOGIN_COOKIE)
        return token if token and len(token) == 32 else None

    def set_login_cookie(self, response: web.StreamResponse, token: str) -> None:
        """The login form's CSRF token goes in the form and in a short-lived cookie (double
        submit): a form posted from another site cannot know it."""
        response.set_cookie(
            _LOGIN_COOKIE,
            token,
            httponly=True,
            samesite="Strict",
            secure=self._secure,
            max_age=3600,
            path="/login",
        )

    @staticmethod
    def login_token_ok(request: web.Request, typed: str) -> bool:
        expected = request.cookies.get(_LOGIN_COOKIE, "")
        return bool(expected) and hmac.compare_digest(expected.encode(), typed.encode())

    async def wrong_password(self) -> None:
        await asyncio.sleep(_WRONG_PASSWORD_DELAY)


def security_middleware(sessions: Sessions) -> Middleware:
    """Every response gets the security headers; a page that needs login redirects there; a POST
    without the session's CSRF token is refused."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await _guarded(request, handler)
        except web.HTTPException as exc:
            exc.headers.update(_HEADERS)
            raise
        except Exception as exc:  # a page that failed: said plainly, with the same armour
            log.exception("console: %s %s failed", request.method, request.path)
            response = web.Response(
                status=503 if isinstance(exc, PipelineError) else 500,
                text=f"{type(exc).__name__}: {exc}"
                if isinstance(exc, PipelineError)
                else "the console failed on this page (its log says why)",
            )
        response.headers.update(_HEADERS)
        return response

    async def _guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith(_OPEN_PATHS):
            return await handler(request)
        session = sessions.find(request)
        if session is None:
            if request.method == "GET":
                raise web.HTTPSeeOther(f"/login?next={quote(request.path_qs, safe='')}")
            raise web.HTTPForbidden(text="not logged in (or the session expired): log in again")
        if request.method == "POST":
            form = await request.post()
            typed = form.get("csrf")
            if not isinstance(typed, str) or not hmac.compare_digest(
                typed.encode(), session.csrf.encode()
            ):
                raise web.HTTPForbidden(
                    text="the form's CSRF token is missing or wrong: reload the page and try again"
                )
        request[SESSION] = session
        return await handler(request)

    return middleware
