"""``pipeline replay``: re-deliver retained calls of a time range to one destination (a backfill
for a new destination, or a range again for a receiver that lost data). The work is in
``pipeline.ops.replay``; this module is the command line: arguments, the confirmation before
sending calls again, the progress bar and the summary.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING

from pipeline.commands._args import Subparsers
from pipeline.core.settings import Settings

if TYPE_CHECKING:
    from pipeline.core.call_replay import ReplaySelection

__all__ = ["register", "run"]


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser(
        "replay",
        parents=[common],
        help="re-deliver retained calls of a time range to one destination (backfill)",
        description=(
            "Send the calls of a time range that the calls topic still retains "
            "(PIPELINE_CALLS_RETENTION, default 7d) to one destination again, as live routing "
            "would send them now, with their own messageIds. Interrupted, the same command "
            "resumes where it stopped."
        ),
    )
    parser.add_argument("--destination", required=True, help="the destination id")
    parser.add_argument(
        "--since", required=True, help="calls received at or after: ISO time or a duration ago (2h)"
    )
    parser.add_argument(
        "--until", help="calls received at or before: ISO time or a duration ago (default: now)"
    )
    parser.add_argument("--source", help="only calls of this source id")
    parser.add_argument("--type", help="only calls of this type (track, identify, ...)")
    parser.add_argument("--user", help="only calls of this userId")
    parser.add_argument(
        "--rate",
        type=float,
        help="calls per second at most (default: half the destination's rate_limit, else 200)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="count the calls per type and source, send nothing"
    )
    parser.add_argument(
        "--yes",
        action="store_true",
        help="send calls that an earlier replay already sent to this destination without asking",
    )
    parser.set_defaults(run=run, kafka="wait")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from tqdm import tqdm

    from pipeline.core.call_replay import ReplaySelection
    from pipeline.core.calls import CallType
    from pipeline.core.durations import format_duration
    from pipeline.core.exceptions import InvalidCall
    from pipeline.core.timestamps import format_timestamp, now_ms, parse_when
    from pipeline.ops.replay import plan_replay, run_replay

    now = now_ms()
    call_type = None
    if args.type is not None:
        try:
            call_type = CallType(args.type)
        except ValueError:
            raise InvalidCall(
                "--type",
                f"{args.type!r} is not a call type (one of: {', '.join(t.value for t in CallType)})",
            ) from None
    selection = ReplaySelection(
        destination=args.destination,
        since=parse_when(args.since, now=now, name="--since"),
        until=now if args.until is None else parse_when(args.until, now=now, name="--until"),
        since_text=args.since,
        until_text=args.until or "",
        source=args.source,
        call_type=call_type,
        user=args.user,
    )
    plan = plan_replay(settings, selection, rate=args.rate)
    state = plan.state
    selection = plan.selection
    retained_from = now - int(settings.calls_retention * 1000)
    if selection.since < retained_from:
        print(
            f"note: calls received before {format_timestamp(retained_from)} are past the "
            f"retention of the calls topic (PIPELINE_CALLS_RETENTION "
            f"{format_duration(settings.calls_retention)}) and may be gone",
            file=sys.stderr,
        )
    what = (
        f"calls received {format_timestamp(selection.since)} to "
        f"{format_timestamp(selection.until)}{_filters(selection)}"
    )
    if args.dry_run:
        rest = f" (what is left of {state.id}, interrupted)" if plan.resumed else ""
        print(f"dry run: {what}, to {plan.destination.id}{rest}")
    elif plan.resumed:
        print(
            f"resuming {state.id} (started {format_timestamp(state.started_at)}): {what}, to "
            f"{plan.destination.id}; {state.sent:,} sent before, at most {state.rate:g} calls/s"
        )
    else:
        print(f"{state.id}: {what}, to {plan.destination.id}, at most {state.rate:g} calls/s")
    if plan.earlier and not plan.resumed:
        for earlier in plan.earlier:
            finished = (
                f"finished {format_timestamp(earlier.finished_at)}"
                if earlier.finished_at is not None
                else "unfinished"
            )
            print(
                f"warning: {earlier.id} already sent {earlier.sent:,} calls of an overlapping "
                f"range ({format_timestamp(earlier.since)} to {format_timestamp(earlier.until)}) "
                f"to {earlier.destination_id} ({finished})",
                file=sys.stderr,
            )
        if not args.dry_run and not args.yes and not _confirmed():
            print(
                "nothing sent: receivers dedupe by messageId, but to send these calls again "
                "answer yes, or add --yes",
                file=sys.stderr,
            )
            return 1

    bar = tqdm(
        total=state.scanned + plan.to_read,
        initial=state.scanned,
        unit=" calls",
        unit_scale=True,
        desc="read",
        file=sys.stderr,
        disable=None,  # a bar only on a terminal
    )

    def progress(scanned: int, sent: int) -> None:
        if bar.total is not None and scanned > bar.total:
            bar.total = scanned  # the end was underestimated (the embedded broker's watermark)
        bar.set_postfix_str(f"{'matched' if args.dry_run else 'sent'} {sent:,}", refresh=False)
        bar.update(scanned - bar.n)

    stop = threading.Event()
    try:
        with _ctrl_c_sets(stop):
            result = run_replay(settings, plan, dry_run=args.dry_run, progress=progress, stop=stop)
    finally:
        bar.close()

    total = sum(result.counts.values())
    if result.counts:
        print(f"{'TYPE':<10} {'SOURCE':<24} {'CALLS':>10}")
        for (kind, source), count in sorted(result.counts.items()):
            print(f"{kind:<10} {source:<24} {count:>10,}")
    for reason, count in sorted(result.skipped.items()):
        print(f"not sent ({reason}): {count:,}")
    if args.dry_run:
        print(f"would send {total:,} calls to {plan.destination.id}; nothing sent")
        return 0
    if result.interrupted:
        print(
            f"{state.id} interrupted: {result.state.sent:,} calls sent in all; run the same "
            "command again to resume",
            file=sys.stderr,
        )
        return 130
    print(
        f"{state.id}: sent {total:,} calls to {plan.destination.id} "
        f"({result.state.sent:,} in all); `pipeline log --destination {plan.destination.id}` "
        "shows their delivery"
    )
    return 0


@contextlib.contextmanager
def _ctrl_c_sets(stop: threading.Event) -> Iterator[None]:
    """The first Ctrl-C sets ``stop``: the replay ends after the record at hand, so the signal
    never lands inside a Kafka call or callback. A second one interrupts at once. SIGINT is
    left as it is where it is not Python's default (ignored in a background job)."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return

    def requested(signum: int, frame: FrameType | None) -> None:
        stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    signal.signal(signal.SIGINT, requested)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _filters(selection: ReplaySelection) -> str:
    """`` (source web, type track)`` for the filters given, else nothing."""
    parts = [
        f"{name} {value}"
        for name, value in (
            ("source", selection.source),
            ("type", selection.call_type),
            ("user", selection.user),
        )
        if value is not None
    ]
    return f" ({', '.join(parts)})" if parts else ""


def _confirmed() -> bool:
    """Ask on a terminal; anywhere else the answer is no (``--yes`` says yes up front)."""
    if not sys.stdin.isatty():
        return False
    answer = input("send them again? [y/N] ")
    return answer.strip().lower() in ("y", "yes")
