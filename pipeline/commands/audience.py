"""``pipeline audience sync`` / ``traits sync``: identify calls for what changed since the last sync
(seed §6)."""

from __future__ import annotations

import argparse

from pipeline.commands._args import Subparsers
from pipeline.core.settings import Settings

__all__ = ["register", "run"]


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    for name, column, text in (
        ("audience", "--members", "FILE: one user id per line, or CSV with a user_id column"),
        ("traits", "--values", "FILE: CSV user_id,value (12 → number, true → boolean)"),
    ):
        group = sub.add_parser(name, parents=[common], help=f"{name} syncs (identify calls)")
        sync = group.add_subparsers(dest="action", required=True, metavar="ACTION").add_parser(
            "sync", parents=[common], help="send identify calls for what changed since last sync"
        )
        sync.add_argument("--source", required=True, help="source id the calls belong to")
        sync.add_argument("--name", required=True, help='e.g. "Order Completed Last 30days"')
        sync.add_argument(column, required=True, metavar="FILE", help=text + " ('-': stdin)")
        sync.add_argument("--dry-run", action="store_true", help="show the changes, send nothing")
        sync.add_argument(
            "--allow-empty", action="store_true", help="accept a file with no users (removes all)"
        )
        sync.add_argument("--json", action="store_true", help="print the summary as JSON")
        sync.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
        group.set_defaults(run=run, kafka="wait")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.ops.audience_sync import run_audience_sync, run_traits_sync

    return (run_audience_sync if args.command == "audience" else run_traits_sync)(args, settings)
