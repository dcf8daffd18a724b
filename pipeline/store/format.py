"""Text for the CLI (``pipeline trace``, ``log``, ``stats``): pure functions of query results.

Everything that came from outside (user ids, event names, URLs, response snippets) goes through
``safe``: control characters, line and paragraph separators and other invisible code points are
shown escaped (``\\x1b``, ``\\u202e``), so a hostile value cannot move the cursor, recolour the
terminal or forge a line of output. Long values are cut with ``…``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.core.held_users import HeldUsers
from pipeline.core.log_entries import JourneyState, LogEntry, LogKind

from ._models import DestinationStats, Journey, Trace, iso

__all__ = [
    "HELD_UNKNOWN",
    "describe_state",
    "format_held_users",
    "format_log",
    "format_stats",
    "format_trace",
    "trace_link",
    "held_users_json",
    "iso",
    "safe",
]

#: Characters of one outside value on a line (a response snippet is up to 1 KB).
MAX_VALUE = 120


def safe(value: object, limit: int = MAX_VALUE) -> str:
    """``value`` as text that prints as one harmless line, at most ``limit`` characters plus
    ``…``.

    >>> safe("evil\\x1b[2J\\nname")
    'evil\\\\x1b[2J\\\\nname'
    """
    text = "" if value is None else str(value)
    if not text.isprintable():
        text = "".join(
            c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
        )
    return text if len(text) <= limit else text[:limit] + "…"


def _time(ms: int | None) -> str:
    return iso(ms) or "-"


def describe_state(journey: Journey) -> str:
    """``delivered``, ``waiting (tier 1 until T)``, ``dead_lettered (client_error)``, ..."""
    state = journey.state
    if state is JourneyState.WAITING:
        tier = "" if journey.tier is None else f"tier {journey.tier} "
        return f"waiting ({tier}until {_time(journey.not_before)})"
    if state is JourneyState.HELD:
        return f"held behind {safe(journey.reason)}"
    if state in (JourneyState.DEAD_LETTERED, JourneyState.DROPPED) and journey.reason:
        return f"{state.value} ({safe(journey.reason)})"
    return state.value


def _attempt_result(status: int | None, error: str | None) -> str:
    parts = []
    if status is not None:
        parts.append(f"HTTP {status}")
    if error:
        parts.append(safe(error))
    return " ".join(parts) or "no answer"


def _entry_line(entry: LogEntry) -> str:
    kind = entry.kind
    parts = [_time(entry.at), f"{kind.value:<15}", safe(entry.destination) or "-"]
    if kind is LogKind.RECEIVED and entry.size:
        parts.append(f"{entry.size:,} bytes")
    if kind is LogKind.ROUTED:
        parts.append("→ " + (", ".join(safe(d) for d in entry.destinations) or "nowhere"))
    if kind is LogKind.ATTEMPT:
        if entry.attempt:
            parts.append(f"#{entry.attempt}")
        parts.append(_attempt_result(entry.status, entry.error))
        parts.append(f"{entry.duration_ms:,} ms")
        if entry.url:
            parts.append(safe(entry.url))
        if entry.response:
            parts.append(f"response {safe(entry.response, 60)}")
        if entry.reason:  # the batch that carried it
            parts.append(f"in {safe(entry.reason)}")
    if kind is LogKind.DROPPED and entry.error:
        parts.append(safe(entry.error))
    if kind is LogKind.RETRY_SCHEDULED:
        parts.append(f"tier {entry.tier} until {_time(entry.not_before or None)}")
    if kind is LogKind.HELD:
        parts.append(f"held behind {safe(entry.reason)}")
    elif kind is LogKind.RELEASED:
        parts.append(safe(entry.reason, 400))
    elif entry.reason and kind is not LogKind.ATTEMPT:
        parts.append(f"reason {safe(entry.reason)}")
    if entry.replay_id:
        parts.append(f"replay {safe(entry.replay_id)}")
    return "  " + "  ".join(parts)


def format_trace(trace: Trace, trace_url_template: str | None = None) -> str:
    """A call's journey: who sent it, one line per entry, then where it stands per destination;
    its trace id, with its link (``trace_url_template``) if there is one."""
    if trace.purged_at is not None and not trace.entries:
        return (
            f"message {safe(trace.message_id)}: removed by a deletion request for its user "
            f"at {_time(trace.purged_at)}"
        )
    what = safe(trace.call_type or "?")
    if trace.event is not None:
        what += f" '{safe(trace.event)}'"
    who = [f"{what} from {safe(trace.source or '?')}"]
    if trace.user_id is not None:
        who.append(f"user {safe(trace.user_id)}")
    if trace.anonymous_id is not None:
        who.append(f"anonymous {safe(trace.anonymous_id)}")
    lines = [f"message {safe(trace.message_id)}: " + ", ".join(who)]
    if trace.trace_id is not None:
        lines.append(f"trace {safe(trace.trace_id)}")
        if trace_url_template:
            lines[-1] += f"  {trace_link(trace_url_template, trace.trace_id)}"
    lines += [_entry_line(entry) for entry in trace.entries]
    if trace.destinations:
        lines.append("state:")
        width = max(len(safe(j.destination) or "(call)") for j in trace.destinations)
        for journey in trace.destinations:
            line = f"  {safe(journey.destination) or '(call)':<{width}}  {describe_state(journey)}"
            if journey.attempts:
                line += f", {journey.attempts} attempt{'s' if journey.attempts != 1 else ''}"
                if journey.failed_attempts:
                    line += f" ({journey.failed_attempts} failed)"
                line += f", last {_attempt_result(journey.last_status, journey.last_error)}"
            if journey.replay_id:
                line += f", replay {safe(journey.replay_id)}"
            lines.append(line)
    if trace.purged_at is not None:
        lines.append(f"removed by a deletion request at {_time(trace.purged_at)}")
    return "\n".join(lines)


def trace_link(template: str, trace_id: str) -> str:
    """Where trace ``trace_id`` is seen (``PIPELINE_TRACE_URL_TEMPLATE``); a trace id that is not
    32 hex digits (not one a W3C context carries) goes in percent-encoded."""
    from urllib.parse import quote

    return template.replace("{trace_id}", quote(trace_id, safe=""))


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: frozenset[int]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(header), *(line(r) for r in rows)])


def format_log(rows: Sequence[Journey]) -> str:
    """One line per call and destination, newest first (as ``log`` returns them)."""
    if not rows:
        return "no calls match"
    header = (
        "LAST UPDATED",
        "STATE",
        "DESTINATION",
        "TYPE",
        "SOURCE",
        "USER",
        "MESSAGE ID",
        "ATTEMPTS",
        "LAST STATUS",
    )
    cells = [
        (
            _time(j.last_updated),
            j.state.value,
            safe(j.destination, 40) or "(call)",
            safe(j.call_type or "-", 20),
            safe(j.source or "-", 40),
            safe(j.user_id or j.anonymous_id or "-", 40),
            safe(j.message_id, 64),
            str(j.attempts),
            _attempt_result(j.last_status, j.last_error) if j.attempts else "-",
        )
        for j in rows
    ]
    return _table(header, cells, frozenset({7}))


def format_stats(rows: Sequence[DestinationStats]) -> str:
    """One line per destination, problems first (as ``stats`` returns them)."""
    if not rows:
        return "no attempts, dead letters or waiting calls in this window"
    header = (
        "DESTINATION",
        "ATTEMPTS",
        "DELIVERED",
        "FAILED",
        "SUCCESS",
        "P50 MS",
        "P95 MS",
        "WAITING",
        "DEAD",
        "LAST ERROR",
    )

    def number(value: int | None) -> str:
        return "-" if value is None else f"{value:,}"

    cells = [
        (
            safe(s.destination, 40),
            number(s.attempts),
            number(s.delivered),
            number(s.failed),
            "-" if s.success_ratio is None else f"{s.success_ratio:.1%}",
            number(s.p50_ms),
            number(s.p95_ms),
            number(s.waiting),
            number(s.dead_lettered),
            "-"
            if s.last_error_at is None
            else f"{_attempt_result(s.last_error_status, s.last_error)} at {_time(s.last_error_at)}",
        )
        for s in rows
    ]
    return _table(header, cells, frozenset(range(1, 9)))


#: What ``stats`` says of held users when Kafka, where they are kept, does not answer.
HELD_UNKNOWN = "held users: unknown (Kafka unreachable)"


def format_held_users(held: Mapping[str, HeldUsers] | None, now_ms: int) -> list[str]:
    """One line per destination with held users (none: no line); ``held`` ``None``: unknown.

    >>> format_held_users({"hooks": HeldUsers(3, 1_000, "u1", "m-1")}, now_ms=241_000)
    ['hooks: 3 users held (oldest since 1970-01-01T00:00:01Z, 4m ago)']
    """
    if held is None:
        return [HELD_UNKNOWN]
    lines = []
    for destination, users in sorted(held.items()):
        count = "1 user" if users.count == 1 else f"{users.count:,} users"
        lines.append(
            f"{safe(destination, 40)}: {count} held (oldest since {users.since_text(now_ms)})"
        )
    return lines


def held_users_json(held: HeldUsers | None, *, known: bool = True) -> dict[str, Any]:
    """A ``stats`` row's held-users fields: ``held_users`` is ``null`` when unknown."""
    return {
        "held_users": (held.count if held else 0) if known else None,
        "oldest_held_since": iso(held.oldest_since) if held else None,
        "oldest_held_user": held.oldest_user if held else None,
        "oldest_held_behind": held.oldest_blocker if held else None,
    }
