"""``pipeline router|deliver|retry|worker``: run consumer roles until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Iterable

from pipeline.commands._args import Subparsers, metrics_port_flag
from pipeline.core.settings import Settings

__all__ = ["register", "run", "run_roles_until_signalled"]

_HELP = {
    "router": "route calls to destinations",
    "deliver": "deliver webhooks",
    "retry": "retry failed deliveries from the tier topics",
    "worker": "router, deliver and retry in one process",
}


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    for role, text in _HELP.items():
        parser = sub.add_parser(role, parents=[common], help=text)
        metrics_port_flag(parser)
        parser.set_defaults(run=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.roles.worker import ROLES
    from pipeline.runtime.metrics import serve_metrics

    serve_metrics(args.metrics_port)
    run_roles_until_signalled(settings, ROLES if args.command == "worker" else (args.command,))
    return 0


def run_roles_until_signalled(settings: Settings, roles: Iterable[str]) -> None:
    """Run ``roles``; SIGINT/SIGTERM drain in-flight work, commit, and return."""
    from pipeline.roles.worker import run_roles
    from pipeline.runtime.gc_tuning import tune_for_throughput

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run_roles(settings, roles, stop)

    tune_for_throughput()
    asyncio.run(main())
