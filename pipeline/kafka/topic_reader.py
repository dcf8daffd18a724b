"""Reading topics without a consumer group: once to the end, or following for ever.

Three readers in the pipeline share this: ``dlq list`` reads the dead-letter topic to its end,
deletion requests and audience syncs read one pinned partition of a state topic to its end, and
``ConfigFollower`` reads the config topic to its end once (then it is ready) and keeps following.

"The end" is each partition's end-of-partition event, not the high watermark: the embedded broker's
watermark can lag the true end of the log. A read that sees neither a record nor an end for
``idle_timeout`` seconds means the broker is gone, and says so.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from pipeline.core.deadline import Deadline
from pipeline.core.exceptions import BrokerUnavailable
from pipeline.core.settings import Settings
from pipeline.kafka.clients import consumer_config

__all__ = ["TopicFollower", "TopicReader", "read_topic", "READ_IDLE_TIMEOUT"]

log = logging.getLogger("pipeline.kafka")

#: A read with no record and no end-of-partition for this long means the broker is gone.
READ_IDLE_TIMEOUT = 30.0

#: One-shot reads answer fast at the end instead of waiting for data that will not come.
_READ_TO_END = {"fetch.queue.backoff.ms": 10, "fetch.wait.max.ms": 10}


class TopicReader:
    """Partitions of one topic, read from the beginning; ``poll`` returns records and tells which
    partitions reached their end.

        reader = TopicReader(settings, topic)
        reader.assign(reader.partitions())
        records, ended = reader.poll(0.2)
    """

    def __init__(self, settings: Settings, topic: str, **overrides: Any) -> None:
        self.topic = topic
        self._settings = settings
        self._consumer = Consumer(
            consumer_config(
                settings,
                # Required by librdkafka; never joined (partitions are assigned, nothing committed).
                f"{settings.topic_prefix}pipeline-reader-{uuid.uuid4().hex[:8]}",
                **{"enable.partition.eof": True, **overrides},
            )
        )

    def partitions(self, timeout: float = 10.0) -> list[int]:
        """The topic's partitions; ``BrokerUnavailable`` when the broker does not answer or the
        topic does not exist."""
        try:
            metadata = self._consumer.list_topics(self.topic, timeout=timeout)
        except KafkaException as exc:
            raise BrokerUnavailable(
                f"could not read the metadata of topic {self.topic!r}: {exc}"
            ) from None
        found = metadata.topics.get(self.topic)
        if found is None or found.error is not None or not found.partitions:
            raise BrokerUnavailable(
                f"topic {self.topic!r} does not exist at {self._settings.bootstrap_servers}; "
                "run `pipeline topics create`"
            )
        return sorted(found.partitions)

    def assign(self, partitions: Iterable[int]) -> None:
        self._consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in partitions])

    def assign_at(self, offsets: Mapping[int, int]) -> None:
        """Read each partition from the offset given (partition → offset)."""
        self._consumer.assign([TopicPartition(self.topic, p, o) for p, o in offsets.items()])

    def release(self, partitions: Iterable[int]) -> None:
        """Stop reading ``partitions`` (the others go on)."""
        self._consumer.incremental_unassign([TopicPartition(self.topic, p) for p in partitions])

    def offsets_for_time(
        self, partitions: Iterable[int], ms: int, timeout: float = 10.0
    ) -> dict[int, int]:
        """Per partition, the first offset whose record's timestamp is at or after ``ms`` (epoch
        ms), or -1 when none is (Kafka's ListOffsets by time). A broker may answer less
        precisely (the embedded one answers the log start): callers still check timestamps."""
        wanted = [TopicPartition(self.topic, p, ms) for p in partitions]
        try:
            found = self._consumer.offsets_for_times(wanted, timeout=timeout)
        except KafkaException as exc:
            raise BrokerUnavailable(
                f"could not look up offsets by time in topic {self.topic!r}: {exc}"
            ) from None
        return {tp.partition: tp.offset for tp in found}

    def end_offset(self, partition: int, timeout: float = 10.0) -> int:
        """The partition's high watermark (on the embedded broker it can lag the log's end)."""
        try:
            _low, high = self._consumer.get_watermark_offsets(
                TopicPartition(self.topic, partition), timeout=timeout
            )
        except KafkaException as exc:
            raise BrokerUnavailable(
                f"could not read the end of {self.topic!r}[{partition}]: {exc}"
            ) from None
        return int(high)

    def poll(self, timeout: float, max_records: int = 10_000) -> tuple[list[Message], set[int]]:
        """Records fetched within ``timeout`` (``consume`` waits all of it unless the batch
        fills: keep it short), and the partitions that reported their end meanwhile."""
        records: list[Message] = []
        ended: set[int] = set()
        for message in self._consumer.consume(max_records, timeout):
            error = message.error()
            if error is None:
                records.append(message)
            elif error.code() == KafkaError._PARTITION_EOF:
                partition = message.partition()
                assert partition is not None
                ended.add(partition)
            elif error.fatal():
                raise BrokerUnavailable(f"reading {self.topic!r}: {error.str()}")
            else:  # librdkafka retries transient trouble by itself
                log.warning("reading %s: %s", self.topic, error.str())
        return records, ended

    def close(self) -> None:
        self._consumer.close()


def read_topic(
    settings: Settings,
    topic: str,
    *,
    partitions: Iterable[int] | None = None,
    idle_timeout: float = READ_IDLE_TIMEOUT,
) -> Iterator[Message]:
    """Every record of ``topic`` (or of ``partitions``) present now, partition by partition in
    offset order; ``BrokerUnavailable`` when the read stalls for ``idle_timeout`` seconds."""
    reader = TopicReader(settings, topic, **_READ_TO_END)
    try:
        pending = set(reader.partitions() if partitions is None else partitions)
        reader.assign(pending)
        stalled = Deadline.after(idle_timeout)
        while pending:
            records, ended = reader.poll(0.02)
            yield from records
            pending -= ended
            if records or ended:
                stalled.renew(idle_timeout)
            elif stalled.expired():
                raise BrokerUnavailable(
                    f"reading {topic!r} stalled: no record and no end of partition "
                    f"within {idle_timeout:.0f} s"
                )
    finally:
        reader.close()


class TopicFollower:
    """Reads ``topic`` from the beginning in a background thread, and keeps following it.

    ``on_records`` gets each fetched batch (in the follower's thread); ``wait_ready`` returns once
    every partition reported its end at least once (the state of the topic at start is read).
    While the broker is unreachable or the topic not created yet, it keeps trying.

        follower = TopicFollower(settings, topic, on_records, name="events").start()
        follower.wait_ready(timeout=30)
    """

    def __init__(
        self,
        settings: Settings,
        topic: str,
        on_records: Callable[[list[Message]], None],
        *,
        name: str,
    ) -> None:
        self.topic = topic
        self._settings = settings
        self._on_records = on_records
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{name}-follower", daemon=True)

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def start(self) -> TopicFollower:
        self._thread.start()
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        if not self._ready.wait(timeout):
            raise BrokerUnavailable(
                f"could not read the topic {self.topic!r} within {timeout:.0f} s "
                f"(is the broker at {self._settings.bootstrap_servers} up, and were topics created?)"
            )

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        reader = TopicReader(
            self._settings,
            self.topic,
            # End-of-partition is reported after an empty fetch: answer those quickly.
            **{"topic.metadata.refresh.interval.ms": 5000, "fetch.wait.max.ms": 100},
        )
        try:
            partitions = self._partitions(reader)
            reader.assign(partitions)
            pending_eof = set(partitions)
            while not self._stop.is_set():
                records, ended = reader.poll(0.2, max_records=500)
                pending_eof -= ended
                if records:
                    self._on_records(records)
                if not pending_eof and not self._ready.is_set():
                    self._ready.set()
        except Exception:  # pragma: no cover - logged, and wait_ready reports the stall
            log.exception("following %s stopped", self.topic)
        finally:
            reader.close()

    def _partitions(self, reader: TopicReader) -> list[int]:
        while not self._stop.is_set():
            try:
                return reader.partitions(timeout=5)
            except BrokerUnavailable as exc:
                log.debug("%s; retrying", exc)
            self._stop.wait(0.5)
        return []
