"""Which destinations a call goes to. Pure logic.

A call goes to every enabled destination connected to its source, unless the source blocks the
track event (seed §4.3 rule 7) or the call's ``integrations`` map turns the destination off (rule 6).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import orjson

from pipeline.core.calls import Call, CallType
from pipeline.core.config import ConfigTable, Destination
from pipeline.core.integrations import is_enabled

__all__ = ["DropReason", "Route", "route"]


class DropReason(enum.StrEnum):
    """Why the router delivered a call nowhere (a metric label)."""

    BLOCKED_EVENT = "blocked_event"
    """A track event the source's schema blocks."""
    NO_DESTINATION = "no_destination"
    """No enabled destination is connected, or the integrations map turned them all off."""
    UNKNOWN_SOURCE = "unknown_source"
    """The source was deleted from the config after the call was accepted."""


@dataclass(frozen=True, slots=True)
class Route:
    destinations: tuple[Destination, ...] = ()
    dropped: DropReason | None = None


def route(call: Call, table: ConfigTable) -> Route:
    source = table.sources.get(call.source_id)
    if source is None:
        return Route(dropped=DropReason.UNKNOWN_SOURCE)
    if call.type is CallType.TRACK and call.event in source.blocked_events:
        return Route(dropped=DropReason.BLOCKED_EVENT)
    candidates = table.enabled_destinations(call.source_id)
    if call.integrations and call.type is not CallType.DELETE:
        integrations = orjson.loads(call.integrations)
        candidates = tuple(d for d in candidates if is_enabled(integrations, d.name))
    if not candidates:
        return Route(dropped=DropReason.NO_DESTINATION)
    return Route(destinations=candidates)
