"""The web console (``pipeline console``): destinations at a glance, their settings and toggle,
sources and their schema page, messages and their trace, dead letters and their replay, and
test events.

aiohttp with Jinja2 templates (autoescaped), served without a line of JavaScript: forms post
and redirect, long jobs refresh their page. See docs/decisions.md ("Console").

    app = make_console_app(settings, password="...")
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from urllib.parse import quote

import aiohttp_jinja2
import jinja2
from aiohttp import web

from pipeline.core.settings import Settings
from pipeline.http.console._auth import Sessions, security_middleware
from pipeline.http.console._backend import Console
from pipeline.http.console._destination_views import DestinationViews
from pipeline.http.console._login_views import LoginViews
from pipeline.http.console._message_views import MessageViews
from pipeline.http.console._source_views import SourceViews

__all__ = ["make_console_app", "loopback"]

_HERE = Path(__file__).parent


def loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``): only reachable from here.

    >>> loopback("127.0.0.1"), loopback("::1"), loopback("127.evil.example"), loopback("0.0.0.0")
    (True, True, False, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def make_console_app(
    settings: Settings, *, password: str, secure_cookie: bool = False
) -> web.Application:
    """The console's application; it follows the config and events topics while it runs."""
    sessions = Sessions(password, secure_cookie=secure_cookie)
    console = Console(settings)
    app = web.Application(middlewares=[security_middleware(sessions)], client_max_size=256 * 1024)
    aiohttp_jinja2.setup(
        app,
        loader=jinja2.FileSystemLoader(_HERE / "templates"),
        autoescape=jinja2.select_autoescape(default=True, default_for_string=True),
        undefined=jinja2.StrictUndefined,
        # One path segment, whatever it holds (a messageId may hold "/" or ".."): |path.
        filters={"path": lambda value: quote(str(value), safe="")},
    )
    # Routes match in the order they were added: each group's, in this order.
    for views in (LoginViews, DestinationViews, SourceViews, MessageViews):
        views(console, sessions).add_routes(app)
    app.router.add_static("/static/", _HERE / "static", append_version=False)

    async def lifecycle(app: web.Application) -> object:
        await console.start()
        yield
        await console.stop()

    app.cleanup_ctx.append(lifecycle)  # type: ignore[arg-type]
    return app
