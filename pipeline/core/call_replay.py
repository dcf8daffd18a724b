"""Replaying retained calls to one destination (``pipeline replay``). Pure logic.

A replay re-delivers the calls of a time range that ``calls`` still retains to one destination:
a backfill for a destination created after them, or a range again for a receiver that lost data.
Each call is decided as the router decides it *now* (``pipeline.core.routing.route``): the
source must be connected to the destination, the source's ``blocked_events`` and the call's
``integrations`` map apply, and the body is rendered by ``render_body``, byte for byte what live
traffic sent, with the same ``messageId`` (receivers dedupe). The delivery records go to the
deliveries topic, where the deliver workers send them with the destination's live URLs, headers
and secret, retry them, dead-letter them, and suppress them after a deletion request, exactly as
live records; ``replays`` is 1 on them, so the end-to-end latency metric leaves them out.

The range is on the time the pipeline received each call (``receivedAt``), both ends included.

    >>> from pipeline.core.calls import parse_call
    >>> s = ReplaySelection("hooks", since=10, until=20, since_text="10m")
    >>> s.matches(parse_call({"type": "identify", "userId": "u"}, source_id="w", received_at=15))
    True
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pipeline.core.calls import Call, CallType
from pipeline.core.config import ConfigTable, Destination
from pipeline.core.exceptions import InvalidCall
from pipeline.core.records import Delivery, RangeReplay
from pipeline.core.render import render_body
from pipeline.core.routing import DropReason, delivery_key, route

__all__ = [
    "ReplaySelection",
    "Skipped",
    "replay_delivery",
    "default_rate",
    "DEFAULT_RATE",
    "RATE_SHARE",
    "TIMESTAMP_SLACK_MS",
]

#: Calls per second a replay sends when the destination has no ``rate_limit``: a small fraction
#: of what one delivery worker sends on this 2-core machine (about 5,000/s), so live traffic
#: keeps its latency (measured: docs/decisions.md).
DEFAULT_RATE = 200.0
#: The share of a destination's ``rate_limit`` a replay takes by default: live traffic keeps the
#: rest (the deliver workers hold both to the limit together).
RATE_SHARE = 0.5
#: Kafka record timestamps are set by the producer just after ``receivedAt``; the partition is
#: read from this long before ``--since`` and up to this long after ``--until`` (then every call
#: is checked on ``receivedAt``), so a slow produce or a producer retry loses no call at the edges.
TIMESTAMP_SLACK_MS = 60_000


class Skipped(enum.StrEnum):
    """Why a call of the range is not sent to the destination (what live routing would do)."""

    BLOCKED_EVENT = "blocked_event"
    """A track event its source blocks."""
    INTEGRATIONS = "integrations"
    """The call's ``integrations`` map turns the destination off."""
    NOT_CONNECTED = "not_connected"
    """Its source is not connected to the destination (or no longer exists)."""


@dataclass(frozen=True, slots=True)
class ReplaySelection:
    """What to replay: the calls received in ``[since, until]`` (epoch ms) to ``destination``,
    optionally only one source, call type or user. ``since_text``/``until_text`` are the
    arguments as typed (``2h``): a replay started again with the same arguments resumes."""

    destination: str
    since: int
    until: int
    since_text: str
    until_text: str = ""
    source: str | None = None
    call_type: CallType | None = None
    user: str | None = None

    def matches(self, call: Call) -> bool:
        return (
            self.since <= call.received_at <= self.until
            and (self.source is None or call.source_id == self.source)
            and (self.call_type is None or call.type is self.call_type)
            and (self.user is None or call.user_id == self.user)
        )

    def check(self, table: ConfigTable) -> Destination:
        """The destination, once the selection makes sense with ``table``; ``InvalidCall``
        naming the flag otherwise."""
        if self.since > self.until:
            raise InvalidCall("--since", "is after --until: the range is empty")
        destination = table.destinations.get(self.destination)
        if destination is None:
            known = ", ".join(sorted(table.destinations)) or "none"
            raise InvalidCall(
                "--destination", f"no destination has the id {self.destination!r} (known: {known})"
            )
        if not destination.enabled:
            raise InvalidCall(
                "--destination",
                f"destination {self.destination!r} is disabled: enable it first, or its calls "
                "would be dead-lettered",
            )
        if self.source is not None and self.source not in destination.sources:
            connected = ", ".join(destination.sources) or "none"
            raise InvalidCall(
                "--source",
                f"source {self.source!r} is not connected to destination {self.destination!r} "
                f"(connected: {connected})",
            )
        return destination

    def same_arguments(self, replay: RangeReplay) -> bool:
        """Whether ``replay`` was started with these very arguments (then it is resumed)."""
        return (
            replay.destination_id == self.destination
            and replay.source_id == self.source
            and replay.call_type == (None if self.call_type is None else self.call_type.value)
            and replay.user_id == self.user
            and replay.since_text == self.since_text
            and replay.until_text == self.until_text
        )

    def overlaps(self, replay: RangeReplay) -> bool:
        """Whether ``replay`` may have sent some of these calls to this destination already."""
        type_value = None if self.call_type is None else self.call_type.value
        return (
            replay.destination_id == self.destination
            and replay.since <= self.until
            and self.since <= replay.until
            and _compatible(replay.source_id, self.source)
            and _compatible(replay.call_type, type_value)
            and _compatible(replay.user_id, self.user)
        )


def _compatible(a: str | None, b: str | None) -> bool:
    """Two filters some call passes both of."""
    return a is None or b is None or a == b


def replay_delivery(
    call: Call, table: ConfigTable, destination_id: str
) -> tuple[bytes, Delivery] | Skipped:
    """The delivery record (Kafka key, record) of ``call`` for the destination, as the router
    would make it now, or why there is none."""
    decision = route(call, table)
    if any(destination.id == destination_id for destination in decision.destinations):
        delivery = Delivery.for_call(call, destination_id, render_body(call))._replace(replays=1)
        return delivery_key(destination_id, call), delivery
    if decision.dropped is DropReason.BLOCKED_EVENT:
        return Skipped.BLOCKED_EVENT
    if (destination_id, DropReason.INTEGRATIONS) in decision.excluded:
        return Skipped.INTEGRATIONS
    return Skipped.NOT_CONNECTED


def default_rate(destination: Destination) -> float:
    """Calls per second a replay to ``destination`` sends unless ``--rate`` says otherwise."""
    if destination.rate_limit:
        return max(1.0, destination.rate_limit * RATE_SHARE)
    return DEFAULT_RATE
