"""The config on Kafka: ``config apply`` writes it, every worker follows it.

The compacted topic ``config`` holds one record per entity, keyed ``source:<id>`` or
``destination:<id>``; a tombstone (null value) deletes. ``ConfigFollower`` reads the topic from the
beginning in a background thread, without a consumer group, and keeps following it: a toggle, a new
URL or a new secret reaches every worker on every machine within about a second.

"Caught up" means every partition reported end-of-partition once. The high watermark is not used:
the embedded broker's can lag the true end of the log.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.config import (
    ConfigTable,
    Destination,
    PipelineConfig,
    RetryPolicy,
    Source,
    Webhook,
)
from pipeline.core.exceptions import BrokerUnavailable, UndecodableRecord
from pipeline.core.settings import Settings
from pipeline.kafka.clients import topics_for
from pipeline.kafka.codec import RecordCodec
from pipeline.kafka.errors import Outgoing
from pipeline.kafka.producer import AckedProducer
from pipeline.kafka.registry_codec import make_codec
from pipeline.kafka.topic_reader import TopicReader

__all__ = ["ConfigFollower", "ApplyPlan", "apply_config", "load_table"]

log = logging.getLogger("pipeline.config")


def _encode_source(source: Source) -> dict[str, Any]:
    return {
        "id": source.id,
        "name": source.name,
        "writeKeys": list(source.write_keys),
        "blockedEvents": list(source.blocked_events),
    }


def _decode_source(record: dict[str, Any]) -> Source:
    return Source(
        id=record["id"],
        name=record["name"],
        write_keys=record["writeKeys"],
        blocked_events=record["blockedEvents"],
    )


def _encode_destination(dest: Destination) -> dict[str, Any]:
    retry = dest.retry or RetryPolicy()
    return {
        "id": dest.id,
        "name": dest.name,
        "enabled": dest.enabled,
        "sources": list(dest.sources),
        "sharedSecret": dest.shared_secret,
        "standardWebhooks": dest.standard_webhooks,
        "rateLimit": dest.rate_limit,
        "webhooks": [{"url": w.url, "headers": dict(w.headers)} for w in dest.webhooks],
        "retryDelays": None if retry.delays is None else list(retry.delays),
        "retryDeadline": retry.deadline,
        "maxInFlight": dest.max_in_flight,
        "disableAfter": dest.disable_after,
        "disabledReason": dest.disabled_reason,
        "disabledAt": dest.disabled_at,
    }


def _decode_destination(record: dict[str, Any]) -> Destination:
    return Destination(
        id=record["id"],
        name=record["name"],
        enabled=record["enabled"],
        sources=record["sources"],
        shared_secret=record["sharedSecret"],
        standard_webhooks=record["standardWebhooks"],
        rate_limit=record["rateLimit"],
        webhooks=[Webhook(url=w["url"], headers=w["headers"]) for w in record["webhooks"]],
        retry=RetryPolicy(delays=record["retryDelays"], deadline=record["retryDeadline"]),
        max_in_flight=record["maxInFlight"],
        disable_after=record["disableAfter"],
        disabled_reason=record["disabledReason"],
        disabled_at=record["disabledAt"],
    )


class ConfigFollower:
    """Follows the config topic in a background thread; ``table`` is always the latest snapshot.

    follower = ConfigFollower(settings).start()
    follower.wait_ready(timeout=30)
    follower.table.enabled_destinations("web")
    """

    def __init__(self, settings: Settings, *, codec: RecordCodec | None = None) -> None:
        self._settings = settings
        self._codec = codec or make_codec(settings)
        self._topic = topics_for(settings).config
        self._sources: dict[str, Source] = {}
        self._destinations: dict[str, Destination] = {}
        self._table = ConfigTable.build((), ())
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="config-follower", daemon=True)
        self.version = 0

    @property
    def table(self) -> ConfigTable:
        return self._table

    def start(self) -> ConfigFollower:
        self._thread.start()
        return self

    def wait_ready(self, timeout: float = 30.0) -> ConfigTable:
        if not self._ready.wait(timeout):
            raise BrokerUnavailable(
                f"could not read the config topic {self._topic!r} within {timeout:.0f} s "
                f"(is the broker at {self._settings.bootstrap_servers} up, and were topics created?)"
            )
        return self._table

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        reader = TopicReader(
            self._settings,
            self._topic,
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
                changed = False
                for message in records:
                    changed |= self._apply_record(message.key(), message.value())
                if changed or (not self._ready.is_set() and not pending_eof):
                    self._rebuild()
                if not pending_eof and not self._ready.is_set():
                    self._ready.set()
        except Exception:  # pragma: no cover - logged, and wait_ready reports the stall
            log.exception("config follower stopped")
        finally:
            reader.close()

    def _partitions(self, reader: TopicReader) -> list[int]:
        """The config topic's partitions; waits (retrying) while the broker is unreachable or the
        topic is not created yet."""
        while not self._stop.is_set():
            try:
                return reader.partitions(timeout=5)
            except BrokerUnavailable as exc:
                log.debug("config topic: %s; retrying", exc)
            self._stop.wait(0.5)
        return []

    def _apply_record(self, key: bytes | None, value: bytes | None) -> bool:
        kind, _, ident = (key or b"").decode(errors="replace").partition(":")
        try:
            if kind == "source":
                if value is None:
                    return self._sources.pop(ident, None) is not None
                self._sources[ident] = _decode_source(self._codec.decode("Source", value))
                return True
            if kind == "destination":
                if value is None:
                    return self._destinations.pop(ident, None) is not None
                record = self._codec.decode("Destination", value)
                self._destinations[ident] = _decode_destination(record)
                return True
        except (UndecodableRecord, ValueError) as exc:
            log.error("config record %r ignored: %s", key, exc)
            return False
        log.error("config record with unknown key %r ignored", key)
        return False

    def _rebuild(self) -> None:
        self._table = ConfigTable.build(self._sources.values(), self._destinations.values())
        self.version += 1


def destination_record(topic: str, codec: RecordCodec, destination: Destination) -> Outgoing:
    """The config topic's record of ``destination``: one change written by the pipeline itself
    (auto-disable), the same record ``config apply`` writes."""
    key = f"destination:{destination.id}".encode()
    return (topic, key, codec.encode("Destination", _encode_destination(destination)))


def load_table(settings: Settings, timeout: float = 30.0) -> ConfigTable:
    """Read the whole config topic once and return the table."""
    follower = ConfigFollower(settings).start()
    try:
        return follower.wait_ready(timeout)
    finally:
        follower.stop()


@dataclass
class ApplyPlan:
    """What ``apply_config`` changes, by entity key (``source:web``)."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    @property
    def changes(self) -> int:
        return len(self.created) + len(self.updated) + len(self.deleted)


