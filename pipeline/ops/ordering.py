"""The held users of ordered destinations, read from the ordering state's changelog
(``Topics.changelog("ordering")``; its layout: ``pipeline.core.held_users``).

``held_users`` reads the changelog to its end once (``pipeline stats``); ``HeldUsersFollower``
keeps following it (the console), so that a page shows the holds as they are without reading the
topic again.

A deployment whose changelog topic does not exist yet (``pipeline topics create`` not run since
the upgrade) has no held users: its deliver role cannot hold any without it.
"""

from __future__ import annotations

import logging
import threading

from confluent_kafka import Message

from pipeline.core.exceptions import BrokerUnavailable
from pipeline.core.held_users import HeldTally, HeldUsers
from pipeline.core.settings import Settings
from pipeline.core.timestamps import now_ms
from pipeline.kafka.clients import admin_config, topics_for
from pipeline.kafka.topic_reader import TopicFollower, read_topic

__all__ = ["HeldUsers", "HeldUsersFollower", "held_users", "HELD_USERS_TIMEOUT"]

log = logging.getLogger("pipeline.ordering")

#: How long ``held_users`` waits for Kafka to answer (``BrokerUnavailable`` after).
HELD_USERS_TIMEOUT = 5.0

#: librdkafka's own lines about a broker that does not answer: the caller says it in one line.
_QUIET = logging.getLogger("pipeline.rdkafka.held-users")
_QUIET.disabled = True


def held_users(
    settings: Settings, *, timeout: float = HELD_USERS_TIMEOUT, now: int | None = None
) -> dict[str, HeldUsers]:
    """Every destination with held users, by id: the changelog read to its end now.
    ``BrokerUnavailable`` when Kafka does not answer within ``timeout`` seconds."""
    topic = topics_for(settings).changelog("ordering")
    partitions = _partitions(settings, topic, timeout)
    if not partitions:
        log.debug("held users: the topic %s does not exist: none are held", topic)
        return {}
    tally = HeldTally()
    for message in read_topic(settings, topic, partitions=partitions, idle_timeout=timeout):
        tally.take(message.key(), message.value())
    return tally.summary(now_ms() if now is None else now)


def _partitions(settings: Settings, topic: str, timeout: float) -> list[int]:
    """The topic's partitions (none: it does not exist); ``BrokerUnavailable`` when the cluster
    does not answer."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    config = {**admin_config(settings, lambda _error: None), "logger": _QUIET}
    try:
        metadata = AdminClient(config).list_topics(timeout=timeout)
    except KafkaException as exc:
        raise BrokerUnavailable(
            f"no Kafka broker answered at {settings.bootstrap_servers} within {timeout:g} s ({exc})"
        ) from None
    found = metadata.topics.get(topic)
    if found is None or found.error is not None:
        return []
    return sorted(found.partitions)


class HeldUsersFollower:
    """Follows the ordering changelog in a background thread; ``of(destination)`` tells its held
    users now. While the broker is unreachable or the topic not created, it keeps trying and
    ``ready`` stays false.

        follower = HeldUsersFollower(settings).start()
        follower.of("hooks")  # HeldUsers(count=3, ...) or None
    """

    def __init__(self, settings: Settings) -> None:
        self._tally = HeldTally()
        self._lock = threading.Lock()
        self._follower = TopicFollower(
            settings, topics_for(settings).changelog("ordering"), self._take, name="held-users"
        )

    def start(self) -> HeldUsersFollower:
        self._follower.start()
        return self

    def stop(self) -> None:
        self._follower.stop()

    @property
    def ready(self) -> bool:
        """Whether the changelog was read to its end once (before, ``of`` knows too little)."""
        return self._follower.ready

    def of(self, destination: str, now: int | None = None) -> HeldUsers | None:
        """``destination``'s held users (``None``: none)."""
        with self._lock:
            return self._tally.of(destination, now_ms() if now is None else now)

    def _take(self, records: list[Message]) -> None:
        with self._lock:
            for message in records:
                self._tally.take(message.key(), message.value())
