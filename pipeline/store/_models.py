"""What the store's queries return, and the one query that takes options (``LogQuery``).

Every result is a frozen value with ``as_json()``: snake_case names that stay stable (the CLI's
``--json`` and the console read them), times as ``2026-11-21T07:04:30.123Z`` (UTC, milliseconds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from pipeline.core.log_entries import JourneyState, LogEntry, LogKind
from pipeline.core.timestamps import format_timestamp

__all__ = [
    "FAILED",
    "LOG_STATES",
    "MAX_LOG_LIMIT",
    "DestinationStats",
    "EventName",
    "HourFigures",
    "Journey",
    "LogQuery",
    "Trace",
    "entry_json",
    "iso",
]

#: ``LogQuery.state``: at least one attempt failed, whatever the state now.
FAILED = "failed"
#: What ``LogQuery.state`` accepts.
LOG_STATES = (*(state.value for state in JourneyState), FAILED)
#: The most rows one ``log`` query returns.
MAX_LOG_LIMIT = 10_000

Json = dict[str, Any]


def iso(ms: int | None) -> str | None:
    """``2026-11-21T07:04:30.123Z`` for epoch milliseconds; ``None`` stays ``None``."""
    return None if ms is None else format_timestamp(ms)


@dataclass(frozen=True, slots=True)
class LogQuery:
    """Which journeys ``LogStore.log`` returns, newest first by last update; every filter given
    must match.

        LogQuery(destination="crm", state="failed", since_ms=now - 3_600_000)
    """

    destination: str | None = None
    source: str | None = None
    user: str | None = None
    """Matches the user id or the anonymous id."""
    call_type: str | None = None
    state: str | None = None
    """A journey state (``routed``, ``delivered``, ``waiting``, ``dead_lettered``, ``dropped``,
    ``suppressed``), or ``failed``: at least one attempt failed, whatever the state now (a call
    delivered on its second attempt is ``failed`` too)."""
    since_ms: int | None = None
    """Last updated at or after (epoch ms)."""
    until_ms: int | None = None
    """Last updated before (epoch ms)."""
    limit: int = 50

    def __post_init__(self) -> None:
        if self.state is not None and self.state not in LOG_STATES:
            raise ValueError(f"state: {self.state!r} is not one of {', '.join(LOG_STATES)}")
        if not 1 <= self.limit <= MAX_LOG_LIMIT:
            raise ValueError(f"limit: must be 1 to {MAX_LOG_LIMIT:,}, got {self.limit}")


@dataclass(frozen=True, slots=True)
class Journey:
    """Where one call stands for one destination (``""``: the call dropped as a whole)."""

    message_id: str
    destination: str
    state: JourneyState
    source: str | None
    call_type: str | None
    user_id: str | None
    anonymous_id: str | None
    event: str | None
    first_seen: int
    last_updated: int
    attempts: int
    failed_attempts: int
    last_status: int | None
    """The HTTP status of the latest attempt, ``None`` if no answer came (or no attempt)."""
    last_error: str | None
    """The failure class of the latest attempt (``server_error``, ``timeout``, ...); ``None`` if
    it succeeded or none was made."""
    reason: str | None
    """``dropped`` and ``dead_lettered``: why."""
    tier: int | None
    """``waiting``: the retry tier."""
    not_before: int | None
    """``waiting``: when the next attempt is due (epoch ms)."""
    replay_id: str | None

    def as_json(self) -> Json:
        return {
            "message_id": self.message_id,
            "destination": self.destination,
            "state": self.state.value,
            "source": self.source,
            "call_type": self.call_type,
            "user_id": self.user_id,
            "anonymous_id": self.anonymous_id,
            "event": self.event,
            "first_seen": iso(self.first_seen),
            "last_updated": iso(self.last_updated),
            "attempts": self.attempts,
            "failed_attempts": self.failed_attempts,
            "last_status": self.last_status,
            "last_error": self.last_error,
            "reason": self.reason,
            "tier": self.tier,
            "not_before": iso(self.not_before),
            "replay_id": self.replay_id,
        }


def entry_json(entry: LogEntry) -> Json:
    """One entry with the fields that are set (an attempt keeps its ``duration_ms`` of 0)."""
    found: Json = {"kind": entry.kind.value, "at": iso(entry.at)}
    if entry.destination:
        found["destination"] = entry.destination
    if entry.destinations:
        found["destinations"] = list(entry.destinations)
    for name in ("reason", "url", "error", "response", "replay_id", "trace_id"):
        if value := getattr(entry, name):
            found[name] = value
    if entry.size:
        found["size"] = entry.size
    if entry.status is not None:
        found["status"] = entry.status
    if entry.kind is LogKind.ATTEMPT or entry.duration_ms:
        found["duration_ms"] = entry.duration_ms
    if entry.tier != -1:
        found["tier"] = entry.tier
    if entry.not_before:
        found["not_before"] = iso(entry.not_before)
    if entry.attempt:
        found["attempt"] = entry.attempt
    if entry.body is not None:
        found["body"] = entry.body
    return found


@dataclass(frozen=True, slots=True)
class Trace:
    """Everything the store knows about one call: who sent it, every entry in time order, and
    where it stands per destination. A call a deletion request removed keeps only its message id
    and ``purged_at``."""

    message_id: str
    source: str | None
    call_type: str | None
    user_id: str | None
    anonymous_id: str | None
    event: str | None
    entries: tuple[LogEntry, ...]
    destinations: tuple[Journey, ...]
    purged_at: int | None = None
    """When a deletion request for the call's user removed it (epoch ms of the request)."""

    @property
    def trace_id(self) -> str | None:
        """The call's trace id (``received``), when it came with a trace context."""
        return next((entry.trace_id for entry in self.entries if entry.trace_id), None)

    def as_json(self) -> Json:
        return {
            "message_id": self.message_id,
            "trace_id": self.trace_id,
            "source": self.source,
            "call_type": self.call_type,
            "user_id": self.user_id,
            "anonymous_id": self.anonymous_id,
            "event": self.event,
            "purged_at": iso(self.purged_at),
            "entries": [entry_json(e) for e in self.entries],
            "destinations": [j.as_json() for j in self.destinations],
        }


