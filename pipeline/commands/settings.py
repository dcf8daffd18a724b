"""``pipeline settings``: the effective settings, and where each came from, secrets masked.

Every ``PIPELINE_*`` setting with its value and origin (default, the settings file, the
environment, a flag, a Kafka properties file), the librdkafka properties every Kafka client gets
from ``PIPELINE_KAFKA_CONFIG`` and its overrides, and what the cluster changes: on the embedded
broker the roles run without router transactions and with a 6 s session timeout.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from pipeline.commands._args import Subparsers, loaded_settings_from
from pipeline.core.settings import SECRET_FIELDS, Settings, default_log_store_url, env_name

__all__ = ["register", "run", "shown_value"]

#: How long to wait for the cluster to tell what it is (the embedded broker's adaptations).
_PROBE_TIMEOUT = 3.0


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser(
        "settings",
        parents=[common],
        help="the effective settings and where each came from (secrets masked)",
        description="Every PIPELINE_* setting with its value and origin (default, settings "
        "file, environment, flag), the Kafka client properties, and what the cluster changes. "
        "Secrets are masked.",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument(
        "--no-broker", action="store_true", help="do not ask the cluster what it is"
    )
    parser.set_defaults(run=run)


def shown_value(name: str, value: Any) -> str:
    """A setting's value as ``pipeline settings`` prints it: secrets masked, durations and
    lists as they are written in the environment."""
    from pipeline.core.durations import format_duration

    if value is None:
        return "off" if name == "dedupe_window" else ""
    if name in SECRET_FIELDS:
        return "********"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(format_duration(v) if isinstance(v, float) else str(v) for v in value)
    if isinstance(value, float):
        return format_duration(value)
    return str(value)


def run(args: argparse.Namespace, _settings: Settings) -> int:
    loaded = loaded_settings_from(args)
    settings, origins = loaded.settings, dict(loaded.origins)
    cluster_line = ""
    if not args.no_broker:
        cluster_line, settings, origins = _with_cluster(settings, origins)
    rows = [
        (env_name(name), shown_value(name, getattr(settings, name)), origins[name])
        for name in Settings.model_fields
    ]
    # The embedded default of the log store is a path of these settings: show which.
    rows = [
        (n, v or default_log_store_url(settings), o) if n == "PIPELINE_LOG_STORE_URL" else (n, v, o)
        for n, v, o in rows
    ]
    kafka = settings.kafka_client.describe()
    if args.json:
        print(
            orjson.dumps(
                {
                    "settings": [{"name": n, "value": v, "from": o} for n, v, o in rows],
                    "kafka_properties": [{"name": n, "value": v, "from": o} for n, v, o in kafka],
                    "settings_file": loaded.file,
                    "cluster": cluster_line,
                    "notes": list(loaded.notes),
                },
                option=orjson.OPT_INDENT_2,
            ).decode()
        )
        return 0
    width = max(len(n) for n, _, _ in rows) + 2
    value_width = min(42, max(len(v) for _, v, _ in rows))
    print(f"{'setting':<{width}}{'value':<{value_width}}  from")
    for name, value, origin in rows:
        print(f"{name:<{width}}{value:<{value_width}}  {origin}")
    if kafka:
        print("\nKafka client properties (librdkafka):")
        key_width = max(len(k) for k, _, _ in kafka) + 2
        for key, value, origin in kafka:
            print(f"  {key:<{key_width}}{value:<{value_width}}  {origin}")
    for note in loaded.notes:
        print(f"note: {note}", file=sys.stderr)
    if cluster_line:
        print(f"\n{cluster_line}")
    return 0


def _with_cluster(
    settings: Settings, origins: dict[str, str]
) -> tuple[str, Settings, dict[str, str]]:
    """What the cluster is, and the settings fitted to it (the embedded broker's changes)."""
    from pipeline.core.exceptions import BrokerUnavailable
    from pipeline.kafka.cluster import fit_to_cluster, reach

    try:
        cluster = reach(settings, timeout=_PROBE_TIMEOUT)
    except BrokerUnavailable as exc:
        return f"cluster: not reached ({exc})", settings, origins
    fitted = fit_to_cluster(settings, cluster)
    changed = [
        name for name in Settings.model_fields if getattr(fitted, name) != getattr(settings, name)
    ]
    for name in changed:
        origins[name] = "embedded broker"
    kind = "the embedded broker" if cluster.embedded else f"{cluster.brokers} broker(s)"
    return (
        f"cluster: {cluster.cluster_id} at {settings.bootstrap_servers} ({kind})",
        fitted,
        origins,
    )
