"""What every console view shares: the console and sessions it serves, drawing a page, and the
post/redirect/get helpers.

Every value from outside (event names, traits, receivers' answers, ids) reaches a template as
data and is escaped there (autoescape on every template). Forms POST and redirect (the
post/redirect/get pattern), so a reload never submits twice.
"""

from __future__ import annotations

import re
from typing import Any

import aiohttp_jinja2
from aiohttp import web

from pipeline.core.timestamps import format_timestamp
from pipeline.http.console._auth import SESSION, Session, Sessions
from pipeline.http.console._backend import Console

__all__ = ["Views", "local_path", "redirect", "session_of"]

#: A path on this console: one slash, then no slash or backslash (``//x`` and ``/\\x`` are
#: other hosts to a browser), no control character or space.
_LOCAL_PATH = re.compile(r"/(?![/\\])[^\\\x00-\x20\x7f]*")


def local_path(target: str, default: str) -> str:
    """``target`` if it is a path on this console, else ``default``: a redirect never leaves."""
    return target if _LOCAL_PATH.fullmatch(target) else default


def session_of(request: web.Request) -> Session:
    return request[SESSION]


def redirect(
    path: str, flash: str | None = None, session: Session | None = None
) -> web.HTTPSeeOther:
    """See ``path`` (303), with ``flash`` shown on the session's next page."""
    if flash and session is not None:
        session.flash.append(flash)
    return web.HTTPSeeOther(path)


class Views:
    """A group of the console's pages; each group adds its own routes."""

    def __init__(self, console: Console, sessions: Sessions) -> None:
        self.console = console
        self.sessions = sessions

    def add_routes(self, app: web.Application) -> None:
        raise NotImplementedError

    def _page(
        self, request: web.Request, template: str, status: int = 200, **context: Any
    ) -> web.Response:
        session = request.get(SESSION)
        flash = []
        if session is not None:
            flash, session.flash = session.flash, []
        return aiohttp_jinja2.render_template(
            template,
            request,
            {
                "session": session,
                "flash": flash,
                "store_problem": self.console.store_problem,
                "path": request.path,
                "fmt_time": lambda ms: format_timestamp(ms) if ms else "",
                **context,
            },
            status=status,
        )