@dataclass(frozen=True, slots=True)
class DestinationStats:
    """One destination's figures over a window (``waiting``: now, whatever the window)."""

    destination: str
    attempts: int
    delivered: int
    """``delivered`` entries in the window."""
    failed: int
    """Failed attempts in the window."""
    success_ratio: float | None
    """Successful attempts / attempts; ``None`` without attempts."""
    p50_ms: int | None
    p95_ms: int | None
    """Attempt durations (nearest rank); ``None`` without attempts."""
    last_error: str | None
    last_error_status: int | None
    last_error_at: int | None
    """The latest failed attempt in the window: its failure class, HTTP status and time."""
    waiting: int
    """Calls now in a retry tier."""
    dead_lettered: int
    """Dead letters in the window."""

    def as_json(self) -> Json:
        return {
            "destination": self.destination,
            "attempts": self.attempts,
            "delivered": self.delivered,
            "failed": self.failed,
            "success_ratio": self.success_ratio,
            "p50_ms": self.p50_ms,
            "p95_ms": self.p95_ms,
            "last_error": self.last_error,
            "last_error_status": self.last_error_status,
            "last_error_at": iso(self.last_error_at),
            "waiting": self.waiting,
            "dead_lettered": self.dead_lettered,
        }


class EventName(NamedTuple):
    """A track event name of a source: how many calls carried it, and the latest one's time."""

    name: str
    calls: int
    last_seen: int

    def as_json(self) -> Json:
        return {"name": self.name, "calls": self.calls, "last_seen": iso(self.last_seen)}


class HourFigures(NamedTuple):
    """One destination's figures in one hour (``hour``: its start, epoch ms)."""

    hour: int
    delivered: int
    failed: int
    """Failed attempts."""
    dead_lettered: int
