"""``pipeline send FILE.jsonl``: produce Segment-format calls, one JSON object a line."""

from __future__ import annotations

import argparse
import sys

from pipeline.commands._args import Subparsers
from pipeline.core.settings import Settings

__all__ = ["register", "run"]


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser(
        "send", parents=[common], help="produce Segment-format calls from a JSONL file"
    )
    parser.add_argument("file", help="one JSON call per line ('-' for stdin)")
    who = parser.add_mutually_exclusive_group()
    who.add_argument("--write-key", help="write key of the source (a line's own writeKey wins)")
    who.add_argument("--source", help="source id, instead of a write key")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    parser.set_defaults(run=run, kafka="wait")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.ops.send import open_input, send_lines

    with open_input(args.file) as lines:
        summary = send_lines(
            settings, lines, write_key=args.write_key, source_id=args.source, progress=args.progress
        )
    for number, problem in summary.rejected:
        print(f"line {number}: {problem}", file=sys.stderr)
    for problem in summary.failed:
        print(f"kafka refused a call: {problem}", file=sys.stderr)
    rate = summary.sent / summary.seconds if summary.seconds else 0.0
    print(
        f"sent {summary.sent} calls, rejected {len(summary.rejected)} lines, "
        f"{len(summary.failed)} failed ({rate:,.0f} calls/s)",
        file=sys.stderr,
    )
    return 0 if summary.ok else 1