def _plan(
    current: ConfigTable, config: PipelineConfig, *, prune: bool, codec: RecordCodec
) -> tuple[ApplyPlan, list[tuple[str, bytes | None]]]:
    plan = ApplyPlan()
    writes: list[tuple[str, bytes | None]] = []
    desired: dict[str, tuple[Any, Any]] = {}
    for source in config.sources:
        desired[f"source:{source.id}"] = (source, current.sources.get(source.id))
    for dest in config.destinations:
        desired[f"destination:{dest.id}"] = (dest, current.destinations.get(dest.id))
    for key, (new, old) in desired.items():
        if old == new:
            plan.unchanged.append(key)
            continue
        (plan.updated if old is not None else plan.created).append(key)
        if isinstance(new, Source):
            writes.append((key, codec.encode("Source", _encode_source(new))))
        else:
            writes.append((key, codec.encode("Destination", _encode_destination(new))))
    if prune:
        existing = [f"source:{i}" for i in current.sources] + [
            f"destination:{i}" for i in current.destinations
        ]
        for key in existing:
            if key not in desired:
                plan.deleted.append(key)
                writes.append((key, None))
    return plan, writes


def apply_config(
    settings: Settings,
    config: PipelineConfig,
    *,
    prune: bool = True,
    dry_run: bool = False,
    timeout: float = 30.0,
) -> ApplyPlan:
    """Make the config topic hold ``config``; with ``prune``, delete entities the file lacks.

    Every write is acknowledged by Kafka before this returns.
    """
    codec = make_codec(settings)
    current = load_table(settings, timeout)
    plan, writes = _plan(current, config, prune=prune, codec=codec)
    if dry_run or not writes:
        return plan
    producer = AckedProducer(settings)
    topic = topics_for(settings).config
    # Sources first, so a worker never sees a destination whose source it does not know yet.
    for key, value in sorted(writes, key=lambda kv: not kv[0].startswith("source:")):
        producer.produce(topic, key.encode(), value)
    try:
        producer.flush(timeout)
    except BrokerUnavailable as exc:
        raise BrokerUnavailable(f"the config was not fully written: {exc}") from None
    if producer.failed:
        raise BrokerUnavailable(
            "the config was not fully written: "
            + "; ".join(f"{failure.record[1]!r}: {failure}" for failure in producer.failed)
        )
    return plan
