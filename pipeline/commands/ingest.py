"""``pipeline ingest``: the HTTP ingestion API (Segment-compatible, ``/metrics`` too)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from pipeline.commands._args import Subparsers, server_flags
from pipeline.core.settings import Settings

if TYPE_CHECKING:
    from pipeline.http.ingest import IngestOptions

__all__ = ["register", "run", "options_from"]


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser(
        "ingest", parents=[common], help="the HTTP ingestion API (Segment-compatible, /metrics too)"
    )
    server_flags(parser, 8080)
    parser.add_argument(
        "--ack-timeout",
        metavar="DURATION",
        help="answer 503 when Kafka has not acknowledged within this (env "
        "PIPELINE_INGEST_ACK_TIMEOUT, default 10s)",
    )
    parser.set_defaults(run=run, kafka="check")


def options_from(args: argparse.Namespace, settings: Settings) -> IngestOptions:
    """The settings' options, with ``--ack-timeout`` over ``PIPELINE_INGEST_ACK_TIMEOUT`` (and
    nothing else of the settings lost, such as ``PIPELINE_ADMIN_TOKEN``)."""
    from pipeline.core.durations import parse_duration
    from pipeline.http.ingest import IngestOptions

    options = IngestOptions.from_settings(settings)
    if args.ack_timeout:
        timeout = parse_duration(args.ack_timeout, name="--ack-timeout")
        options = dataclasses.replace(options, ack_timeout=timeout)
    return options


def run(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.http.ingest import run_ingest

    run_ingest(
        settings, args.host, args.port, options_from(args, settings), access_log=args.verbose
    )
    return 0
