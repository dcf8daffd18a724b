"""The router role: ``calls`` → one delivery record per enabled destination.

The body is rendered here, once per call, so every retry sends the same bytes.

Hand-off, with transactions (the default): a batch is split by input partition, and each part's
delivery records are produced and its consumed offset committed in one Kafka transaction
(``PartitionTransactions``); the parts commit side by side. A router killed at any moment neither
loses nor doubles a delivery record; one that was fenced (its partition has a new owner) leaves the
part to that owner and routes nothing more of that partition (see ``_commit_part``).

Without transactions (``PIPELINE_TRANSACTIONS=off``): a batch is finished once Kafka acknowledged
every record it produced, and the consumer loop commits; a crash routes again what was routed since
the last commit.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from pipeline.core.calls import Call, CallType
from pipeline.core.exceptions import BrokerUnavailable
from pipeline.core.log_entries import call_log_record
from pipeline.core.outcomes import DeadLetterReason
from pipeline.core.records import (
    call_from_record,
    dead_letter_to_record,
)
from pipeline.core.render import render_body
from pipeline.core.routing import DropReason, Routed, route_record
from pipeline.core.timestamps import format_timestamp
from pipeline.core.topics import Topics
from pipeline.kafka.codec import Codec, RecordCodec
from pipeline.kafka.config_store import ConfigFollower
from pipeline.kafka.consumer_loop import ConsumedRecord, ConsumerLoop
from pipeline.kafka.errors import Headed, Placed, Produced
from pipeline.kafka.log_batches import LogRecordValue, log_batch_records
from pipeline.kafka.log_batches import Routed as RoutedRecord
from pipeline.kafka.partition_state import Changes
from pipeline.kafka.producer import AsyncProducer
from pipeline.kafka.registry_codec import SchemaRegistryUnavailable
from pipeline.kafka.transactions import Fenced, PartitionTransactions, TransactionFailed
from pipeline.roles.dedupe import Dedupe
from pipeline.roles.delivery_outcomes import dead_letter_of
from pipeline.runtime import metrics, tracing
from pipeline.runtime.tracing import TraceHeaders

__all__ = ["RouterHandler"]

log = logging.getLogger("pipeline.router")

TP = tuple[str, int]


class BatchParker(Protocol):
    """Asked of each delivery record of one batch (key, value, destination id, trace context):
    is it parked?
    The records it parked (in retry tiers, with their park header; several carried by one) are
    ``records()``, asked once the batch is routed; ``parked`` counts them."""

    parked: int

    def __call__(
        self, key: bytes | None, value: bytes, destination: str, trace: TraceHeaders
    ) -> bool: ...

    def records(self) -> list[Headed | Placed]: ...


class RouterHandler:
    role = "router"

    def __init__(
        self,
        *,
        topics: Topics,
        follower: ConfigFollower,
        producer: AsyncProducer,
        stop: asyncio.Event,
        codec: RecordCodec | None = None,
        transactions: Callable[[str, int], PartitionTransactions] | None = None,
        retake_after: float = 45.0,
        log: bool = False,
        log_bodies: bool = False,
        parking: Callable[[], BatchParker] | None = None,
        dedupe: Dedupe | None = None,
    ) -> None:
        """``transactions`` (input topic, partition → its ``PartitionTransactions``) given: hand
        off in transactions; the consumer loop must then not commit (``commits=False``).
        ``retake_after``: how long a fenced partition waits before it is taken back if it is
        still assigned here (a session timeout: a zombie knows it lost it by then).
        ``log``: each call's fate goes to the delivery log with its delivery records (in the
        same transaction); ``log_bodies``: with the call's JSON. ``parking``: makes, for each
        batch, the ``BatchParker`` asked of its delivery records (their key, value and delivery);
        what it parks goes out in its ``records()`` (in retry tiers, with their park header),
        not to ``deliveries`` (the delivery handler's parking, when this process delivers too:
        ``pipeline.roles.parking.RoutingParker``). ``dedupe``: resends of calls already routed
        are dropped (``pipeline.roles.dedupe``)."""
        self._topics = topics
        self._follower = follower
        self._producer = producer
        self._stop = stop
        self._new_transactions = transactions
        self._retake_after = retake_after
        self._transactions: dict[TP, PartitionTransactions] = {}
        # Transactions block; the parts of a batch commit side by side on these threads.
        self._threads = ThreadPoolExecutor(8, thread_name_prefix="router-transactions")
        self._committed = metrics.ROUTER_TRANSACTIONS.labels("committed")
        self._aborted = metrics.ROUTER_TRANSACTIONS.labels("aborted")
        self._fenced = metrics.ROUTER_TRANSACTIONS.labels("fenced")
        self._codec: RecordCodec = codec or Codec.default()
        #: Set when the pipeline cannot go on (the Schema Registry is down): the worker stops.
        self.fatal: BaseException | None = None
        self._log = log
        self._log_bodies = log_bodies
        self._parking = parking
        self._dedupe = dedupe
        self._tasks: set[asyncio.Task[None]] = set()
        self._routed = {t: metrics.CALLS_ROUTED.labels(t.value) for t in CallType}
        self._dropped = {r: metrics.CALLS_DROPPED.labels(r.value) for r in DropReason}

    def topics(self) -> Sequence[str]:
        return [self._topics.calls]

    @property
    def transactional(self) -> bool:
        return self._new_transactions is not None

    async def handle(self, batch: list[ConsumedRecord], loop: ConsumerLoop) -> None:
        if self.transactional:
            await self._handle_in_transactions(batch, loop)
            return
        routed = self._route(batch)
        if routed is None:
            self._forget(batch)
            return
        out, deliveries = routed
        metrics.DELIVERIES_ROUTED.inc(deliveries)
        try:
            await self._producer.send_all_until_acked(out, self._stop)
        except BaseException:
            self._forget(batch)  # stopping with the batch unfinished
            raise
        if self._dedupe is None:
            for taken in batch:
                loop.finish(taken)
            return
        # The changelog after the routed records: a router killed in between routes those calls
        # again after its restart, and never drops a call it did not route. Its acknowledgement
        # is waited for while the next batch is routed (the batch is finished then): waiting
        # here cost a broker round trip a batch (router throughput 0.8 of no dedupe).
        taken_changes = self._dedupe.take({taken.key[1] for taken in batch})
        self._spawn(self._remember(taken_changes, batch, loop))

    async def _remember(
        self, taken: list[Changes], batch: list[ConsumedRecord], loop: ConsumerLoop
    ) -> None:
        """Hand ``taken`` off to the changelog, then apply them and finish ``batch``."""
        assert self._dedupe is not None
        records = [record for changes in taken for record in changes.records]
        ends: dict[tuple[str, int], int] = {}
        try:
            await self._producer.send_all_until_acked(records, self._stop, ends=ends)
        except BrokerUnavailable:  # stopping: the batch is routed again after a restart
            self._forget(batch)
            return
        self._dedupe.apply(taken, ends)
        for consumed in batch:
            loop.finish(consumed)

    def _forget(self, records: list[ConsumedRecord]) -> None:
        """What was staged for the partitions of ``records``, whose hand-off will not happen."""
        if self._dedupe is not None:
            self._dedupe.discard({taken.key[1] for taken in records})

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        """A hand-off's end: one that failed (its state could not be written) stops the worker,
        its batch unfinished (routed again after a restart)."""
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        log.error("router: stopping: remembering a batch's calls failed: %r", exc)
        if self.fatal is None:
            self.fatal = exc
        self._stop.set()

    async def _handle_in_transactions(
        self, batch: list[ConsumedRecord], loop: ConsumerLoop
    ) -> None:
        parts: dict[TP, list[ConsumedRecord]] = {}
        for taken in batch:
            parts.setdefault(taken.key, []).append(taken)
        routed: list[tuple[TP, list[ConsumedRecord], list[Produced], int, list[Changes]]] = []
        for key, part in parts.items():
            made = self._route(part)
            if made is None:
                self._forget(batch)
                return  # the worker stops; nothing of this batch is committed
            out, deliveries = made
            changes = [] if self._dedupe is None else self._dedupe.take([key[1]])
            for one in changes:  # in the part's transaction
                out += one.records
            routed.append((key, part, out, deliveries, changes))
        await asyncio.gather(
            *(
                self._commit_part(key, part, out, n, loop, changes)
                for key, part, out, n, changes in routed
            )
        )

    async def _commit_part(
        self,
        key: TP,
        part: list[ConsumedRecord],
        out: list[Produced],
        deliveries: int,
        loop: ConsumerLoop,
        changes: list[Changes],
    ) -> None:
        """Commit one input partition's part of a batch; retried until it commits, the worker
        stops (the part is then routed again after a restart), or the partition is fenced."""
        transactions = self._transactions_for(key)
        running = asyncio.get_running_loop()
        next_offset = part[-1].offset + 1
        delay = 0.1
        while True:
            try:
                await running.run_in_executor(
                    self._threads,
                    # The group's metadata as of now: a rebalance between tries changes it.
                    lambda: transactions.commit(
                        out, next_offset=next_offset, group=loop.group_metadata()
                    ),
                )
                self._committed.inc()
                break
            except Fenced as exc:
                if not transactions.closed:
                    log.warning(
                        "router: %s[%d] fenced (%s): another router took it over; this one "
                        "routes none of it, and takes it back in %.0f s only if it is still "
                        "assigned here then",
                        *key,
                        exc,
                        self._retake_after,
                    )
                    self._fenced.inc()
                # A zombie learns that it lost the partition long before the pause ends (its
                # next heartbeat is refused), and the resume is then cancelled. Still assigned
                # here then, the fence was not a new owner's (a broker can fence a producer whose
                # transaction timed out): start again from the last commit, with a new producer.
                loop.defer(part[0], time.time() + self._retake_after)
                if self._transactions.get(key) is transactions:
                    self._retire(key)
                self._forget(part)
                return
            except TransactionFailed as exc:
                self._aborted.inc()
                if self._stop.is_set():
                    log.warning("router: stopping with %s[%d] uncommitted: %s", *key, exc)
                    self._forget(part)
                    return  # unfinished: routed again from the last commit after a restart
                log.warning("router: %s; trying again in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        metrics.DELIVERIES_ROUTED.inc(deliveries)
        if self._dedupe is not None:
            self._dedupe.apply(changes)
        for taken in part:
            loop.finish(taken)

    def assigned(self, keys: Sequence[TP]) -> None:
        """On the consumer thread, before the partitions' committed offsets are read: take each
        one's transactional id now. That ends a transaction the last owner left open (killed
        between sending its offsets and committing). On Apache Kafka a read_committed consumer's
        offset fetch is refused as unstable while such a transaction is open (KIP-447), so a
        lazy take-over would wait out the transaction timeout before routing anything.

        Then the partitions' dedupe state is restored, before their first records: after the
        take-over, so that the changelog holds what the last owner's open transaction came to."""
        self._take_over(keys)
        if self._dedupe is not None:
            self._dedupe.state.assigned([partition for _, partition in keys])

    def _take_over(self, keys: Sequence[TP]) -> None:
        if not self.transactional:
            return
        for key in keys:
            transactions = self._transactions_for(key)
            started = time.monotonic()
            try:
                transactions.prepare()
            except (TransactionFailed, Fenced) as exc:  # the first commit tries again
                log.warning("router: could not take %s[%d] over yet: %s", *key, exc)
                continue
            took = time.monotonic() - started
            if took > 5:  # the broker was ending the last owner's transaction, or is struggling
                log.warning("router: taking %s[%d] over took %.1f s", *key, took)

    def released(self, keys: Sequence[TP]) -> None:
        """Revoked or lost partitions: their producers go (after any commit in progress), and
        their state."""
        for key in keys:
            self._retire(key)
        if self._dedupe is not None:
            self._dedupe.state.released([partition for _, partition in keys])

    def _transactions_for(self, key: TP) -> PartitionTransactions:
        """The input partition's transactions, made on first use."""
        assert self._new_transactions is not None
        transactions = self._transactions.get(key)
        if transactions is None:
            transactions = self._transactions[key] = self._new_transactions(*key)
        return transactions

    def _retire(self, key: TP) -> None:
        """Forget the partition's transactions; its producer closes once no commit runs."""
        transactions = self._transactions.pop(key, None)
        if transactions is not None:
            self._threads.submit(transactions.close)

    def _decode(self, data: bytes | None) -> Call:
        return call_from_record(self._codec.decode("Call", data))

    def _route(self, batch: list[ConsumedRecord]) -> tuple[list[Produced], int] | None:
        """The records to produce for ``batch`` and how many delivery records they carry;
        ``None`` when the worker must stop."""
        table = self._follower.table
        codec = self._codec
        decode = self._decode
        try:
            decisions = [route_record(taken.message.value(), decode, table) for taken in batch]
        except SchemaRegistryUnavailable as exc:
            # Not the records' fault: stop without finishing them; a restart picks them up.
            self.fatal = exc
            self._stop.set()
            return None
        first_seen = self._first_seen(batch, decisions)
        deliveries_topic = self._topics.deliveries
        log_topic = self._topics.log if self._log else None
        parking = None if self._parking is None else self._parking()
        out: list[Produced] = []
        delivered = 0
        logged: list[LogRecordValue] = []
        # Counted per batch, not per call (a lock each), before anything is produced.
        routed: dict[CallType, int] = {}
        dropped: dict[DropReason, int] = {}
        for index, (taken, decision) in enumerate(zip(batch, decisions, strict=True)):
            if decision.call_type is None:
                undecodable = DeadLetterReason.UNDECODABLE
                letter = dead_letter_of(undecodable, taken, detail=decision.undecodable or "")
                metrics.DEAD_LETTERS.labels(metrics.UNKNOWN_DESTINATION, undecodable.value).inc()
                value = codec.encode("DeadLetter", dead_letter_to_record(letter))
                out.append((self._topics.dlq, None, value))
                continue
            routed[decision.call_type] = routed.get(decision.call_type, 0) + 1
            if first_seen and first_seen[index] is not None:
                decision = decision._replace(dropped=DropReason.DUPLICATE, excluded=())
            came = _came(taken)
            if log_topic is not None:
                logged.append(self._log_record(taken, decision, first_seen, index, came))
            names = [name for _, name in decision.keys]
            if decision.dropped is not None:
                dropped[decision.dropped] = dropped.get(decision.dropped, 0) + 1
                _routed_trace(came, decision, names)
                continue
            first = decision.delivery
            values = codec.delivery_values(first, names) if first is not None else []
            trace = _routed_trace(came, decision, names)
            for (key, name), value in zip(decision.keys, values, strict=True):
                if parking is None or not parking(key, value, name, trace):
                    out.append(
                        (deliveries_topic, key, value, trace)
                        if trace
                        else (deliveries_topic, key, value)
                    )
                    delivered += 1
        for call_type, count in routed.items():
            self._routed[call_type].inc(count)
        for reason, count in dropped.items():
            self._dropped[reason].inc(count)
        if parking is not None:
            out += parking.records()  # the parked ones of a destination together, in one
            delivered += parking.parked
        if logged and log_topic is not None:
            # One Kafka record for the batch's log, keyed by its input partition: a part's
            # transaction then spans one partition of the log.
            key = str(batch[0].key[1]).encode()
            out += log_batch_records(codec, log_topic, logged, key)
        return out, delivered

    def _first_seen(
        self, batch: list[ConsumedRecord], decisions: list[Routed]
    ) -> list[int | None] | None:
        """For each record, when its call was first received if it is a resend (``None``:
        dedupe is off)."""
        if self._dedupe is None:
            return None
        calls = [
            (taken.key[1], decision.call) if decision.call is not None else None
            for taken, decision in zip(batch, decisions, strict=True)
        ]
        return self._dedupe.first_seen(calls, int(time.time() * 1000))

    def _log_record(
        self,
        taken: ConsumedRecord,
        decision: Routed,
        first_seen: list[int | None] | None,
        index: int,
        trace: TraceHeaders,
    ) -> LogRecordValue:
        """The delivery log's record of the call ``decision`` is about (the common case, a call
        routed with no destination left out, as its arguments: written with its batch). A
        resend's says when its first copy was received."""
        call = decision.call
        assert call is not None
        size = len(taken.message.value() or b"")
        at = int(time.time() * 1000)
        destinations = [name for _, name in decision.keys]
        trace_id = tracing.cleaned_trace_id(trace)  # the call's context as it came, cleaned
        if not self._log_bodies and decision.dropped is None and not decision.excluded:
            return RoutedRecord(call, size, at, destinations, trace_id)
        body = None
        if self._log_bodies:
            first = decision.delivery
            body = first.body if first is not None else render_body(call)
        return call_log_record(
            call,
            size,
            at,
            destinations=destinations,
            dropped=None if decision.dropped is None else decision.dropped.value,
            detail=_resend_detail(first_seen[index] if first_seen else None),
            excluded=[(name, reason.value) for name, reason in decision.excluded],
            body=None if body is None else body.decode(),
            trace_id=trace_id,
        )

    async def aclose(self) -> None:
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=10)
        for key in list(self._transactions):
            self._retire(key)
        if self._dedupe is not None:
            self._dedupe.state.close()
        await asyncio.to_thread(self._threads.shutdown, True)


