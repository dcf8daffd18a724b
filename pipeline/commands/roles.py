"""``pipeline router|deliver|retry|log-store|worker``: run consumer roles until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Sequence

from pipeline.commands._args import Subparsers, metrics_port_flag, positive
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
            parser.add_argument("--cpu-index", type=int, help=argparse.SUPPRESS)  # supervisor's
            parser.add_argument(
                "--processes",
                type=positive,
                metavar="N",
                help="worker processes under one supervisor, each a member of every group "
                "(env PIPELINE_WORKER_PROCESSES; default one a core, 1 on the embedded broker); "
                "with --metrics-port P they serve /metrics on P..P+N-1, the log-store on P+N",
            )
        parser.set_defaults(run=run, kafka="check")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.roles.worker import ROLES
    from pipeline.runtime.cpu_affinity import pin
    from pipeline.runtime.metrics import serve_metrics

    if getattr(args, "rebuild", False):
        _rebuild(settings)
    # A ``pipeline worker`` of several processes supervises them: its children run the roles.
    processes = (
        (args.processes or settings.worker_processes or _cores()) if args.command == "worker" else 1
    )
    if args.command != "log-store" and processes == 1:
        pin(settings.cpu_affinity, getattr(args, "cpu_index", None))  # before threads start
    if args.command != "worker":
        serve_metrics(args.metrics_port)
        run_roles_until_signalled(settings, [args.command])
        return 0
    # The log-store runs in a process of its own: its decoding and writing would otherwise take
    # the delivery roles' interpreter lock. It is started only where the pipeline logs.
    wanted = settings.log and not args.no_log_store
    if processes > 1:  # the children serve /metrics
        return _supervised(args, settings, processes, wanted)
    serve_metrics(args.metrics_port)
    log_store = _start(_command(args, settings, "log-store", 1)) if wanted else None
    try:
        run_roles_until_signalled(settings, [role for role in ROLES if role != "log-store"])
    finally:
        if log_store is not None:
            _stop(log_store)
    return 0


def _supervised(
    args: argparse.Namespace, settings: Settings, processes: int, log_store: bool
) -> int:
    """``processes`` workers (``/metrics`` on the port and the next ones) and the log-store
    (on the port after them), under one supervisor."""
    from pipeline.commands.supervisor import Child, supervise

    children = [
        Child(
            f"worker {n + 1} of {processes}",
            _command(
                args,
                settings,
                "worker",
                n,
                "--processes",
                "1",
                "--no-log-store",
                "--cpu-index",
                str(n),
            ),
        )
        for n in range(processes)
    ]
    if log_store:
        children.append(Child("log-store", _command(args, settings, "log-store", processes)))
    return supervise(children, start=_start)


def _command(
    args: argparse.Namespace, settings: Settings, role: str, port_offset: int, *extra: str
) -> list[str]:
    """``pipeline ROLE`` with the same settings, ``/metrics`` on ``--metrics-port`` +
    ``port_offset``."""
    command = [sys.executable, "-m", "pipeline", role, *extra]
    command += ["--bootstrap-servers", settings.bootstrap_servers]
    command += ["--topic-prefix", settings.topic_prefix]
    if args.settings:
        command += ["--settings", args.settings]
    if args.metrics_port:
        command += ["--metrics-port", str(args.metrics_port + port_offset)]
    if args.verbose:
        command.append("--verbose")
    return command


def _start(command: Sequence[str]) -> subprocess.Popen[bytes]:
    """``command``, which gets SIGTERM if this process dies without stopping it (Linux)."""
    from pipeline.commands.supervisor import die_with_parent

    parent = os.getpid()
    return subprocess.Popen(command, preexec_fn=lambda: die_with_parent(parent))


def _cores() -> int:
    """The cores this process may run on (its CPU affinity, which containers' cpusets set)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


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
