"""Folding log records into rows: the entries to insert and each journey's state. Pure.

The store reads the journeys a batch touches, folds the batch's records into them here, and
writes them back, so the rules live in one place whatever the database:

- state follows the entry with the latest ``at``; on a tie the later entry (in its record, then
  in the batch and across batches) wins. Each entry that sets a state also sets what goes with
  it: ``reason`` (dropped, dead_lettered), ``tier`` and ``not_before`` (waiting), or clears them;
- attempts and failed attempts add up; last status and error follow the latest attempt;
- identity (source, call type, user id, anonymous id, event) is filled in where missing, never
  blanked; first seen is the earliest entry, last updated the latest.

So records of one call may arrive in any order and still leave the same state (except for the
tie rule). Text from outside is stored as given, except NUL and unpaired surrogates, which no
database stores as text: they become U+FFFD and ``?`` (``clean``, applied to queries too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from pipeline.core.durations import HOUR_MS
from pipeline.core.log_entries import JourneyState, LogEntry, LogKind, LogRecord, state_after

__all__ = [
    "Batch",
    "JourneyRow",
    "attempt_ok",
    "clean",
    "entry_detail",
    "first_at",
]

Key = tuple[int, str]
EntryRow = tuple[Any, ...]
#: source, call type, user id, anonymous id, event
Identity = tuple[str, str, str | None, str | None, str | None]

_ROUTED = LogKind.ROUTED
_RECEIVED = LogKind.RECEIVED
_ATTEMPT = LogKind.ATTEMPT
_REPLAYED = LogKind.REPLAYED
_WAITING = JourneyState.WAITING
_DROPPED = JourneyState.DROPPED
#: The reason of a resend dropped by the router (``DropReason.DUPLICATE``).
_DUPLICATE = "duplicate"
#: Kinds whose state keeps the entry's reason.
_WITH_REASON = frozenset({JourneyState.DROPPED, JourneyState.DEAD_LETTERED, JourneyState.HELD})
_STATES = {kind: state_after(kind) for kind in LogKind}
_KIND_TEXT = {kind: kind.value for kind in LogKind}  # an enum's .value is a slow descriptor
_STATE_TEXT = {state: state.value for state in JourneyState}
_ROUTED_STATE = JourneyState.ROUTED.value


def clean(text: str) -> str:
    """``text`` as every database stores it: NUL → U+FFFD, an unpaired surrogate → ``?``."""
    if text.isascii():
        return text.replace("\x00", "\ufffd") if "\x00" in text else text
    return text.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")


def _opt(text: str | None) -> str | None:
    """``clean(text)``, with ``""`` and ``None`` as ``None`` (an unset field)."""
    return clean(text) if text else None


def _same(text: str) -> str:
    return text


def _or_none(text: str | None) -> str | None:
    return text or None


def _plain(record: LogRecord) -> bool:
    """Whether none of the record's text needs ``clean`` (nearly always: one check, not 20)."""
    parts = [record.message_id, record.source, record.call_type]
    parts += [record.user_id or "", record.anonymous_id or "", record.event or ""]
    for e in record.entries:
        parts += (e.destination, e.reason, e.url, e.error, e.response, e.replay_id, e.body or "")
        parts.append(e.trace_id)
        parts += e.destinations
    text = "".join(parts)
    return text.isascii() and "\x00" not in text


def attempt_ok(entry: LogEntry) -> bool:
    """Whether an attempt succeeded: a 2xx and no failure class (as ``UrlResult.ok``)."""
    return not entry.error and entry.status is not None and 200 <= entry.status < 300


def first_at(record: LogRecord) -> int:
    """The time of a record's earliest entry."""
    return min([e.at for e in record.entries])


def entry_detail(entry: LogEntry, clean: Callable[[str], str] = clean) -> str | None:
    """The entry's set fields that are not columns of ``entries``, as JSON (``None``: none)."""
    detail: dict[str, Any] = {}
    if entry.destinations:
        detail["destinations"] = [clean(d) for d in entry.destinations]
    if entry.reason:
        detail["reason"] = clean(entry.reason)
    if entry.size:
        detail["size"] = entry.size
    if entry.url:
        detail["url"] = clean(entry.url)
    if entry.tier != -1:
        detail["tier"] = entry.tier
    if entry.not_before:
        detail["not_before"] = entry.not_before
    if entry.attempt:
        detail["attempt"] = entry.attempt
    if entry.response:
        detail["response"] = clean(entry.response)
    if entry.replay_id:
        detail["replay_id"] = clean(entry.replay_id)
    if entry.body is not None:
        detail["body"] = clean(entry.body)
    if entry.trace_id:
        detail["trace_id"] = clean(entry.trace_id)
    return orjson.dumps(detail).decode() if detail else None


@dataclass(slots=True)
class JourneyRow:
    """One journey while it is folded; fields in the order of ``JOURNEY_COLUMNS``."""

    call_id: int
    destination: str
    message_id: str
    state: str
    state_at: int
    """The time of the entry that set ``state``; -1 before any did (an attempt came first)."""
    source: str | None
    call_type: str | None
    user_id: str | None
    anonymous_id: str | None
    event: str | None
    first_seen: int
    last_updated: int
    attempts: int = 0
    failed_attempts: int = 0
    last_status: int | None = None
    last_error: str | None = None
    last_attempt_at: int | None = None
    reason: str | None = None
    tier: int | None = None
    not_before: int | None = None
    replay_id: str | None = None

    def params(self) -> tuple[Any, ...]:
        return (
            self.call_id,
            self.destination,
            self.message_id,
            self.state,
            self.state_at,
            self.source,
            self.call_type,
            self.user_id,
            self.anonymous_id,
            self.event,
            self.first_seen,
            self.last_updated,
            self.attempts,
            self.failed_attempts,
            self.last_status,
            self.last_error,
            self.last_attempt_at,
            self.reason,
            self.tier,
            self.not_before,
            self.replay_id,
        )


