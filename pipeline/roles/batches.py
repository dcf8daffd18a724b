"""Batches: a batching destination's calls (``batch`` in its config) gathered into one request.

An admitted call of a destination with a ``batch`` joins its destination's open batch here
rather than being sent alone. A batch goes once it holds ``max_events`` calls, once the next call
would take it over ``max_bytes``, or ``max_wait`` after its first call joined; its body is the
JSON array of its calls' bodies, in the order they were admitted (a user's calls come from one
partition, in the order the router received them). A call bigger than ``max_bytes`` on its own
goes alone, in an array of one.

The request is the batch's (one rate-limit turn, one signature over the whole array, one
``webhook-id``: the batch's id); its answer is every call's. A batch that fails is retried
whole: each call goes to the same retry tier with the batch's earliest due time (``aligned``), so
they come back together and are gathered again (other calls that are due may join them). The
delivery log's attempt entry of each call names the batch (``batch <id> of <n> calls``).

A gathered call counts in flight for its destination (its ``max_in_flight``) until its batch is
handed off; the calls of a partition this process loses are dropped from their batch unsent
(their new owner reads them again).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Coroutine, MutableMapping
from typing import Any, NamedTuple, Protocol

from pipeline.core.batching import batch_body, batch_id, batch_label
from pipeline.core.config import Destination
from pipeline.core.delivery_policy import Conclusion
from pipeline.core.outcomes import Outcome, UrlResult
from pipeline.core.records import Delivery
from pipeline.kafka.consumer_loop import ConsumedRecord, Progress
from pipeline.kafka.errors import Produced
from pipeline.kafka.registry_codec import SchemaRegistryUnavailable
from pipeline.roles.delivery_decisions import Concluded, Logged, Sender, Start
from pipeline.roles.delivery_tracing import batch_span
from pipeline.runtime import tracing

__all__ = ["Batches", "BatchOwner", "Gathered", "aligned"]


class BatchOwner(Protocol):
    """What a batch asks of its delivery handler (``DeliveryHandler``)."""

    def conclusion(
        self,
        consumed: ConsumedRecord,
        start: Start,
        results: list[UrlResult],
        now: float,
        finished: float,
    ) -> Conclusion | Concluded: ...

    def handed(
        self,
        consumed: ConsumedRecord,
        start: Start,
        conclusion: Conclusion,
        results: list[UrlResult],
        now: float,
        finished: float,
        batch: str = "",
    ) -> Concluded: ...

    def failed(self, consumed: ConsumedRecord, record: Delivery, exc: Exception) -> Concluded: ...

    async def finish(
        self, consumed: ConsumedRecord, out: list[Produced], logged: Logged, loop: Progress
    ) -> None: ...

    def give_up(self, exc: BaseException) -> None: ...


class Gathered(NamedTuple):
    """A call in a batch: its Kafka record, its admission, and the loop that finishes it."""

    consumed: ConsumedRecord
    start: Start
    loop: Progress


class _Open:
    """A destination's batch while it gathers: its calls, the size of their array, its timer."""

    __slots__ = ("destination", "calls", "size", "timer")

    def __init__(self, destination: Destination) -> None:
        self.destination = destination
        self.calls: list[Gathered] = []
        self.size = 2  # "[]"
        self.timer: asyncio.TimerHandle | None = None


