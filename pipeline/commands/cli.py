"""The ``pipeline`` command (also ``python -m pipeline``): the parser and the dispatch.

Every command is a module of this package with ``register(subparsers, common)`` and
``run(args, settings) -> exit code``; a module imports what its command needs inside ``run``, so
``pipeline --help`` and light commands start quickly.

Every command takes ``--bootstrap-servers`` (env ``PIPELINE_BOOTSTRAP_SERVERS``) and
``--topic-prefix`` (env ``PIPELINE_TOPIC_PREFIX``); timing knobs are environment settings
(``PIPELINE_RETRY_DELAYS``, ``PIPELINE_RETRY_DEADLINE``, ``PIPELINE_DELIVERY_TIMEOUT``).
Exit codes: 0 success, 1 some input rejected or a check failed, 2 usage or config error,
3 Kafka, the Schema Registry or the log store unavailable.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from pipeline.commands import (
    audience,
    broker,
    config,
    console,
    delete_user,
    dev,
    dlq,
    doctor,
    ingest,
    log_queries,
    receiver,
    replay,
    roles,
    send,
    topics,
)
from pipeline.commands import settings as settings_command
from pipeline.commands._args import common_flags, loaded_settings_from
from pipeline.core.exceptions import (
    BrokerUnavailable,
    ConfigError,
    InvalidCall,
    PipelineError,
    StoreUnavailable,
)
from pipeline.core.settings import Settings, SettingsError
from pipeline.kafka.partition_state import StateUnavailable
from pipeline.kafka.registry_codec import SchemaRegistryUnavailable

__all__ = ["main", "build_parser"]

log = logging.getLogger("pipeline")

#: In the order ``pipeline --help`` lists them.
COMMANDS = (
    dev,
    broker,
    topics,
    config,
    roles,
    log_queries,
    send,
    dlq,
    replay,
    delete_user,
    audience,
    console,
    ingest,
    receiver,
    settings_command,
    doctor,
)


#: The commands that make spans when tracing is configured (``pipeline.runtime.tracing``).
TRACED = frozenset({"dev", "ingest", "router", "deliver", "retry", "worker", "dlq", "replay"})


def build_parser() -> argparse.ArgumentParser:
    common = common_flags()
    parser = argparse.ArgumentParser(
        prog="pipeline",
        description="Analytics calls on Kafka, delivered as signed webhooks.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub, common)
    return parser


def _configure_logging(verbose: bool) -> None:
    debug = verbose or "analytics" in os.environ.get("DEBUG", "").split(",")
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not debug:
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
        logging.getLogger("pipeline.rdkafka").setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _configure_logging(args.verbose)
    if getattr(args, "own_settings", False):
        return int(args.run(args, None))
    try:
        loaded = loaded_settings_from(args)
        for note in loaded.notes:
            log.info("settings: %s", note)
        settings = _fit_to_cluster(args, loaded.settings)
        if args.command in TRACED:
            from pipeline.runtime import tracing

            tracing.configure(args.command, pass_through=settings.trace_pass_through)
        code: int = args.run(args, settings)
        return code
    except SettingsError as exc:
        print("error: settings:", *exc.problems, sep="\n  ", file=sys.stderr)
        return 2
    except (ConfigError, InvalidCall) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except SchemaRegistryUnavailable as exc:
        print(f"error: Schema Registry unavailable: {exc}", file=sys.stderr)
        return 3
    except BrokerUnavailable as exc:
        print(f"error: Kafka unavailable: {exc}", file=sys.stderr)
        return 3
    except (StoreUnavailable, StateUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except (PipelineError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _fit_to_cluster(args: argparse.Namespace, settings: Settings) -> Settings:
    """For a command that talks to Kafka (``set_defaults(kafka=...)``): reach the cluster first,
    so a TLS or login failure is one clear error at once, and fit the settings to it (the
    embedded broker). ``kafka="wait"``: a cluster that does not answer within 30 s is an error;
    ``"check"`` (servers that wait for Kafka themselves): only TLS and login failures are."""
    wanted = getattr(args, "kafka", None)
    if wanted is None:
        return settings
    from pipeline.kafka.cluster import KafkaLoginRefused, KafkaTlsFailed, fit_to_cluster, reach

    try:
        cluster = reach(settings, timeout=30.0 if wanted == "wait" else 5.0)
    except (KafkaTlsFailed, KafkaLoginRefused):
        raise
    except BrokerUnavailable:
        if wanted == "wait":
            raise
        return settings
    return fit_to_cluster(settings, cluster)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