class Batch:
    """What one ``write`` adds: entry rows, the journeys it touched (folded into the stored ones
    given), track event counts per hour, and the deletion requests among its records.

    ``call_ids``: the call id of every message id (``clean``) the batch's records carry."""

    __slots__ = (
        "call_ids",
        "entries",
        "journeys",
        "new",
        "touched",
        "identified",
        "event_names",
        "purges",
    )

    def __init__(self, call_ids: dict[str, int], stored: dict[Key, JourneyRow]) -> None:
        self.call_ids = call_ids
        self.entries: list[EntryRow] = []
        self.journeys = stored
        self.new: set[Key] = set()
        """Journeys not in the database before this batch."""
        self.touched: set[Key] = set()
        self.identified: set[Key] = set()
        """Stored journeys whose identity this batch filled in (the rest keep theirs as is)."""
        self.event_names: dict[tuple[str, str, int], list[int]] = {}
        """(source, event, hour) → [calls, last seen]."""
        self.purges: list[tuple[str, int]] = []
        """(user id, time of the request)."""

    def add(self, record: LogRecord) -> None:
        """Fold one record (``record.entries`` non-empty) into the batch."""
        if _plain(record):
            text, optional = _same, _or_none
        else:
            text, optional = clean, _opt
        message_id = text(record.message_id)
        call_id = self.call_ids[message_id]
        identity = (
            text(record.source),
            text(record.call_type),
            optional(record.user_id),
            optional(record.anonymous_id),
            optional(record.event),
        )
        first = first_at(record)
        folded: dict[str, JourneyRow] = {}  # destination → its row, identity merged once
        append = self.entries.append
        for entry in record.entries:
            kind = entry.kind
            if kind is _ATTEMPT:
                ok: int | None = int(attempt_ok(entry))
                duration: int | None = entry.duration_ms
            else:
                ok = None
                duration = entry.duration_ms or None
            append(
                (
                    call_id,
                    entry.at,
                    _KIND_TEXT[kind],
                    optional(entry.destination),
                    entry.status,
                    optional(entry.error),
                    ok,
                    duration,
                    entry_detail(entry, text),
                )
            )
            if kind is _RECEIVED:
                self._received(identity, entry)
                continue
            if kind is _ROUTED:
                targets: tuple[str, ...] = entry.destinations or (
                    (entry.destination,) if entry.destination else ()
                )
            else:
                targets = (entry.destination,)
            for destination in targets:
                row = folded.get(destination)
                if row is None:
                    row = folded[destination] = self._journey(
                        call_id, message_id, text(destination), identity, first
                    )
                _apply(row, entry, ok, optional)

    def _received(self, identity: Identity, entry: LogEntry) -> None:
        source, call_type, user_id, _anonymous_id, event = identity
        if call_type == "track" and event is not None:
            key = (source, event, entry.at - entry.at % HOUR_MS)
            counted = self.event_names.get(key)
            if counted is None:
                self.event_names[key] = [1, entry.at]
            else:
                counted[0] += 1
                counted[1] = max(counted[1], entry.at)
        elif call_type == "delete" and user_id is not None:
            self.purges.append((user_id, entry.at))

    def _journey(
        self,
        call_id: int,
        message_id: str,
        destination: str,
        identity: Identity,
        first: int,
    ) -> JourneyRow:
        key = (call_id, destination)
        self.touched.add(key)
        row = self.journeys.get(key)
        if row is None:
            row = JourneyRow(
                call_id,
                destination,
                message_id,
                _ROUTED_STATE,
                -1,
                *identity,
                first,
                first,
            )
            self.journeys[key] = row
            self.new.add(key)
            return row
        source, call_type, user_id, anonymous_id, event = identity
        if (
            (source and not row.source)
            or (call_type and not row.call_type)
            or (user_id and not row.user_id)
            or (anonymous_id and not row.anonymous_id)
            or (event and not row.event)
        ):
            row.source = row.source or source
            row.call_type = row.call_type or call_type
            row.user_id = row.user_id or user_id
            row.anonymous_id = row.anonymous_id or anonymous_id
            row.event = row.event or event
            self.identified.add(key)
        if first < row.first_seen:
            row.first_seen = first
        return row


def _apply(
    row: JourneyRow, entry: LogEntry, ok: int | None, optional: Callable[[str], str | None]
) -> None:
    """One entry's effect on one journey."""
    at = entry.at
    if at > row.last_updated:
        row.last_updated = at
    state = _STATES[entry.kind]
    if state is _DROPPED and entry.reason == _DUPLICATE:
        state = None  # a resend dropped: the call stands where its first copy left it
    if state is not None and at >= row.state_at:
        row.state = _STATE_TEXT[state]
        row.state_at = at
        row.reason = optional(entry.reason) if state in _WITH_REASON else None
        if state is _WAITING:
            row.tier = None if entry.tier == -1 else entry.tier
            row.not_before = entry.not_before or None
        else:
            row.tier = row.not_before = None
    if ok is not None:
        row.attempts += 1
        if not ok:
            row.failed_attempts += 1
        if row.last_attempt_at is None or at >= row.last_attempt_at:
            row.last_attempt_at = at
            row.last_status = entry.status
            row.last_error = optional(entry.error)
    if entry.kind is _REPLAYED and entry.replay_id:
        row.replay_id = optional(entry.replay_id)
