"""``pipeline topics create``: create or check every topic (idempotent)."""

from __future__ import annotations

import argparse

from pipeline.commands._args import Subparsers
from pipeline.core.settings import Settings

__all__ = ["register", "run"]


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser("topics", parents=[common], help="manage topics")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("create", parents=[common], help="create or check every topic (idempotent)")
    parser.set_defaults(run=run, kafka="wait")


def run(_args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.kafka.clients import create_topics

    for topic, status in sorted(create_topics(settings).items()):
        print(f"{topic:<50} {status}")
    return 0
