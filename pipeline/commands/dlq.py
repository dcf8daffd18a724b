"""``pipeline dlq list|replay``: inspect and re-enqueue dead letters."""

from __future__ import annotations

import argparse

from pipeline.commands._args import Subparsers
from pipeline.core.settings import Settings

__all__ = ["register", "run"]


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser("dlq", parents=[common], help="inspect and replay dead letters")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, text in (("list", "show dead letters"), ("replay", "re-enqueue dead letters")):
        p = actions.add_parser(action, parents=[common], help=text)
        p.add_argument("--destination", help="only this destination id")
        p.add_argument("--reason", help="only this reason (e.g. deadline_exceeded, client_error)")
        p.add_argument("--since", help="dead-lettered at or after: ISO time or a duration ago (2h)")
        p.add_argument("--until", help="dead-lettered at or before: ISO time or a duration ago")
        if action == "list":
            p.add_argument("--json", action="store_true", help="JSON lines output")
        else:
            p.add_argument("--dry-run", action="store_true", help="show what would be replayed")
    parser.set_defaults(run=run, kafka="wait")


def run(args: argparse.Namespace, settings: Settings) -> int:
    import orjson

    from pipeline.core.timestamps import parse_when
    from pipeline.ops.dlq import (
        DlqFilter,
        describe_time,
        list_dead_letters,
        replay_dead_letters,
    )

    selection = DlqFilter(
        destination=args.destination,
        reason=args.reason,
        since=parse_when(args.since, name="--since") if args.since else None,
        until=parse_when(args.until, name="--until") if args.until else None,
    )
    if args.action == "replay":
        summary = replay_dead_letters(settings, selection, dry_run=args.dry_run)
        verb = "would replay" if args.dry_run else "replayed"
        for entry in summary.replayed:
            letter = entry.dead_letter
            assert letter.delivery is not None  # only replayable letters are replayed
            print(
                f"{verb} {letter.delivery.destination_id} {letter.delivery.message_id} "
                f"({letter.reason})"
            )
        print(
            f"{verb} {len(summary.replayed)}; skipped {summary.already_replayed} already replayed, "
            f"{summary.not_replayable} not replayable (undecodable)"
        )
        if summary.ordered:
            print(
                f"note: {', '.join(summary.ordered)} deliver each user's calls in order; a replayed "
                "call goes on its own, after the later calls of its user (they went on past it "
                "when it was dead-lettered), and holds no one back"
            )
        return 0
    entries = list_dead_letters(settings, selection)
    if args.json:
        for entry in entries:  # the record's own (camelCase) fields, bytes made printable
            record = dict(entry.letter)
            shown = record.get("delivery")
            if shown is not None:
                shown = dict(shown, body=shown["body"].decode("utf-8", "replace"))
            record["delivery"] = shown
            record["raw"] = None if record["raw"] is None else record["raw"].hex()
            record["replayedAt"] = entry.replayed_at
            print(orjson.dumps(record).decode())
        return 0
    print(
        f"{'DEAD-LETTERED (UTC)':<20} {'REASON':<20} {'DESTINATION':<16} {'MESSAGE ID':<38} "
        f"{'TRIES':<5} {'REPLAYED':<8} LAST ERROR"
    )
    for entry in entries:
        letter = entry.dead_letter
        delivery = letter.delivery
        attempts = delivery.attempts if delivery is not None else ()
        last = attempts[-1] if attempts else None
        error = (
            "-"
            if last is None
            else (f"HTTP {last.status}" if last.status is not None else str(last.error))
        )
        tries = len({attempt.at for attempt in attempts})
        print(
            f"{describe_time(letter.dead_lettered_at):<20} {letter.reason:<20} "
            f"{delivery.destination_id if delivery else '-':<16} "
            f"{delivery.message_id if delivery else '-':<38} "
            f"{tries:<5} {'yes' if entry.replayed_at else 'no':<8} {error[:60]}"
        )
    print(f"{len(entries)} dead letters")
    return 0
