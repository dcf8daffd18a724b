"""Which destinations a call goes to, and what the router makes of one record. Pure logic.

A call goes to every enabled destination connected to its source, unless the source blocks the
track event (seed §4.3 rule 7) or the call's ``integrations`` map turns the destination off (rule 6).

``route_record`` is the router's whole decision for one Kafka record of ``calls``: undecodable
(dead letter), dropped (with the reason), or a delivery record per destination (the first one's
``Delivery``: the others differ only in their destination) with its Kafka key
``<destinationId>/<user key>``: one destination's traffic spreads over partitions, one user's calls
to one destination stay in one partition, in order.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import orjson

from pipeline.core.calls import Call, CallType
from pipeline.core.config import ConfigTable, Destination
from pipeline.core.exceptions import UndecodableRecord
from pipeline.core.integrations import is_enabled
from pipeline.core.records import Delivery
from pipeline.core.render import render_body

__all__ = [
    "DropReason",
    "Route",
    "route",
    "Routed",
    "route_record",
    "delivery_key",
    "key_destination",
]


class DropReason(enum.StrEnum):
    """Why the router delivered a call nowhere (a metric label)."""

    BLOCKED_EVENT = "blocked_event"
    """A track event the source's schema blocks."""
    NO_DESTINATION = "no_destination"
    """No enabled destination is connected, or the integrations map turned them all off."""
    UNKNOWN_SOURCE = "unknown_source"
    """The source was deleted from the config after the call was accepted."""
    INTEGRATIONS = "integrations"
    """Per destination: the call's ``integrations`` map turned it off (seed §4.3 rule 6)."""
    DESTINATION_DISABLED = "destination_disabled"
    """Per destination: connected to the source but disabled (its toggle is off)."""
    DUPLICATE = "duplicate"
    """A resend of a call already routed within ``PIPELINE_DEDUPE_WINDOW`` (same source and
    ``messageId``)."""


@dataclass(frozen=True, slots=True)
class Route:
    destinations: tuple[Destination, ...] = ()
    dropped: DropReason | None = None
    #: Destinations connected to the source that the call does not go to, and why (the
    #: delivery log records them; the call-level ``dropped`` is what metrics count).
    excluded: tuple[tuple[str, DropReason], ...] = ()


def route(call: Call, table: ConfigTable) -> Route:
    source = table.sources.get(call.source_id)
    if source is None:
        return Route(dropped=DropReason.UNKNOWN_SOURCE)
    if call.type is CallType.TRACK and call.event in source.blocked_events:
        return Route(dropped=DropReason.BLOCKED_EVENT)
    enabled = table.enabled_destinations(call.source_id)
    disabled = table.disabled_destinations(call.source_id)
    excluded = tuple((d.id, DropReason.DESTINATION_DISABLED) for d in disabled)
    candidates = enabled
    if call.integrations and call.type is not CallType.DELETE:
        integrations = orjson.loads(call.integrations)
        candidates = tuple(d for d in enabled if is_enabled(integrations, d.name))
        if len(candidates) < len(enabled):
            excluded += tuple(
                (d.id, DropReason.INTEGRATIONS) for d in enabled if d not in candidates
            )
    if not candidates:
        return Route(dropped=DropReason.NO_DESTINATION, excluded=excluded)
    return Route(destinations=candidates, excluded=excluded)


class Routed(NamedTuple):
    """The router's decision for one record of ``calls``."""

    call_type: CallType | None = None
    """The call's type (counted as routed); ``None`` when it did not decode."""
    delivery: Delivery | None = None
    """The first destination's record for the deliveries topic. The others' differ only in their
    destination, so only this one is made: the router encodes it and splices the others' values
    from it (``deliveries`` makes them all)."""
    keys: tuple[tuple[bytes, str], ...] = ()
    """(Kafka key, destination id) of each delivery record, the first's included, in order."""
    dropped: DropReason | None = None
    undecodable: str | None = None
    """Why the record is not a call: it goes to the dead-letter topic, raw."""
    call: Call | None = None
    """The call, when it decoded (the delivery log describes it)."""
    excluded: tuple[tuple[str, DropReason], ...] = ()
    """Connected destinations the call does not go to, and why."""

    @property
    def deliveries(self) -> tuple[tuple[bytes, Delivery], ...]:
        """(Kafka key, record) for the deliveries topic, one per destination."""
        first = self.delivery
        if first is None:
            return ()
        return tuple(
            (key, first if name == first.destination_id else first._replace(destination_id=name))
            for key, name in self.keys
        )


def route_record(
    data: bytes | None, decode: Callable[[bytes | None], Call], table: ConfigTable
) -> Routed:
    """What to do with the record ``data``; ``decode`` turns it into a ``Call`` or raises
    ``UndecodableRecord`` (``KeyError``, ``ValueError``: a record that is not a valid call).
    Anything else it raises (the Schema Registry is down) is not the record's fault: it propagates.
    """
    try:
        call = decode(data)
    except (UndecodableRecord, KeyError, ValueError) as exc:
        return Routed(undecodable=str(exc))
    decision = route(call, table)
    if decision.dropped is not None:
        return Routed(call.type, dropped=decision.dropped, call=call, excluded=decision.excluded)
    body = render_body(call)  # once per call: every destination and every retry send these bytes
    destinations = decision.destinations
    user = call.key
    prefixes = _KEY_PREFIXES
    return Routed(
        call.type,
        Delivery.for_call(call, destinations[0].id, body),
        tuple((prefixes[d.id] + user, d.id) for d in destinations),
        call=call,
        excluded=decision.excluded,
    )


class _KeyPrefixes(dict[str, bytes]):
    """``<destinationId>/`` by destination id, the head of its records' keys (a look-up where an
    encode and a concatenation were, once per destination of every call), made on first use and
    bounded like ``avro_writer.STRINGS``: destinations come from the config."""

    def __missing__(self, destination_id: str) -> bytes:
        if len(self) >= 10_000:
            self.clear()
        made = self[destination_id] = destination_id.encode() + b"/"
        return made


_KEY_PREFIXES = _KeyPrefixes()


def delivery_key(destination_id: str, call: Call) -> bytes:
    """The Kafka key of ``call``'s delivery record for a destination (see the module's doc)."""
    return _KEY_PREFIXES[destination_id] + call.key


def key_destination(key: bytes | None) -> str:
    """The destination a ``delivery_key`` names (a destination's id has no "/"); "" for a key
    that names none."""
    if not key:
        return ""
    name, slash, _ = key.partition(b"/")
    return name.decode(errors="replace") if slash else ""
