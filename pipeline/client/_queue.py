"""The client's queue as a state machine without I/O: it decides, the drivers wait.

``Client`` (a thread) and ``AsyncClient`` (an asyncio task) drive the same ``DeliveryQueue``.
They hand it the calls and the outcome of every send; it answers what to do next: deliver this
batch now, wait so long, retry after a delay, give up on these calls, stop. It never sleeps, locks
or touches the network, and its clock is injectable, so every branch is tested without threads or
sockets (``tests/unit/client/test_queue.py``). The drivers own the waiting: a lock and a condition
for the thread, events for the task; they call every method here under their lock.

Flush accounting is by sequence: the queue is first in, first out, so "``finished`` ≥ the
``accepted`` count at flush time" means every call queued before ``flush()`` is finished
(delivered, or given up and reported).

    >>> from pipeline.client._messages import build_message, prepare
    >>> now = [0.0]
    >>> queue = DeliveryQueue(ClientOptions.build("wk", flush_at=2), clock=lambda: now[0])
    >>> item = prepare(build_message("track", user_id="u", event="e"), event_time=0)
    >>> queue.put(item), queue.next_batch()
    (<Admission.WAKE: 'wake'>, Wait(seconds=5.0))
    >>> queue.put(item), len(queue.next_batch())
    (<Admission.WAKE: 'wake'>, 2)
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from pipeline.core.deadline import Clock

from . import _metrics as client_metrics
from ._errors import ClientClosed, ClientError, DeliveryError, QueueFull
from ._log import log
from ._messages import Queued
from ._options import ClientOptions

__all__ = [
    "Admission",
    "DeliveryQueue",
    "FlushMark",
    "GiveUp",
    "Retry",
    "Sending",
    "Wait",
    "as_delivery_error",
]


class Admission(enum.Enum):
    """What ``put`` did with a call. A refusal's value is the ``dropped`` metric's reason."""

    QUEUED = "queued"
    """Queued behind others: the worker already has a reason to wake."""
    WAKE = "wake"
    """Queued, and the worker must be woken: the queue was empty, or ``flush_at`` is reached."""
    QUEUE_FULL = "queue_full"
    """Refused: ``max_queue_size`` calls are waiting."""
    CLOSED = "closed"
    """Refused: the client is closed."""


# Module names for the members: ``put`` runs once per call, and a global is the quickest lookup.
_QUEUED = Admission.QUEUED
_WAKE = Admission.WAKE
_QUEUE_FULL = Admission.QUEUE_FULL
_CLOSED = Admission.CLOSED


@dataclass(frozen=True, slots=True)
class Wait:
    """No batch yet: wait ``seconds`` (``None``: until woken), then ask again."""

    seconds: float | None


@dataclass(frozen=True, slots=True)
class Retry:
    """Send the pending calls again after ``delay`` seconds (unless the client is abandoned)."""

    delay: float


@dataclass(frozen=True, slots=True)
class GiveUp:
    """These calls are finished, undelivered: report them to ``on_error`` with ``error``."""

    items: list[Queued]
    error: Exception


class FlushMark(NamedTuple):
    """Where the queue stood when ``flush()`` began."""

    target: int  # the calls accepted by then: flushed once this many are finished
    failed_before: int


class Sending:
    """One batch request on its way: the calls still undelivered, the tries so far, and when
    the current try started."""

    __slots__ = ("pending", "tries", "started")

    def __init__(self, items: Sequence[Queued]) -> None:
        self.pending: Sequence[Queued] = items
        self.tries = 0
        self.started = 0.0


def as_delivery_error(exc: Exception) -> DeliveryError:
    """A transport's failure as a ``DeliveryError``; an unexpected one is retried like a
    network failure (and logged with its traceback: it is a bug somewhere)."""
    if isinstance(exc, DeliveryError):
        return exc
    log.error("sending a batch failed", exc_info=exc)
    return DeliveryError(f"{type(exc).__name__}: {exc}", retryable=True)


class DeliveryQueue:
    """The queue, its timers and counters; see the module docstring.

    Counters: ``sent`` (delivered), ``failed`` (given up), ``dropped`` (refused by ``put``),
    ``batches`` (batch requests delivered whole), ``accepted``/``finished`` (for flushes).
    """

    def __init__(self, options: ClientOptions, *, clock: Clock = time.monotonic) -> None:
        self.options = options
        self.flush_at = options.flush_at
        self._max_size = options.max_queue_size
        self._clock = clock
        self._items: deque[Queued] = deque()
        self.accepted = 0  # calls ever queued
        self.finished = 0  # calls delivered or given up, in queue order
        self.flush_requested = False
        self.closed = False  # put refuses
        self.stopping = False  # deliver what is queued, then stop
        self.abandoned = False  # stop now (close timed out): give up what is left
        self._last_flush = clock()
        self._oldest: float | None = None  # when the queue last became non-empty
        self.sent = 0
        self.failed = 0
        self.dropped = 0
        self.batches = 0

    def __len__(self) -> int:
        return len(self._items)

    # ---- calls in ---------------------------------------------------------------------------

    def put(self, item: Queued) -> Admission:
        """Queue ``item`` unless closed or full (then it is counted in ``dropped``)."""
        items = self._items
        if self.closed or len(items) >= self._max_size:
            refused = _CLOSED if self.closed else _QUEUE_FULL
            self.dropped += 1
            client_metrics.count_dropped(refused.value)
            return refused
        items.append(item)
        self.accepted += 1
        waiting = len(items)
        if waiting == 1:
            self._oldest = self._clock()
            return _WAKE
        return _WAKE if waiting == self.flush_at else _QUEUED

    def refusal(self, admission: Admission) -> ClientError:
        """The error ``on_error`` gets for a call ``put`` refused."""
        if admission is Admission.CLOSED:
            return ClientClosed("the client is closed; the call was dropped")
        return QueueFull(self.options.max_queue_size)

    # ---- batches out --------------------------------------------------------------------------

    def next_batch(self) -> list[Queued] | Wait | None:
        """Everything queued if it is time to send (``flush_at`` calls waiting, a flush asked
        for, closing, or ``flush_after`` seconds since the later of the last flush and the
        oldest call); else how long to wait; ``None``: the worker stops."""
        if self.abandoned:
            return None
        waiting = len(self._items)
        if not waiting:
            self.flush_requested = False
            return None if self.stopping else Wait(None)
        now = self._clock()
        oldest = now if self._oldest is None else self._oldest
        due = max(self._last_flush, oldest) + self.options.flush_after
        if waiting >= self.flush_at or self.flush_requested or self.stopping or now >= due:
            batch = list(self._items)
            self._items.clear()
            self.flush_requested = False
            self._last_flush = now
            self._oldest = None
            return batch
        return Wait(due - now)

    def before_try(self, sending: Sending) -> GiveUp | None:
        """Give up at once if the client was abandoned; else note when this try starts."""
        if self.abandoned:
            return self.give_up(
                sending.pending, ClientClosed("closed before these calls were sent")
            )
        sending.started = self._clock()
        return None

    def delivered(self, sending: Sending) -> None:
        """The transport took every pending call of ``sending``."""
        log.debug(
            "delivered %d calls in %.0f ms",
            len(sending.pending),
            (self._clock() - sending.started) * 1000,
        )
        self._delivered(sending.pending)
        self.batches += 1

    def refused(self, sending: Sending, error: DeliveryError) -> Retry | GiveUp:
        """The transport raised ``error``: count what it delivered (``error.pending`` is the
        rest), then retry the rest after a backoff, or give up on it (not retryable, or
        ``max_retries`` used)."""
        if error.pending is not None:  # delivered in part: only the rest is left
            left = {id(item) for item in error.pending}
            self._delivered([item for item in sending.pending if id(item) not in left])
            sending.pending = list(error.pending)
        tries = sending.tries
        if not error.retryable or tries >= self.options.max_retries:
            log.error(
                "giving up on %d calls after %d tries: %s", len(sending.pending), tries + 1, error
            )
            return self.give_up(sending.pending, error)
        delay = self.options.backoff.delay(tries, error.retry_after)
        sending.tries = tries + 1
        log.debug(
            "retry %d of %d calls in %.2f s: %s", tries + 1, len(sending.pending), delay, error
        )
        return Retry(delay)

    def give_up(self, items: Sequence[Queued], error: Exception) -> GiveUp:
        """Finish ``items`` as failed (counted in ``failed``)."""
        count = len(items)
        self.finished += count
        self.failed += count
        client_metrics.count_failed(count)
        return GiveUp(list(items), error)

    def _delivered(self, items: Sequence[Queued]) -> None:
        self.finished += len(items)
        self.sent += len(items)

    # ---- flush and close ----------------------------------------------------------------------

    def request_flush(self) -> FlushMark:
        """Mark the calls queued so far; the next ``next_batch`` sends at once if any is left."""
        mark = FlushMark(self.accepted, self.failed)
        if self.finished < mark.target:
            self.flush_requested = True
        return mark

    def flushed(self, mark: FlushMark) -> bool:
        """Every call queued before ``mark`` is finished."""
        return self.finished >= mark.target

    def unfinished(self, mark: FlushMark) -> int:
        return max(0, mark.target - self.finished)

    def all_delivered(self, mark: FlushMark) -> bool:
        """No call failed since ``mark`` (with ``flushed``: all of them were delivered)."""
        return self.failed == mark.failed_before

    def stop(self, *, abandon: bool) -> None:
        """Deliver what is queued and stop (``abandon``: stop now, give up what is left)."""
        self.stopping = True
        self.abandoned = abandon

    def drain(self) -> GiveUp | None:
        """Give up on whatever is still queued once the worker has stopped (closing)."""
        if not self._items:
            return None
        leftover = list(self._items)
        self._items.clear()
        return self.give_up(leftover, ClientClosed(f"closed with {len(leftover)} calls queued"))
