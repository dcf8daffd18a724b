"""What every command shares: the Kafka flags, server flags, and the settings they make."""

from __future__ import annotations

import argparse
from typing import TypeAlias

from pipeline.core.settings import Settings
from pipeline.core.settings_sources import LoadedSettings, load_settings

__all__ = [
    "Subparsers",
    "common_flags",
    "server_flags",
    "metrics_port_flag",
    "positive",
    "settings_from",
    "loaded_settings_from",
]

#: What ``add_subparsers`` returns (argparse does not name the type publicly).
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def common_flags() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("Kafka")
    group.add_argument(
        "--bootstrap-servers",
        metavar="HOST:PORT",
        help="Kafka bootstrap servers (env PIPELINE_BOOTSTRAP_SERVERS, default 127.0.0.1:9092)",
    )
    group.add_argument(
        "--topic-prefix",
        metavar="PREFIX",
        help="prefix of every topic and consumer group (env PIPELINE_TOPIC_PREFIX, default none)",
    )
    common.add_argument(
        "--settings",
        metavar="FILE",
        help="a settings file of PIPELINE_NAME=value lines (env PIPELINE_SETTINGS_FILE); "
        "the environment and flags override it",
    )
    common.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return common


def server_flags(parser: argparse.ArgumentParser, port: int) -> None:
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default %(default)s)"
    )
    parser.add_argument("--port", type=int, default=port, help="port (default %(default)s)")


def metrics_port_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-port", type=int, default=None, help="serve Prometheus /metrics on this port"
    )


def positive(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def loaded_settings_from(args: argparse.Namespace) -> LoadedSettings:
    """The settings of the environment, the settings file and the flags, with their origins."""
    flags: dict[str, object] = {}
    if getattr(args, "bootstrap_servers", None):
        flags["bootstrap_servers"] = args.bootstrap_servers
    if getattr(args, "topic_prefix", None) is not None:
        flags["topic_prefix"] = args.topic_prefix
    return load_settings(file=getattr(args, "settings", None), flags=flags)


def settings_from(args: argparse.Namespace) -> Settings:
    return loaded_settings_from(args).settings
