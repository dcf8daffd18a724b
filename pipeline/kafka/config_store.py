"""The config on Kafka: ``config apply`` and the console write it, every worker follows it.

The compacted topic ``config`` holds one record per entity, keyed ``source:<id>`` or
``destination:<id>``; a tombstone (null value) deletes. ``ConfigFollower`` reads the topic from the
beginning in a background thread, without a consumer group, and keeps following it: a toggle, a new
URL or a new secret reaches every worker on every machine within about a second.

Three writers share the topic: ``config apply`` (a whole file), the web console (``write_config``,
one entity at a time) and the deliver role's auto-disable (``destination_record``). Each record
says who wrote it and when (``changedBy``, ``changedAt``; an ``Origin`` here, not part of the
models, which describe the config itself): ``config apply`` warns before it overwrites a change
the others made since the last apply, which would otherwise be lost without anyone noticing.

"Caught up" means every partition reported end-of-partition once. The high watermark is not used:
the embedded broker's can lag the true end of the log.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Message

from pipeline.core.config import (
    Batch,
    ClientTls,
    ConfigTable,
    Destination,
    OAuth2,
    PipelineConfig,
    PreviousSecret,
    RetryPolicy,
    Source,
    Webhook,
)
from pipeline.core.exceptions import BrokerUnavailable, UndecodableRecord
from pipeline.core.secret_rotation import keyed
from pipeline.core.settings import Settings
from pipeline.core.timestamps import now_ms
from pipeline.kafka.clients import topics_for
from pipeline.kafka.codec import RecordCodec
from pipeline.kafka.errors import Outgoing
from pipeline.kafka.producer import AckedProducer
from pipeline.kafka.registry_codec import make_codec
from pipeline.kafka.topic_reader import TopicFollower

__all__ = [
    "ConfigFollower",
    "Origin",
    "ApplyPlan",
    "APPLY",
    "PIPELINE",
    "apply_config",
    "plan_config",
    "write_plan",
    "write_config",
    "destination_record",
    "entity_key",
    "load_config",
    "load_table",
]

log = logging.getLogger("pipeline.config")

#: ``changedBy`` of the records ``config apply`` writes.
APPLY = "apply"
#: ``changedBy`` of the records the pipeline writes itself (the deliver role's auto-disable).
PIPELINE = "pipeline"


@dataclass(frozen=True, slots=True)
class Origin:
    """Who wrote an entity's current record, and when (epoch milliseconds).

    ``changed_by`` is ``"apply"`` (``config apply``), ``"console:<who>"`` (the web console) or
    ``"pipeline"`` (auto-disable); both are ``None`` for records written before this was kept.

        Origin("console:ab12", 1_795_470_065_000)
    """

    changed_by: str | None
    changed_at: int | None

    @property
    def outside_apply(self) -> bool:
        """Written by someone other than ``config apply``: an apply would overwrite their change."""
        return self.changed_by is not None and self.changed_by != APPLY


_UNKNOWN_ORIGIN = Origin(None, None)


def entity_key(entity: Source | Destination) -> str:
    """The config topic's key of ``entity``: ``source:web``, ``destination:hooks``."""
    return f"{'source' if isinstance(entity, Source) else 'destination'}:{entity.id}"


def _origin(record: Mapping[str, Any]) -> Origin:
    return Origin(record["changedBy"], record["changedAt"])


def _encode_source(source: Source, origin: Origin) -> dict[str, Any]:
    return {
        "id": source.id,
        "name": source.name,
        "writeKeys": list(source.write_keys),
        "blockedEvents": list(source.blocked_events),
        "changedBy": origin.changed_by,
        "changedAt": origin.changed_at,
    }


def _decode_source(record: dict[str, Any]) -> Source:
    return Source(
        id=record["id"],
        name=record["name"],
        write_keys=record["writeKeys"],
        blocked_events=record["blockedEvents"],
    )


