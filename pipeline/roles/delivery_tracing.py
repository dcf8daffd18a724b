"""The delivery wing's spans (``pipeline.runtime.tracing``): the wait a record had in a retry
tier, from when it was written there to when it is taken up again (a retry's wait, or a park's,
named by its reason in ``WAIT_HEADER``), and the wait of an ordered destination's call behind an
earlier call of its user (``held_wait``); a batching destination's request (``batch_span``). The
attempts' spans are the sender's (``pipeline.http.request_tracing``).

A record's trace context stays as the router made it (its routing span's) through every tier:
the waits and the attempts of a call are all children of its routing span, in the order they
happened."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.runtime import tracing
from pipeline.runtime.tracing import AnySpan, TraceHeaders

__all__ = ["WAIT_HEADER", "RETRY_WAIT", "wait_header", "waited", "held_wait", "batch_span"]

#: The header of a record in a retry tier saying why it waits there: ``retry``, or the reason it
#: was parked (``pipeline.core.admission.ParkReason``).
WAIT_HEADER = "pipeline-wait"
RETRY_WAIT = "retry"


def wait_header(reason: str) -> tuple[str, bytes]:
    return (WAIT_HEADER, reason.encode())


def waited(message: Any, tier: int, destination: str, now: float) -> None:
    """The span of the wait a record from retry tier ``tier`` had, ended ``now``, if its trace
    is recorded here."""
    found = _waiting(message, now)
    if found is None:
        return
    headers, trace, since = found
    reason = next(
        (
            value.decode("ascii", "replace")
            for name, value in headers
            if name == WAIT_HEADER and isinstance(value, bytes) and value
        ),
        RETRY_WAIT,
    )
    attributes = {"pipeline.retry.tier": tier, "pipeline.destination": destination}
    _wait_span(trace, f"wait ({reason})", reason, attributes, since, now)


def held_wait(message: Any, destination: str, blocker: str, now: float) -> None:
    """The span of the wait a call of an ordered destination had behind an earlier call of its
    user (``blocker``), from when it was queued (``message``'s time) to ``now``."""
    found = _waiting(message, now)
    if found is None:
        return
    _, trace, since = found
    attributes = {"pipeline.held_behind": blocker, "pipeline.destination": destination}
    _wait_span(trace, "wait (held user)", "held_user", attributes, since, now)


def _waiting(message: Any, now: float) -> tuple[Any, TraceHeaders, float] | None:
    """A waiting record's headers, trace context and when its wait began (its Kafka time), when
    its trace is recorded here and its time is known."""
    headers = message.headers()
    trace = tracing.trace_headers(headers)
    if not trace or not tracing.recording(trace):
        return None
    _, stamp = message.timestamp()
    if stamp <= 0:
        return None
    return headers, trace, min(stamp / 1000, now)


def _wait_span(
    trace: TraceHeaders,
    name: str,
    reason: str,
    attributes: dict[str, Any],
    since: float,
    now: float,
) -> None:
    """The span of a wait from ``since`` to ``now`` (epoch seconds), a child of ``trace``."""
    span = tracing.child_span(
        name,
        trace,
        attributes={"pipeline.wait.reason": reason, **attributes},
        start_time=since,
    )
    if span is not None:
        span.end(end_time=int(now * 1e9))


#: Calls a batch's span links to at most (the SDK keeps 128 links a span by default).
MAX_LINKS = 128


def batch_span(traces: Sequence[TraceHeaders], label: str, destination: str) -> AnySpan | None:
    """The span of a batch's request (a trace of its own, linked to the calls' traces it carries;
    ``label``: ``batch_label``), and in each recorded call's trace a step linked to it, so each
    trace shows which batch took the call. ``None`` when no call's trace is recorded here (the
    request then carries no trace context: it would name one call of many)."""
    recorded = [trace for trace in traces if trace and tracing.recording(trace)]
    if not recorded:
        return None
    attributes = {"pipeline.destination": destination, "pipeline.batch": label}
    span = tracing.start_span(
        f"send {label}", None, attributes=attributes, links=recorded[:MAX_LINKS]
    )
    sent = tracing.headers_of(span)
    for trace in recorded:
        tracing.step(trace, f"sent in {label}", attributes, links=[sent])
    return span
