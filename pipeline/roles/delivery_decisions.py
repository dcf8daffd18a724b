"""The delivery handler's decisions: what it makes of a consumed record (``Decision``, one per
record), what an attempt concludes (``Concluded``), and what it asks of the live config and the
webhook sender."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import NamedTuple, Protocol, TypeVar

from pipeline.core.config import ConfigTable, Destination
from pipeline.core.outcomes import Failure, UrlResult
from pipeline.core.records import Delivery
from pipeline.kafka.consumer_loop import ConsumedRecord
from pipeline.kafka.errors import Produced
from pipeline.kafka.log_batches import LogRecordValue
from pipeline.runtime.tracing import TraceHeaders

__all__ = [
    "Logged",
    "LiveConfig",
    "Sender",
    "Skip",
    "Defer",
    "Hold",
    "Retake",
    "Retakes",
    "Split",
    "HandOff",
    "InLane",
    "Start",
    "Decision",
    "Concluded",
    "all_refused",
    "due_groups",
]

_T = TypeVar("_T")

#: What a record's hand-off logs (``None``: nothing, the log is off).
Logged = LogRecordValue | None


class LiveConfig(Protocol):
    """The live config (``ConfigFollower``): its table as it is now."""

    @property
    def table(self) -> ConfigTable: ...


class Sender(Protocol):
    """What the handler asks of the webhook sender: one attempt."""

    async def attempt(
        self,
        destination: Destination,
        body: bytes,
        message_id: str = "",
        *,
        final: bool = False,
        turn: float | None = None,
        trace: TraceHeaders = (),
        resends: int = 0,
    ) -> list[UrlResult]: ...


# ---- the decisions -------------------------------------------------------------------------------


class Skip(NamedTuple):
    """Behind a record of its partition that was deferred: it comes again after the pause."""


class Defer(NamedTuple):
    """Pause its partition until ``until`` (epoch seconds), from this record on."""

    until: float


class Hold(NamedTuple):
    """Due at ``at`` (within ``HOLD_SECONDS``): held here, decoded, until then."""

    at: float
    record: Delivery


class Retake(NamedTuple):
    """A parked batch due at ``at`` (within ``HOLD_SECONDS``): held here as it is, undecoded,
    and decided again then (``size``: its bytes, within ``Retakes``'s limit). Not paused:
    librdkafka fetched a resumed partition up to a second late where the consumer had nothing
    else to fetch."""

    at: float
    size: int


#: The bytes of parked batches held here at most until they are due (``Retake``); past it a batch
#: pauses its partition until then (``Defer``). A backlog waiting for its turns under a rate limit
#: goes round a retry tier in batches of up to 256 KB: the in-flight limit alone would let 1,000
#: of them (250 MB) wait in memory.
RETAKE_BYTES = 32 * 1024 * 1024


class Retakes:
    """The parked batches held until due, in bytes, within ``limit``."""

    def __init__(self, limit: int = RETAKE_BYTES) -> None:
        self.limit = limit
        self.held = 0

    def decide(self, value: bytes | None, due: float) -> Retake | Defer:
        """Hold a parked batch of ``value`` due at ``due``, or, past the limit, pause."""
        size = len(value or b"")
        if self.held + size > self.limit:
            return Defer(due)
        self.held += size
        return Retake(due, size)

    def released(self, size: int) -> None:
        self.held -= size


class Split(NamedTuple):
    """A parked batch come due: the records it carries, each to be decided in turn."""

    parts: list[ConsumedRecord]


class HandOff(NamedTuple):
    """Decided without a request: produce ``out`` (nothing for a suppressed record), log
    ``logged``, then finish it; ``waits``: it is parked (in a retry tier)."""

    out: list[Produced]
    logged: Logged = None
    waits: bool = False


class InLane(NamedTuple):
    """An ordered destination's call, or a release: it goes through its user's lane."""


class Start(NamedTuple):
    """Attempt ``record`` (stamped) at ``destination`` at ``turn`` (monotonic seconds: its turn
    under the destination's pace, taken when it was admitted; ``None`` for a batching
    destination's call: its batch takes one turn when it goes)."""

    record: Delivery
    destination: Destination
    final: bool
    turn: float | None


Decision = Skip | Defer | Hold | Retake | Split | HandOff | Start | InLane


class Concluded(NamedTuple):
    """A decided call: what to produce, what to log, and whether it waits in a retry tier (for
    an ordered destination, it then holds its user's later calls back)."""

    out: list[Produced]
    logged: Logged
    waits: bool


async def due_groups(
    items: list[_T], due: Callable[[_T], float]
) -> AsyncIterator[tuple[float, list[_T]]]:
    """``items`` (held records) in groups, each at its ``due`` time (epoch seconds), never
    before, whatever the timer: the time, and all those due by then, in order of due time
    (stable: a partition's records keep their order)."""
    items = sorted(items, key=due)
    start = 0
    while start < len(items):
        while (wait := due(items[start]) - time.time()) > 0:
            await asyncio.sleep(wait)
        now, end = time.time(), start + 1
        while end < len(items) and due(items[end]) <= now:
            end += 1
        yield now, items[start:end]
        start = end


def all_refused(results: Sequence[UrlResult]) -> bool:
    """No request was made: every webhook's circuit refused it, it fell silent, or the
    destination was paused while the request waited for its turn."""
    for result in results:  # a loop, not all() over a generator: asked of every attempt
        if result.failure is not Failure.CIRCUIT_OPEN:
            return False
    return True