def _encode_destination(dest: Destination, origin: Origin) -> dict[str, Any]:
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
        "changedBy": origin.changed_by,
        "changedAt": origin.changed_at,
        "ordering": dest.ordering.value,
        "signing": None if dest.signing is None else dest.signing.value,
        "signingKey": dest.signing_key,
        "mtls": None if dest.mtls is None else dest.mtls.model_dump(),
        "proxy": dest.proxy,
        "traceContext": dest.trace_context,
        "oauth2": None
        if dest.oauth2 is None
        else {
            "tokenUrl": dest.oauth2.token_url,
            "clientId": dest.oauth2.client_id,
            "clientSecret": dest.oauth2.client_secret,
            "scope": dest.oauth2.scope,
        },
        "previousSecrets": [
            {"secret": p.secret, "until": p.until_ms} for p in dest.previous_secrets
        ],
        "batch": None
        if dest.batch is None
        else {
            "maxEvents": dest.batch.max_events,
            "maxBytes": dest.batch.max_bytes,
            "maxWait": dest.batch.max_wait,
        },
    }


def _encode(codec: RecordCodec, entity: Source | Destination, origin: Origin) -> bytes:
    if isinstance(entity, Source):
        return codec.encode("Source", _encode_source(entity, origin))
    return codec.encode("Destination", _encode_destination(entity, origin))


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
        ordering=record["ordering"],
        signing=record["signing"],
        signing_key=record["signingKey"],
        mtls=None if record["mtls"] is None else ClientTls(**record["mtls"]),
        proxy=record["proxy"],
        trace_context=record["traceContext"],
        oauth2=None
        if record["oauth2"] is None
        else OAuth2(
            token_url=record["oauth2"]["tokenUrl"],
            client_id=record["oauth2"]["clientId"],
            client_secret=record["oauth2"]["clientSecret"],
            scope=record["oauth2"]["scope"],
        ),
        previous_secrets=[
            PreviousSecret(secret=p["secret"], until=_utc(p["until"]))
            for p in record["previousSecrets"]
        ],
        batch=None
        if record["batch"] is None
        else Batch(
            max_events=record["batch"]["maxEvents"],
            max_bytes=record["batch"]["maxBytes"],
            max_wait=record["batch"]["maxWait"],
        ),
    )


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


class ConfigFollower:
    """Follows the config topic in a background thread; ``table`` is always the latest snapshot.

    follower = ConfigFollower(settings).start()
    follower.wait_ready(timeout=30)
    follower.table.enabled_destinations("web")
    follower.origin("destination:hooks")  # Origin(changed_by="apply", changed_at=...)
    """

    def __init__(self, settings: Settings, *, codec: RecordCodec | None = None) -> None:
        self._settings = settings
        self._codec = codec or make_codec(settings)
        self._topic = topics_for(settings).config
        self._sources: dict[str, Source] = {}
        self._destinations: dict[str, Destination] = {}
        self._origins: dict[str, Origin] = {}
        # The table and its entities' origins, published as one reference so that a reader in
        # another thread never pairs a table with the origins of another version.
        self._snapshot: tuple[ConfigTable, dict[str, Origin]] = (ConfigTable.build((), ()), {})
        self._follower = TopicFollower(settings, self._topic, self._take, name="config")

    @property
    def table(self) -> ConfigTable:
        return self._snapshot[0]

    @property
    def origins(self) -> Mapping[str, Origin]:
        """Who wrote each entity's current record, by key (``source:web``), as of ``table``."""
        return self._snapshot[1]

    def origin(self, key: str) -> Origin | None:
        """Who wrote the current record of ``key`` (``destination:hooks``), as of ``table``;
        ``None`` if there is no such entity."""
        return self._snapshot[1].get(key)

    def start(self) -> ConfigFollower:
        self._follower.start()
        return self

    def wait_ready(self, timeout: float = 30.0) -> ConfigTable:
        """The table once the whole topic as it was at start has been read (waits, retrying,
        while the broker is unreachable or the topic is not created yet)."""
        self._follower.wait_ready(timeout)
        return self.table

    def stop(self) -> None:
        self._follower.stop()

    def _take(self, records: list[Message]) -> None:
        changed = False
        for message in records:
            changed |= self._apply_record(message.key(), message.value())
        if changed:
            self._rebuild()

    def _apply_record(self, key: bytes | None, value: bytes | None) -> bool:
        text = (key or b"").decode(errors="replace")
        kind, _, ident = text.partition(":")
        if kind not in ("source", "destination"):
            log.error("config record with unknown key %r ignored", key)
            return False
        if value is None:
            self._origins.pop(text, None)
            if kind == "source":
                return self._sources.pop(ident, None) is not None
            return self._destinations.pop(ident, None) is not None
        try:
            if kind == "source":
                record = self._codec.decode("Source", value)
                self._sources[ident] = _decode_source(record)
            else:
                record = self._codec.decode("Destination", value)
                self._destinations[ident] = _decode_destination(record)
        except (UndecodableRecord, ValueError) as exc:
            log.error("config record %r ignored: %s", key, exc)
            return False
        self._origins[text] = _origin(record)
        return True

    def _rebuild(self) -> None:
        table = ConfigTable.build(self._sources.values(), self._destinations.values())
        self._snapshot = (table, dict(self._origins))


