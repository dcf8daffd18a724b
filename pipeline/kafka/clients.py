"""Thin wrappers over confluent-kafka: client configs in one place, topic creation, errors.

Every producer is idempotent with ``acks=all``: a call is acknowledged to its sender only once every
in-sync replica has it, and a retry inside librdkafka never duplicates or reorders it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from pipeline.core.exceptions import BrokerUnavailable
from pipeline.core.settings import Settings
from pipeline.core.topics import Topics

__all__ = [
    "producer_config",
    "consumer_config",
    "admin_config",
    "make_producer",
    "create_topics",
    "topic_specs",
    "topics_for",
]

log = logging.getLogger("pipeline.kafka")
#: librdkafka's own log lines, through Python logging (quiet below WARNING unless --verbose).
rdkafka_log = logging.getLogger("pipeline.rdkafka")


def topics_for(settings: Settings) -> Topics:
    return Topics(settings.topic_prefix, retry_tiers=len(settings.retry_delays))


def _log_error(error: KafkaError) -> None:
    # librdkafka reports transient broker trouble here and keeps retrying by itself.
    log.warning("kafka: %s", error.str())


def producer_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """A producer's librdkafka config: the pipeline's defaults, the user's properties
    (``PIPELINE_KAFKA_CONFIG`` and overrides: security, tuning), then ``overrides``."""
    user = settings.kafka_client
    config: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "batch.num.messages": 10000,
        "queue.buffering.max.messages": 500000,
        "queue.buffering.max.kbytes": 1048576,
        "error_cb": _log_error,
        "logger": rdkafka_log,
        **user.common,
        **user.producer,
    }
    config.update(overrides)
    return config


def consumer_config(settings: Settings, group_id: str, **overrides: Any) -> dict[str, Any]:
    """A consumer's librdkafka config, built as ``producer_config``'s; ``PIPELINE_SESSION_TIMEOUT``
    wins over a ``session.timeout.ms`` of the properties file."""
    user = settings.kafka_client
    config: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        # Never see what a router's transaction has not committed (librdkafka's default too).
        "isolation.level": "read_committed",
        "partition.assignment.strategy": "cooperative-sticky",
        "fetch.queue.backoff.ms": 50,
        "error_cb": _log_error,
        "logger": rdkafka_log,
        **user.common,
        **user.consumer,
    }
    if settings.session_timeout is not None:
        config["session.timeout.ms"] = int(settings.session_timeout * 1000)
        config["heartbeat.interval.ms"] = max(100, int(settings.session_timeout * 1000 / 6))
    config.update(overrides)
    return config


def admin_config(settings: Settings, error_cb: Any = None) -> dict[str, Any]:
    """An admin client's librdkafka config: the cluster, the user's common properties."""
    return {
        "bootstrap.servers": settings.bootstrap_servers,
        "error_cb": error_cb or _log_error,
        "logger": rdkafka_log,
        **settings.kafka_client.common,
    }


def make_producer(settings: Settings, **overrides: Any) -> Producer:
    return Producer(producer_config(settings, **overrides))


def topic_specs(settings: Settings) -> list[NewTopic]:
    """Every topic of the pipeline with its partition count and config."""
    topics = topics_for(settings)
    rf = settings.replication_factor
    specs = [
        NewTopic(
            topics.calls,
            settings.partitions,
            rf,
            # The replay window (``pipeline replay``): what is older is gone.
            config={"retention.ms": str(int(settings.calls_retention * 1000))},
        ),
        NewTopic(topics.config, 1, rf, config={"cleanup.policy": "compact"}),
        NewTopic(topics.deliveries, settings.partitions, rf),
        NewTopic(topics.dlq, 1, rf, config={"retention.ms": str(30 * 86400 * 1000)}),
        NewTopic(topics.dlq_replays, 1, rf, config={"cleanup.policy": "compact"}),
        # Reports count for seconds; an hour of them is plenty to read at start.
        NewTopic(
            topics.pace,
            1,
            rf,
            config={"cleanup.policy": "compact,delete", "retention.ms": str(3600 * 1000)},
        ),
        NewTopic(topics.events, 1, rf, config={"retention.ms": str(30 * 86400 * 1000)}),
        NewTopic(
            topics.log,
            settings.partitions,
            rf,
            config={"retention.ms": str(int(settings.log_retention * 1000))},
        ),
    ]
    specs += [NewTopic(name, settings.retry_partitions, rf) for name in topics.retry]
    compact = {"cleanup.policy": "compact"}
    # A state's changelog: compacted (a key's latest value), and expired by time too.
    specs.append(
        NewTopic(
            topics.changelog("dedupe"),
            settings.partitions,
            rf,
            config={"cleanup.policy": "compact,delete", **_dedupe_changelog_retention(settings)},
        )
    )
    # The held users of ordered destinations: a key is deleted when its hold ends, never by time.
    specs.append(NewTopic(topics.changelog("ordering"), settings.partitions, rf, config=compact))
    specs += [
        NewTopic(topics.deletion_requests, settings.partitions, rf, config=compact),
        NewTopic(topics.audience_state, settings.partitions, rf, config=compact),
        NewTopic(topics.replays, 1, rf, config=compact),
    ]
    return specs


def create_topics(
    settings: Settings, specs: Iterable[NewTopic] | None = None, *, timeout: float = 30.0
) -> dict[str, str]:
    """Create the topics that are missing; returns ``{topic: "created" | "exists"}``.

    Idempotent: a topic that exists is left as it is (its partition count is reported when it
    differs, never changed).
    """
    admin = AdminClient(admin_config(settings, _log_error))
    wanted = list(specs) if specs is not None else topic_specs(settings)
    result: dict[str, str] = {}
    futures = admin.create_topics(wanted, operation_timeout=timeout, request_timeout=timeout)
    for name, future in futures.items():
        try:
            future.result()
            result[name] = "created"
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise BrokerUnavailable(f"could not create topic {name}: {error.str()}") from None
            result[name] = "exists"
    metadata = admin.list_topics(timeout=timeout)
    for spec in wanted:
        have = metadata.topics.get(spec.topic)
        if have is not None and result[spec.topic] == "exists":
            count = len(have.partitions)
            if count != spec.num_partitions:
                result[spec.topic] = (
                    f"exists with {count} partitions (setting: {spec.num_partitions})"
                )
    followed = _followed_configs(settings)
    for spec in wanted:
        if result[spec.topic].startswith("exists") and spec.topic in followed:
            changed = _apply_configs(admin, spec.topic, followed[spec.topic], timeout)
            if changed:
                result[spec.topic] += f" ({changed})"
    return result


def _followed_configs(settings: Settings) -> dict[str, dict[str, str]]:
    """Topic configs that follow a setting, so ``topics create`` applies a changed setting to a
    topic that exists already (``PIPELINE_CALLS_RETENTION``: the replay window;
    ``PIPELINE_LOG_RETENTION``; ``PIPELINE_DEDUPE_WINDOW``). Other configs of an existing topic
    are left as they are: an operator may have tuned them by hand."""
    topics = topics_for(settings)
    return {
        topics.calls: {"retention.ms": str(int(settings.calls_retention * 1000))},
        topics.log: {"retention.ms": str(int(settings.log_retention * 1000))},
        topics.changelog("dedupe"): _dedupe_changelog_retention(settings),
    }


def _dedupe_changelog_retention(settings: Settings) -> dict[str, str]:
    """The dedupe changelog keeps a key past the state's retention (the window and an hour's
    margin, ``roles.dedupe.MARGIN``) by an hour more: restores skip what is past it anyway. (A
    window turned off keeps the default's, for when it is turned on again.)"""
    window = settings.dedupe_window or 24 * 3600.0
    return {"retention.ms": str(int((window + 2 * 3600) * 1000))}


def _apply_configs(admin: AdminClient, topic: str, wanted: dict[str, str], timeout: float) -> str:
    """Set ``wanted`` on ``topic`` where it differs; says what changed ("" when nothing did)."""
    resource = ConfigResource("TOPIC", topic)
    try:
        current = admin.describe_configs([resource], request_timeout=timeout)[resource].result()
        changes = {
            name: value
            for name, value in wanted.items()
            if name not in current or current[name].value != value
        }
        if not changes:
            return ""
        entries = [
            ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
            for name, value in changes.items()
        ]
        altered = ConfigResource("TOPIC", topic, incremental_configs=entries)
        admin.incremental_alter_configs([altered], request_timeout=timeout)[altered].result()
    except KafkaException as exc:
        raise BrokerUnavailable(f"could not set {wanted} on topic {topic}: {exc}") from None
    return ", ".join(
        f"{name} {current[name].value if name in current else 'unset'} -> {value}"
        for name, value in changes.items()
    )
