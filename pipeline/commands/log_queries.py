"""``pipeline trace|log|stats``: questions to the delivery log's store.

``trace MESSAGE_ID``: a call's journey and where it stands per destination. ``log``: one line a
call and destination, newest first, filtered. ``stats``: per destination, over a window.
``--json`` prints JSON lines with stable field names (README, "The delivery log").

They read the store that ``pipeline log-store`` writes (``PIPELINE_LOG_STORE_URL``, or the
embedded file of these settings); they do not need Kafka. ``stats`` also tells each ordered
destination's held users, from Kafka (``pipeline.ops.ordering``), and says when Kafka does not
answer rather than fail.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING, Any

import orjson

from pipeline.commands._args import Subparsers, positive
from pipeline.core.settings import Settings
from pipeline.store import LOG_STATES

if TYPE_CHECKING:
    from pipeline.core.held_users import HeldUsers
    from pipeline.core.pace import PaceView

__all__ = ["register", "run"]

log = logging.getLogger("pipeline")


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    trace = sub.add_parser(
        "trace",
        parents=[common],
        help="a call's journey and its state per destination",
        description="Every decision about one call, in time order, and where it stands now "
        "for each destination: delivered, waiting (tier N until T), dead_lettered (reason), "
        "dropped (reason).",
    )
    trace.add_argument("message_id", metavar="MESSAGE_ID")
    _json_flag(trace)
    trace.set_defaults(run=run)

    log = sub.add_parser(
        "log",
        parents=[common],
        help="calls and their outcomes, newest first",
        description="One line a call and destination, newest first.",
    )
    log.add_argument("--destination", metavar="D", help="only this destination id")
    log.add_argument("--source", metavar="S", help="only this source id")
    log.add_argument("--user", metavar="U", help="only this userId or anonymousId")
    log.add_argument("--type", metavar="T", dest="call_type", help="only this call type")
    log.add_argument(
        "--state",
        choices=LOG_STATES,
        help="only calls in this state now (failed: at least one attempt failed)",
    )
    _window_flags(log, since=None)
    log.add_argument(
        "--limit", type=positive, default=50, metavar="N", help="at most N lines (default 50)"
    )
    _json_flag(log)
    log.set_defaults(run=run)

    stats = sub.add_parser(
        "stats",
        parents=[common],
        help="per destination: attempts, success ratio, p50/p95, errors, waiting, dead letters",
    )
    _window_flags(stats, since="1h")
    _json_flag(stats)
    stats.set_defaults(run=run)


def _json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="JSON lines, for scripts")


def _window_flags(parser: argparse.ArgumentParser, *, since: str | None) -> None:
    default = f" (default {since})" if since else ""
    parser.add_argument(
        "--since",
        default=since,
        metavar="T",
        help=f"from T: a time (2026-11-21T07:00:00Z) or a duration ago (2h, 30m){default}",
    )
    parser.add_argument("--until", metavar="T", help="up to T: a time or a duration ago")


def _window(args: argparse.Namespace) -> tuple[int | None, int | None]:
    from pipeline.core.timestamps import now_ms, parse_when

    now = now_ms()
    since = None if args.since is None else parse_when(args.since, now=now, name="--since")
    until = None if args.until is None else parse_when(args.until, now=now, name="--until")
    if since is not None and until is not None and until <= since:
        raise ValueError(f"--until ({args.until}) is not after --since ({args.since})")
    return since, until


def _open(settings: Settings) -> Any:
    from pipeline.core.settings import default_log_store_url
    from pipeline.store import open_store

    return open_store(default_log_store_url(settings))


def _print_json(rows: list[Any]) -> None:
    for row in rows:
        print(orjson.dumps(row.as_json()).decode())


def run(args: argparse.Namespace, settings: Settings) -> int:
    query = {"trace": _trace, "log": _log, "stats": _stats}[args.command]
    return query(args, settings)


def _trace(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.store.format import format_trace

    with _open(settings) as store:
        trace = store.trace(args.message_id)
    if trace is None:
        print(
            f"trace: no call with messageId {args.message_id!r} in the delivery log",
            file=sys.stderr,
        )
        return 1
    if args.json:
        _print_json([trace])
    else:
        print(format_trace(trace, settings.trace_url_template))
    return 0


def _log(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.store import LogQuery
    from pipeline.store.format import format_log

    since, until = _window(args)
    query = LogQuery(
        destination=args.destination,
        source=args.source,
        user=args.user,
        call_type=args.call_type,
        state=args.state,
        since_ms=since,
        until_ms=until,
        limit=args.limit,
    )
    with _open(settings) as store:
        rows = store.log(query)
    if args.json:
        _print_json(rows)
    elif rows:
        print(format_log(rows))
    else:
        print("log: no calls match", file=sys.stderr)
    return 0


def _stats(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.core.timestamps import now_ms
    from pipeline.store.format import HELD_UNKNOWN, format_held_users, format_stats, safe

    since, until = _window(args)
    with _open(settings) as store:
        rows = store.stats(since or 0, until)
    held = _held_users(settings)
    paces = _paces(settings) if held is not None else None
    now = now_ms()
    if args.json:
        _print_stats_json(rows, held, paces or {})
        if held is None:
            print(f"stats: {HELD_UNKNOWN}", file=sys.stderr)
        return 0
    if rows:
        print(format_stats(rows))
    else:
        print("stats: no deliveries in that window", file=sys.stderr)
    lines = format_held_users(held, now)
    for destination, view in sorted((paces or {}).items()):
        said = view.text(now / 1000)
        if said is not None:
            lines.append(f"{safe(destination, 40)}: {said}")
    if lines:
        if rows:
            print()
        print("\n".join(lines))
    return 0


def _paces(settings: Settings) -> dict[str, PaceView] | None:
    """Lowered paces and pauses per destination (``pipeline.ops.pace``), from Kafka."""
    from pipeline.core.exceptions import BrokerUnavailable
    from pipeline.ops.pace import pace_views

    try:
        return pace_views(settings)
    except BrokerUnavailable as exc:
        log.debug("stats: paces unknown: %s", exc)
        return None


def _held_users(settings: Settings) -> dict[str, HeldUsers] | None:
    """Held users per destination (``pipeline.ops.ordering``), from Kafka: ``None`` when Kafka
    does not answer (the rest of ``stats`` needs only the store)."""
    from pipeline.core.exceptions import BrokerUnavailable
    from pipeline.ops.ordering import held_users

    try:
        return held_users(settings)
    except BrokerUnavailable as exc:
        log.debug("stats: held users unknown: %s", exc)
        return None


def _print_stats_json(
    rows: list[Any], held: dict[str, HeldUsers] | None, paces: dict[str, PaceView]
) -> None:
    """Each row with its destination's held users (``held_users`` ``null``: unknown) and pace
    (``pace``: a lowered pace, requests/s; ``paused_until``: a receiver's pause), and a row for
    each destination with held users or a pace but nothing in the window."""
    from pipeline.store import DestinationStats
    from pipeline.store.format import held_users_json, iso

    seen = {row.destination for row in rows}
    idle = [
        DestinationStats(
            destination=d,
            attempts=0,
            delivered=0,
            failed=0,
            success_ratio=None,
            p50_ms=None,
            p95_ms=None,
            last_error=None,
            last_error_status=None,
            last_error_at=None,
            waiting=0,
            dead_lettered=0,
        )
        for d in sorted({*(held or {}), *paces})
        if d not in seen
    ]
    for row in [*rows, *idle]:
        found = None if held is None else held.get(row.destination)
        line = {**row.as_json(), **held_users_json(found, known=held is not None)}
        view = paces.get(row.destination)
        line["pace"] = None if view is None else view.pace
        line["paused_until"] = (
            iso(int(view.paused_until * 1000)) if view and view.paused_until else None
        )
        print(orjson.dumps(line).decode())
