"""``pipeline router|deliver|retry|log-store|worker``: run consumer roles until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterable

from pipeline.commands._args import Subparsers, metrics_port_flag
from pipeline.core.settings import Settings

__all__ = ["register", "run", "run_roles_until_signalled"]

_HELP = {
    "router": "route calls to destinations",
    "deliver": "deliver webhooks",
    "retry": "retry failed deliveries from the tier topics",
    "log-store": "write the delivery log (deliveries.log) to its store, for trace, log and stats",
    "worker": "router, deliver and retry in one process, and a log-store process beside it",
}


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    for role, text in _HELP.items():
        parser = sub.add_parser(role, parents=[common], help=text)
        metrics_port_flag(parser)
        if role == "log-store":
            parser.add_argument(
                "--rebuild",
                action="store_true",
                help="empty the store first and write the whole retained log again",
            )
        if role == "worker":
            parser.add_argument(
                "--no-log-store",
                action="store_true",
                help="do not start a log-store beside the worker (it runs elsewhere)",
            )
        parser.set_defaults(run=run, kafka="check")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.roles.worker import ROLES
    from pipeline.runtime.metrics import serve_metrics

    if getattr(args, "rebuild", False):
        _rebuild(settings)
    serve_metrics(args.metrics_port)
    if args.command != "worker":
        run_roles_until_signalled(settings, [args.command])
        return 0
    # The log-store runs in a process of its own: its decoding and writing would otherwise take
    # the delivery roles' interpreter lock. It is started only where the pipeline logs.
    wanted = settings.log and not args.no_log_store
    log_store = _start_log_store(args, settings) if wanted else None
    try:
        run_roles_until_signalled(settings, [role for role in ROLES if role != "log-store"])
    finally:
        if log_store is not None:
            _stop(log_store)
    return 0


def _start_log_store(args: argparse.Namespace, settings: Settings) -> subprocess.Popen[bytes]:
    """``pipeline log-store`` with the worker's settings (and ``/metrics`` on the next port); it
    gets SIGTERM if the worker dies without stopping it (Linux)."""
    command = [sys.executable, "-m", "pipeline", "log-store"]
    command += ["--bootstrap-servers", settings.bootstrap_servers]
    command += ["--topic-prefix", settings.topic_prefix]
    if args.settings:
        command += ["--settings", args.settings]
    if args.metrics_port:
        command += ["--metrics-port", str(args.metrics_port + 1)]
    if args.verbose:
        command.append("--verbose")
    parent = os.getpid()
    return subprocess.Popen(command, preexec_fn=lambda: _die_with_parent(parent))


def _die_with_parent(parent: int) -> None:
    """In the child, before exec: ask Linux for SIGTERM when the parent dies. A parent that died
    before the request took effect (killed right after the fork) would never send it: then the
    child goes at once."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(1)


def _stop(process: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _rebuild(settings: Settings) -> None:
    from pipeline.roles.log_store import empty_store

    shown = empty_store(settings)
    print(
        f"log-store: emptied {shown}; writing the retained log again", file=sys.stderr, flush=True
    )


def run_roles_until_signalled(settings: Settings, roles: Iterable[str]) -> None:
    """Run ``roles``; SIGINT/SIGTERM drain in-flight work, commit, and return."""
    from pipeline.roles.worker import run_roles
    from pipeline.runtime import event_loop
    from pipeline.runtime.gc_tuning import tune_for_throughput

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run_roles(settings, roles, stop)

    tune_for_throughput()
    event_loop.run(main(), settings.event_loop)