def destination_record(
    topic: str, codec: RecordCodec, destination: Destination, *, changed_by: str = PIPELINE
) -> Outgoing:
    """The config topic's record of ``destination``, written by ``changed_by`` now: one change
    the pipeline makes itself (auto-disable), the same record ``config apply`` writes."""
    key = entity_key(destination).encode()
    return (topic, key, _encode(codec, destination, Origin(changed_by, now_ms())))


def load_config(settings: Settings, timeout: float = 30.0) -> tuple[ConfigTable, dict[str, Origin]]:
    """Read the whole config topic once: the table, and who wrote each entity, by key."""
    follower = ConfigFollower(settings).start()
    try:
        follower.wait_ready(timeout)
        return follower._snapshot
    finally:
        follower.stop()


def load_table(settings: Settings, timeout: float = 30.0) -> ConfigTable:
    """Read the whole config topic once and return the table."""
    return load_config(settings, timeout)[0]


@dataclass
class ApplyPlan:
    """What ``apply_config`` changes, by entity key (``source:web``)."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    #: Entities it updates or deletes whose current record someone other than ``config apply``
    #: wrote (the console, auto-disable), with who and when: applying overwrites their change.
    overwrites: dict[str, Origin] = field(default_factory=dict)
    #: The records to write, by key: the entity, or ``None`` to delete it.
    writes: list[tuple[str, Source | Destination | None]] = field(default_factory=list, repr=False)

    @property
    def changes(self) -> int:
        return len(self.created) + len(self.updated) + len(self.deleted)


def _plan(
    current: ConfigTable, origins: Mapping[str, Origin], config: PipelineConfig, *, prune: bool
) -> ApplyPlan:
    plan = ApplyPlan()

    def overwriting(key: str) -> None:
        origin = origins.get(key, _UNKNOWN_ORIGIN)
        if origin.outside_apply:
            plan.overwrites[key] = origin

    desired: dict[str, tuple[Source | Destination, Source | Destination | None]] = {}
    for source in config.sources:
        desired[entity_key(source)] = (source, current.sources.get(source.id))
    for dest in config.destinations:
        live = current.destinations.get(dest.id)
        desired[entity_key(dest)] = (keyed(dest, live), live)
    for key, (new, old) in desired.items():
        if old == new:
            plan.unchanged.append(key)
            continue
        if old is None:
            plan.created.append(key)
        else:
            plan.updated.append(key)
            overwriting(key)
        plan.writes.append((key, new))
    if prune:
        existing: list[Source | Destination] = [*current.sources.values()]
        existing += current.destinations.values()
        for key in map(entity_key, existing):
            if key not in desired:
                plan.deleted.append(key)
                overwriting(key)
                plan.writes.append((key, None))
    return plan


def plan_config(
    settings: Settings, config: PipelineConfig, *, prune: bool = True, timeout: float = 30.0
) -> ApplyPlan:
    """What applying ``config`` would change, against the config topic as it is now; with
    ``prune``, entities the file lacks are deleted. ``plan.overwrites`` names the changes made
    outside ``config apply`` that it would overwrite."""
    current, origins = load_config(settings, timeout)
    return _plan(current, origins, config, prune=prune)


def write_plan(settings: Settings, plan: ApplyPlan, *, timeout: float = 30.0) -> None:
    """Write ``plan``'s changes as ``config apply``'s (``changedBy="apply"``, now).

    Every write is acknowledged by Kafka before this returns; ``BrokerUnavailable`` otherwise.
    """
    _write(settings, plan.writes, Origin(APPLY, now_ms()), timeout=timeout, what="the config")


def apply_config(
    settings: Settings,
    config: PipelineConfig,
    *,
    prune: bool = True,
    dry_run: bool = False,
    timeout: float = 30.0,
) -> ApplyPlan:
    """Make the config topic hold ``config``; with ``prune``, delete entities the file lacks.

    It overwrites whatever the console or auto-disable changed (``plan.overwrites`` says what);
    to ask first, as ``config apply`` does, call ``plan_config`` and then ``write_plan``.
    Every write is acknowledged by Kafka before this returns.
    """
    plan = plan_config(settings, config, prune=prune, timeout=timeout)
    if not dry_run:
        write_plan(settings, plan, timeout=timeout)
    return plan


def write_config(
    settings: Settings,
    entities: Sequence[Source | Destination],
    *,
    changed_by: str,
    timeout: float = 30.0,
) -> None:
    """Write ``entities`` as one change by ``changed_by`` (the console: ``"console:<who>"``),
    stamped with the time, sources first.

    Every record is acknowledged by Kafka before this returns; ``BrokerUnavailable`` otherwise.
    The records are written as given: checking that they still make a valid config with the
    rest (a destination's sources exist, write keys stay unique) is the caller's job.
    ``"apply"`` is refused as ``changed_by``: it would hide this change from ``config apply``'s
    warning about overwriting changes made outside it.
    """
    if not changed_by or changed_by == APPLY:
        raise ValueError(
            f"changed_by: {changed_by!r} cannot be used; name the writer, e.g. 'console:<who>' "
            f"({APPLY!r} is reserved for config apply)"
        )
    writes = [(entity_key(entity), entity) for entity in entities]
    what = ", ".join(key for key, _ in writes)
    _write(settings, writes, Origin(changed_by, now_ms()), timeout=timeout, what=what)


def _write(
    settings: Settings,
    writes: Iterable[tuple[str, Source | Destination | None]],
    origin: Origin,
    *,
    timeout: float,
    what: str,
) -> None:
    """Produce ``writes`` (``None``: a tombstone) stamped with ``origin`` and wait for Kafka's
    acknowledgements; ``BrokerUnavailable`` naming ``what`` if any is missing or refused."""
    codec = make_codec(settings)
    records = [
        (key, None if entity is None else _encode(codec, entity, origin)) for key, entity in writes
    ]
    if not records:
        return
    producer = AckedProducer(settings)
    topic = topics_for(settings).config
    # Sources first, so a worker never sees a destination whose source it does not know yet.
    for key, value in sorted(records, key=lambda kv: not kv[0].startswith("source:")):
        producer.produce(topic, key.encode(), value)
    try:
        producer.flush(timeout)
    except BrokerUnavailable as exc:
        raise BrokerUnavailable(f"{what} was not fully written: {exc}") from None
    if producer.failed:
        raise BrokerUnavailable(
            f"{what} was not fully written: "
            + "; ".join(f"{failure.record[1]!r}: {failure}" for failure in producer.failed)
        )
