"""``pipeline delete-user USER_ID``: a deletion request (one delete call per affected source)."""

from __future__ import annotations

import argparse

from pipeline.commands._args import Subparsers
from pipeline.core.settings import Settings

__all__ = ["register", "run"]


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser(
        "delete-user", parents=[common], help="a deletion request (delete calls)"
    )
    parser.add_argument("user_id", metavar="USER_ID", help="the user to delete")
    parser.add_argument("--reason", help="why (recorded with the request)")
    parser.add_argument(
        "--force", action="store_true", help="notify already notified sources again"
    )
    parser.add_argument("--status", action="store_true", help="show what the requests sent")
    parser.set_defaults(run=run, kafka="wait")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.ops.deletion import run_delete_user

    return run_delete_user(args, settings)