class Batches:
    """The open batches of one delivery handler (``owner``, whose ``sender`` makes their
    requests), by destination. ``in_flight``: the
    handler's count per destination, which a call leaves once its batch is handed off;
    ``spawn`` runs a batch's request in a task."""

    def __init__(
        self,
        owner: BatchOwner,
        sender: Sender,
        in_flight: MutableMapping[str, int],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self._owner = owner
        self._sender = sender
        self._in_flight = in_flight
        self._spawn = spawn
        self._open: dict[str, _Open] = {}

    def add(self, consumed: ConsumedRecord, start: Start, loop: Progress) -> None:
        """``start``'s call joins its destination's batch (sent now if that fills it)."""
        destination = start.destination
        limits = destination.batch
        assert limits is not None, "only a batching destination's calls are gathered"
        size = len(start.record.body)
        batch = self._open.get(destination.id)
        if batch is not None and batch.size + 1 + size > limits.max_bytes:
            self._go(destination.id)  # this call would take it over its byte limit
            batch = None
        if batch is None:
            batch = self._open[destination.id] = _Open(destination)
            batch.timer = asyncio.get_running_loop().call_later(
                limits.max_wait, self._go, destination.id
            )
        batch.size += size + (1 if batch.calls else 0)  # a comma between two bodies
        batch.calls.append(Gathered(consumed, start, loop))
        full = len(batch.calls) >= limits.max_events or batch.size >= limits.max_bytes
        if full or start.final:  # a call's last slot before its deadline waits for nothing
            self._go(destination.id)

    def _go(self, destination_id: str) -> None:
        batch = self._open.pop(destination_id, None)
        if batch is None:
            return
        if batch.timer is not None:
            batch.timer.cancel()
        self._spawn(self._attempt(batch.destination, batch.calls))

    async def flush_on(self, stop: asyncio.Event) -> None:
        """Send every open batch as soon as ``stop`` is set: before the consumer loop waits for
        what is in flight and commits, so that what they carry is finished and committed."""
        await stop.wait()
        self.flush()

    def flush(self) -> None:
        """Send every open batch now (the worker is stopping)."""
        for destination_id in list(self._open):
            self._go(destination_id)

    def released(self, keys: Collection[tuple[str, int]]) -> None:
        """Drop the calls of the partitions ``keys`` from their batches, unsent: their new owner
        reads them again."""
        dropped: list[Gathered] = []
        for destination_id, batch in list(self._open.items()):
            kept = [call for call in batch.calls if call.consumed.key not in keys]
            if len(kept) == len(batch.calls):
                continue
            dropped += [call for call in batch.calls if call.consumed.key in keys]
            if not kept:
                if batch.timer is not None:
                    batch.timer.cancel()
                del self._open[destination_id]
                continue
            batch.calls = kept
            batch.size = 1 + sum(len(call.start.record.body) + 1 for call in kept)
        for call in dropped:
            self._in_flight[call.start.record.destination_id] -= 1

    def __len__(self) -> int:
        """The calls gathered now, in every open batch."""
        return sum(len(batch.calls) for batch in self._open.values())

    async def _attempt(self, destination: Destination, calls: list[Gathered]) -> None:
        """One request for the batch; each call concluded from its answer and handed off."""
        try:
            concluded = await self._concluded(destination, calls)
        finally:
            for call in calls:
                self._in_flight[call.start.record.destination_id] -= 1
        if concluded is not None:
            owner = self._owner
            await asyncio.gather(
                *(
                    owner.finish(call.consumed, done.out, done.logged, call.loop)
                    for call, done in zip(calls, concluded, strict=True)
                )
            )

    async def _concluded(
        self, destination: Destination, calls: list[Gathered]
    ) -> list[Concluded] | None:
        """The batch's request and each call's conclusion (``None``: the worker stops)."""
        owner = self._owner
        now = time.time()
        ident = batch_id()
        body = batch_body([call.start.record.body for call in calls])
        final = any(call.start.final for call in calls)
        label = batch_label(ident, len(calls))
        span = None
        if tracing.enabled():
            traces = [tracing.trace_headers(call.consumed.message.headers()) for call in calls]
            span = batch_span(traces, label, destination.id)
        trace = () if span is None else tracing.headers_of(span)
        try:
            # The sender takes the batch's turn under the destination's pace: one a request.
            results = await self._sender.attempt(destination, body, ident, final=final, trace=trace)
        except Exception as exc:  # a bug must neither lose the calls nor stall them
            return [owner.failed(call.consumed, call.start.record, exc) for call in calls]
        finally:
            if span is not None:
                span.end()
        finished = time.time()
        conclusions: list[Conclusion | Concluded] = []
        for call in calls:
            try:
                conclusions.append(
                    owner.conclusion(call.consumed, call.start, results, now, finished)
                )
            except Exception as exc:
                conclusions.append(owner.failed(call.consumed, call.start.record, exc))
        concluded: list[Concluded] = []
        for call, conclusion in zip(calls, aligned(conclusions), strict=True):
            if isinstance(conclusion, Concluded):
                concluded.append(conclusion)
                continue
            consumed, start = call.consumed, call.start
            try:
                concluded.append(
                    owner.handed(consumed, start, conclusion, results, now, finished, label)
                )
            except SchemaRegistryUnavailable as exc:
                owner.give_up(exc)  # nothing of the batch is finished: a restart delivers it
                return None
            except Exception as exc:
                concluded.append(owner.failed(consumed, start.record, exc))
        return concluded


def aligned(conclusions: list[Conclusion | Concluded]) -> list[Conclusion | Concluded]:
    """A failed batch's calls retried together: each one going to a retry tier is due when the
    earliest of that tier's is (their schedules' jitter would spread them over a second or more,
    and split the batch when it comes back). Earlier, never later: no call is moved past its
    deadline."""
    earliest: dict[int, int] = {}
    for conclusion in conclusions:
        if isinstance(conclusion, Conclusion) and conclusion.outcome is Outcome.RETRY:
            moved = conclusion.delivery
            earliest[moved.tier] = min(earliest.get(moved.tier, moved.not_before), moved.not_before)
    if not earliest:
        return conclusions
    out: list[Conclusion | Concluded] = []
    for conclusion in conclusions:
        if isinstance(conclusion, Conclusion) and conclusion.outcome is Outcome.RETRY:
            moved = conclusion.delivery
            due = earliest[moved.tier]
            if due != moved.not_before:
                conclusion = conclusion._replace(delivery=moved._replace(not_before=due))
        out.append(conclusion)
    return out