def _came(taken: ConsumedRecord) -> TraceHeaders:
    """The call's trace context, if it has one that may be passed on (``tracing.cleaned``: a
    record on ``calls`` may come from any producer)."""
    trace = tracing.trace_headers(taken.message.headers())
    return tracing.cleaned(trace) if trace else trace


def _routed_trace(trace: TraceHeaders, decision: Routed, names: Sequence[str]) -> TraceHeaders:
    """The trace context of the delivery records ``decision`` makes (to ``names``): its routing
    span's, when it makes one (ended at once), else the call's as it came (``trace``; empty:
    none) if it is ``passed_on``."""
    if not trace or not tracing.recording(trace):
        return tracing.passed_on(trace)  # (its span's attributes are not even made)
    call = decision.call
    assert call is not None
    kind = call.type.value
    left_out = (
        [
            ("destination left out", {"pipeline.destination": name, "reason": reason.value})
            for name, reason in decision.excluded
        ]
        if decision.excluded
        else ()
    )
    return tracing.step(
        trace,
        _ROUTE_NAMES[kind],
        {"pipeline.message_id": call.message_id},
        events=left_out,
        shared=((kind, call.source_id, tuple(names), decision.dropped), _routing_attributes),
    )


#: A routing span's name, by call type.
_ROUTE_NAMES = {kind.value: f"route {kind.value}" for kind in CallType}


def _routing_attributes(
    shared: tuple[str, str, tuple[str, ...], DropReason | None],
) -> dict[str, Any]:
    """What a routing span shares with every routing of the same kind, source, destinations and
    drop reason (kept encoded)."""
    kind, source, names, dropped = shared
    attributes: dict[str, Any] = {
        "pipeline.call.type": kind,
        "pipeline.source": source,
        "pipeline.destinations": list(names),
    }
    if dropped is not None:
        attributes["pipeline.drop_reason"] = dropped.value
    return attributes


def _resend_detail(first_received: int | None) -> str:
    """The delivery log's words for a resend: when its first copy was received."""
    if first_received is None:
        return ""
    return f"a resend of the call first received at {format_timestamp(first_received)}"
