"""``pipeline console``: the web console, for the people who run and own destinations.

Login with ``PIPELINE_CONSOLE_PASSWORD``. Without one it listens on a loopback address only,
with a password made up at start and printed once (like a notebook server's token); on any other
address it refuses to start.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys

from pipeline.commands._args import Subparsers
from pipeline.core.exceptions import ConfigError
from pipeline.core.settings import Settings
from pipeline.runtime import event_loop

__all__ = ["register", "run", "console_password"]

PASSWORD_ENV = "PIPELINE_CONSOLE_PASSWORD"  # noqa: S105 (the variable's name)


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser(
        "console",
        parents=[common],
        help="the web console (login with PIPELINE_CONSOLE_PASSWORD)",
        description="Destinations at a glance, their settings and toggle, sources and their "
        "schema page, messages and traces, dead letters and replays, test events. "
        f"Login with {PASSWORD_ENV}; without it, only a loopback address is allowed and a "
        "password is made up and printed.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8070, help="port (default 8070)")
    parser.add_argument(
        "--secure-cookie",
        action="store_true",
        help="mark the session cookie Secure (behind a TLS-terminating proxy)",
    )
    parser.set_defaults(run=run, kafka="check")


def console_password(host: str, settings: Settings) -> tuple[str, bool]:
    """The password (``PIPELINE_CONSOLE_PASSWORD``) and whether it was made up here;
    ``ConfigError`` on a non-loopback address without one."""
    from pipeline.http.console import loopback

    password = settings.secret("console_password")
    if password:
        return password, False
    if not loopback(host):
        raise ConfigError(
            [
                f"console: refusing to listen on {host} without a password; set {PASSWORD_ENV} "
                "(or listen on 127.0.0.1)"
            ]
        )
    return secrets.token_urlsafe(12), True


def run(args: argparse.Namespace, settings: Settings) -> int:
    password, made_up = console_password(args.host, settings)
    event_loop.run(
        _serve(settings, args.host, args.port, password, made_up, args.secure_cookie),
        settings.event_loop,
    )
    return 0


async def _serve(
    settings: Settings, host: str, port: int, password: str, made_up: bool, secure: bool
) -> None:
    from aiohttp import web

    from pipeline.http.console import make_console_app

    app = make_console_app(settings, password=password, secure_cookie=secure)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        shown = f"[{host}]" if ":" in host else host
        print(f"console on http://{shown}:{port}", file=sys.stderr, flush=True)
        if made_up:
            print(
                f"console password (made up for this run; set {PASSWORD_ENV} to choose one): "
                f"{password}",
                file=sys.stderr,
                flush=True,
            )
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
