"""Ordered delivery per user: a destination with ``ordering: per_user`` gets each user's calls in
the order the router received them.

One user's calls to one destination share a key (``<destination>/<user>``), hence a partition of
``deliveries``, where they arrive in order. The deliver role keeps that order:

- **One lane per user.** The calls of an ordered destination's user go through a lane (``Lanes``):
  a call is attempted once the one before it has an outcome; other users' lanes run meanwhile.
- **A waiting call holds its user.** A call that goes to a retry tier (retried, or parked) becomes
  its user's *blocker*: the hold (``h`` + key → the blocker's messageId) is written to the
  partition's state (``pipeline.kafka.partition_state``, changelog
  ``state.ordering.changelog``), and the user's later calls are *queued* there (``q`` + key +
  their ``deliveries`` offset → the record as it was consumed), not kept in memory: a held call
  costs one changelog record (its own bytes) and one tombstone once it goes on.
- **An outcome releases it.** The retry role, when an ordered destination's call in a tier is
  delivered, dead-lettered or suppressed, produces a *release* record to ``deliveries`` with the
  call's key (``RELEASE_HEADER``): it lands in the user's partition, in the lane, after the calls
  queued so far. The lane then delivers the queued calls in order, until one waits again (it
  becomes the blocker) or none is left (the hold is removed). A delete call for a held user
  suppresses the calls queued before it and removes the hold; a destination disabled, deleted or
  no longer ordered has its holds released by the sweep (the queued calls are then decided as any
  call of it is: dead-lettered, or delivered unordered).
- **A busy user spills.** A lane with ``spill_at`` (100) calls waiting in memory moves them to the
  state behind a hold of its own (``SPILLED``, no call waits) and delivers them from there, a
  piece at a time: one user's backlog never fills the worker's in-flight limit.

Crash-safety: a blocker's tier record is acknowledged before its hold is written, and a record is
finished only once the state changes it made are acknowledged on the changelog; a record killed
in between is read again and decided again (a call may be delivered twice, never lost, never
after a later one of its user).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol

from pipeline.core.config import ConfigTable, Destination
from pipeline.core.exceptions import BrokerUnavailable
from pipeline.core.log_entries import held_log_record, released_log_record, suppressed_log_record
from pipeline.core.records import Delivery
from pipeline.core.routing import key_destination
from pipeline.core.suppression import SUPPRESSED_REASON
from pipeline.core.topics import Topics
from pipeline.kafka.codec import RecordCodec
from pipeline.kafka.consumer_loop import ConsumedRecord, Progress
from pipeline.kafka.errors import Produced
from pipeline.kafka.log_batches import LogRecordValue, log_batch_records
from pipeline.kafka.producer import Producing
from pipeline.kafka.registry_codec import SchemaRegistryUnavailable
from pipeline.roles.delivery_decisions import Concluded
from pipeline.roles.delivery_tracing import held_wait
from pipeline.roles.holds import (
    MORE,
    SPILLED,
    SWEEP,
    Change,
    Hold,
    Holds,
    QueuedCall,
    Release,
    hold_change,
    queue_change,
    queued_call,
    release_of,
    release_record,
    unhold_change,
    unqueue_change,
)
from pipeline.roles.parking import Headers, PartMessage
from pipeline.runtime import metrics
from pipeline.runtime.tracing import TRACEPARENT, trace_headers

__all__ = ["Lanes", "Deliverer"]

log = logging.getLogger("pipeline.ordering")

#: Queued calls a release delivers before it hands the rest to a release of its own (the queue is
#: read from the state in pieces this big: memory stays bounded whatever the queue's length).
RELEASE_PIECE = 500
#: How often the sweep looks for holds of destinations that are no longer ordered and enabled.
SWEEP_SECONDS = 2.0
#: A held user the sweep sent a release for is sent another after this long, if still held.
SWEEP_AGAIN = 60.0
#: How many of the calls that went on a released call's log entry names.
NAMED_CALLS = 20


class Deliverer(Protocol):
    """What a lane asks of the delivery handler."""

    def decode(self, consumed: ConsumedRecord) -> Delivery | Concluded: ...

    async def decided(self, consumed: ConsumedRecord, record: Delivery) -> Concluded | None:
        """Admit ``record`` and attempt it if it may be; ``None``: the worker stops."""

    async def finish(
        self,
        consumed: ConsumedRecord,
        out: list[Produced],
        logged: LogRecordValue | None,
        loop: Progress,
    ) -> None: ...

    def give_up(self, exc: BaseException) -> None: ...


class _Lane:
    __slots__ = ("items", "task")

    def __init__(self) -> None:
        self.items: deque[ConsumedRecord] = deque()
        self.task: asyncio.Task[None] | None = None


class Lanes:
    """The deliver role's lanes of ordered destinations' users (see the module's docstring)."""

    def __init__(
        self,
        holds: Holds,
        deliverer: Deliverer,
        *,
        topics: Topics,
        codec: RecordCodec,
        producer: Producing,
        stop: asyncio.Event,
        log_on: bool,
        spill_at: int = 100,
    ) -> None:
        self.holds = holds
        self._deliverer = deliverer
        self._topics = topics
        self._codec = codec
        self._producer = producer
        self._stop = stop
        self._log_on = log_on
        self._lanes: dict[bytes, _Lane] = {}
        #: Keys the sweep sent a release for, not released yet, and when (it sends one again
        #: only after ``SWEEP_AGAIN`` seconds: the partition may have moved meanwhile).
        self._swept: dict[bytes, float] = {}
        #: A lane holding this many calls in memory spills them to the state (``_spill``).
        self._spill_at = spill_at
        self._sweeper: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def takes(self, message: Any, destination: Destination | None, destination_id: str) -> bool:
        """Whether a record of ``deliveries`` goes through a lane: an ordered destination's, a
        release, or one of a destination whose users are held here (ordered no longer)."""
        if destination is not None and destination.ordered:
            return True
        return self.holds.holding(destination_id) or release_of(message) is not None

    def add(self, consumed: ConsumedRecord, loop: Progress) -> None:
        key = consumed.message.key() or b""
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane()
        lane.items.append(consumed)
        if lane.task is None:
            lane.task = asyncio.create_task(self._run(key, lane, loop))

    # ---- a lane --------------------------------------------------------------------------------

    async def _run(self, key: bytes, lane: _Lane, loop: Progress) -> None:
        try:
            while lane.items and not self._stop.is_set():
                consumed = lane.items.popleft()
                if not loop.owns(consumed):
                    continue  # the partition went: its new owner reads the record again
                release = release_of(consumed.message)
                if release is not None:
                    await self._release(key, consumed, release, lane, loop)
                else:
                    await self._fresh(key, consumed, lane, loop)
        except BrokerUnavailable:
            pass  # stopping with records unacknowledged: they are read again after a restart
        except SchemaRegistryUnavailable as exc:
            self._deliverer.give_up(exc)  # what is unfinished is read again after a restart
        except Exception as exc:  # a bug: stop, rather than deliver a user's calls out of order
            log.exception("ordering: stopping: the lane of %r failed", key)
            self._deliverer.give_up(exc)
        finally:
            lane.task = None
            if self._lanes.get(key) is lane:
                del self._lanes[key]

    async def _fresh(
        self, key: bytes, consumed: ConsumedRecord, lane: _Lane, loop: Progress
    ) -> None:
        """A call read from ``deliveries``: queued behind its user's blocker, or delivered."""
        partition = consumed.key[1]
        record = self._deliverer.decode(consumed)
        if isinstance(record, Concluded):  # undecodable: dead-lettered, the lane goes on
            await self._deliverer.finish(consumed, record.out, record.logged, loop)
            return
        hold = self.holds.held(partition, key)
        if hold is not None and hold.blocker != record.message_id:
            if record.call_type != "delete":
                await self._queue(key, [(consumed, record)], hold, lane, loop)
                return
            await self._suppress_queue(key, consumed, loop)  # then the delete call goes
            hold = None
        if hold is None and len(lane.items) >= self._spill_at:
            await self._spill(key, consumed, record, lane, loop)
            return
        decided = await self._decided(consumed, record)
        if decided is None:
            return
        if not decided.waits:
            if decided.out:  # the lane goes on meanwhile: its order is the attempts'
                self._spawn(self._deliverer.finish(consumed, decided.out, decided.logged, loop))
            else:  # delivered: nothing to wait for (the log finishes it), no task to make
                await self._deliverer.finish(consumed, decided.out, decided.logged, loop)
            return
        # It waits: its tier record is acknowledged before the hold that names it is written.
        await self._send(decided.out, _listed(decided.logged))
        if await self._commit(consumed, [hold_change(key, record.message_id, hold)], loop):
            loop.finish(consumed)

    async def _spill(
        self, key: bytes, consumed: ConsumedRecord, record: Delivery, lane: _Lane, loop: Progress
    ) -> None:
        """The user's lane holds ``spill_at`` calls or more in memory (a busy user: one call at
        a time is slower than they come): they go to the state, behind a hold of the lane's own,
        and a release record of its own delivers them from there, in order. So one user's
        backlog never fills the worker's in-flight limit, and the partition's other users flow
        on."""
        spilled = Hold(_now_ms(), SPILLED)
        start = hold_change(key, SPILLED, None)
        again = release_record(self._topics, key, MORE, blocker=SPILLED)
        await self._queue(key, [(consumed, record)], spilled, lane, loop, [start], [again])

    async def _decided(self, consumed: ConsumedRecord, record: Delivery) -> Concluded | None:
        due = record.not_before / 1000 - time.time()
        if due > 0:  # a call from deliveries is due when it arrives, but for a clock's skew
            await asyncio.sleep(due)
        return await self._deliverer.decided(consumed, record)

    async def _queue(
        self,
        key: bytes,
        first: list[tuple[ConsumedRecord, Delivery]],
        hold: Hold,
        lane: _Lane,
        loop: Progress,
        changes: Sequence[Change] = (),
        out: Sequence[Any] = (),
    ) -> bool:
        """Queue ``first`` and the calls behind it in the lane, up to a release or a delete call,
        in the state behind ``hold`` (with ``changes`` and ``out``); finished once the
        changelog has them. ``False``: there were none."""
        items = first
        while lane.items and release_of(lane.items[0].message) is None:
            consumed = lane.items[0]
            record = self._deliverer.decode(consumed)
            if isinstance(record, Concluded) or record.call_type == "delete":
                break
            lane.items.popleft()
            if loop.owns(consumed):
                items.append((consumed, record))
        if not items:
            return False
        queued = list(changes)
        logged: list[LogRecordValue] = []
        now = _now_ms()
        for consumed, record in items:
            value = consumed.message.value() or b""
            traceparent = dict(trace_headers(consumed.message.headers())).get(TRACEPARENT, b"")
            queued.append(queue_change(key, consumed.offset, value, traceparent))
            if self._log_on and hold.blocker != SPILLED:
                logged.append(held_log_record(record, now, hold.blocker))
        if await self._commit(items[0][0], queued, loop, out=out, logged=logged):
            for consumed, _ in items:
                loop.finish(consumed)
        return True

    async def _suppress_queue(self, key: bytes, consumed: ConsumedRecord, loop: Progress) -> None:
        """A delete call for a held user: the calls queued before it are suppressed (a deletion
        request covers them), a piece at a time, and the hold goes. Its blocker is suppressed
        when it comes due."""
        partition = consumed.key[1]
        while piece := self.holds.queued(partition, key, RELEASE_PIECE):
            changes = []
            logged: list[LogRecordValue] = []
            now = _now_ms()
            for call in piece:
                changes.append(unqueue_change(call.state_key))
                record = self._deliverer.decode(_stand_in(consumed, key, call))
                if isinstance(record, Concluded):
                    continue
                metrics.SUPPRESSED.labels(metrics.destination_label(record.destination_id)).inc()
                if self._log_on:
                    logged.append(suppressed_log_record(record, now, SUPPRESSED_REASON))
            if not await self._commit(consumed, changes, loop, logged=logged):
                return
        hold = self.holds.held(partition, key)
        if hold is not None:
            await self._commit(consumed, [unhold_change(key, hold)], loop)
        self._swept.pop(key, None)

    async def _release(
        self, key: bytes, consumed: ConsumedRecord, release: Release, lane: _Lane, loop: Progress
    ) -> None:
        """The blocker has an outcome: deliver the queued calls in order, until one waits (the
        new blocker) or none is left (the hold goes). The release record is finished once the
        changelog has what it changed."""
        partition = consumed.key[1]
        hold = self.holds.held(partition, key)
        if hold is None or (release.outcome != SWEEP and hold.blocker != release.message_id):
            # An old release: its user was released already, or is held by another call now.
            loop.finish(consumed)
            return
        queued = self.holds.queued(partition, key, RELEASE_PIECE + 1)
        piece = queued[:RELEASE_PIECE]
        parts = [_stand_in(consumed, key, call) for call in piece]
        out: list[Any] = []
        logged: list[LogRecordValue] = []
        changes: list[Change] = []
        went_on: list[str] = []
        blocked = ""  # the call that waits now, if one does
        spilled = False  # calls that came meanwhile were queued behind the piece
        for call, part in zip(piece, parts, strict=True):
            if len(lane.items) >= self._spill_at:  # a piece takes long: the lane spills meanwhile
                spilled = await self._queue(key, [], hold, lane, loop) or spilled
            changes.append(unqueue_change(call.state_key))
            record = self._deliverer.decode(part)
            if isinstance(record, Concluded):
                out += record.out
                logged += _listed(record.logged)
                continue
            held_wait(part.message, record.destination_id, hold.blocker, time.time())
            decided = await self._decided(part, record)
            if decided is None:
                return  # the worker stops: the release is read again after a restart
            if decided.waits and release.outcome != SWEEP:
                # The new blocker: earlier calls' hand-offs and its tier record, then its hold.
                await self._send(out + decided.out, logged + _listed(decided.logged))
                out, logged = [], []
                changes.append(hold_change(key, record.message_id, hold))
                blocked = record.message_id
                break
            # (Swept: the destination is no longer ordered; a call that waits holds no one.)
            out += decided.out
            logged += _listed(decided.logged)
            went_on.append(record.message_id)
        if not blocked:
            if len(queued) > len(piece) or spilled:  # a release of its own goes on with the rest
                again = SWEEP if release.outcome == SWEEP else MORE
                out.append(release_record(self._topics, key, again, blocker=hold.blocker))
            else:
                changes.append(unhold_change(key, hold))
                self._swept.pop(key, None)
        if self._log_on and release.outcome not in (SWEEP, MORE):
            logged.append(_released(release, went_on, key, blocked))
        await self._commit(consumed, changes, loop, out=out, logged=logged)
        loop.finish(consumed)

    # ---- Kafka ---------------------------------------------------------------------------------

    async def _send(self, out: list[Any], logged: list[LogRecordValue]) -> None:
        records = list(out)
        if logged:
            records += log_batch_records(self._codec, self._topics.log, logged)
        if records:
            await self._producer.send_all_until_acked(records, self._stop)

    async def _commit(
        self,
        consumed: ConsumedRecord,
        changes: Sequence[Change],
        loop: Progress,
        *,
        out: Sequence[Any] = (),
        logged: Sequence[LogRecordValue] = (),
    ) -> bool:
        """Hand ``changes`` to the state of ``consumed``'s partition off, with ``out`` and
        ``logged``; apply them once the changelog has them. ``False``: the partition is not
        ours any more (nothing is handed off: its new owner reads ``consumed`` again)."""
        if not loop.owns(consumed):
            return False
        partition = consumed.key[1]
        taken = self.holds.commit(partition, changes)
        records: list[Any] = [*out, *([] if taken is None else taken.records)]
        if logged:
            records += log_batch_records(self._codec, self._topics.log, list(logged))
        ends: dict[tuple[str, int], int] = {}
        if records:
            await self._producer.send_all_until_acked(records, self._stop, ends=ends)
        if taken is not None:
            topic = self.holds.state.changelog_topic
            self.holds.state.apply(taken, ends.get((topic, partition)))
        return True

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- the sweep -----------------------------------------------------------------------------

    def start_sweep(self, table: Any) -> None:
        """Look every ``SWEEP_SECONDS`` for held users of destinations that are deleted, disabled
        or no longer ordered in the live config (``table()``), and release them."""
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep_every(table))

    async def _sweep_every(self, table: Any) -> None:
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._stop.wait(), SWEEP_SECONDS)
            except TimeoutError:
                pass
            if self._stop.is_set():
                return
            try:
                await self.sweep(table())
            except BrokerUnavailable:
                return  # stopping: the next deliver role sweeps
            except Exception:  # noqa: BLE001 (tried again at the next sweep)
                log.exception("ordering: the sweep failed")

    async def sweep(self, table: ConfigTable) -> int:
        """Send a release for each held user of a destination not ordered and enabled now;
        returns how many."""
        out = []
        for partition, counts in list(self.holds.counts().items()):
            for destination_id, count in list(counts.items()):
                destination = table.destinations.get(destination_id)
                if not count or (
                    destination is not None and destination.ordered and destination.enabled
                ):
                    continue
                now = time.monotonic()
                for key in self.holds.held_keys(partition, destination_id):
                    if now - self._swept.get(key, -SWEEP_AGAIN) >= SWEEP_AGAIN:
                        self._swept[key] = now
                        out.append(release_record(self._topics, key, SWEEP))
        if out:
            log.info(
                "ordering: releasing %d held users of destinations no longer ordered", len(out)
            )
            await self._send(out, [])
        return len(out)

    async def aclose(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        tasks = [lane.task for lane in self._lanes.values() if lane.task is not None]
        tasks += self._tasks
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        self.holds.close()


def _stand_in(consumed: ConsumedRecord, key: bytes, queued: QueuedCall) -> ConsumedRecord:
    """A queued call as a record consumed at its own offset of ``consumed``'s partition (what its
    decode and its dead letter read; its trace context, and when it was queued as its time); it
    is finished with the record that released it."""
    value, traceparent = queued_call(queued.stored)
    headers: Headers = [(TRACEPARENT, traceparent)] if traceparent else []
    stand_in = ConsumedRecord.__new__(ConsumedRecord)
    stand_in.message = PartMessage(key, value, headers, (1, queued.queued_at))  # type: ignore[assignment]
    stand_in.key = consumed.key
    stand_in.offset = queued.offset
    stand_in._partition = consumed._partition
    stand_in._generation = consumed._generation
    stand_in._container = None
    return stand_in


def _listed(logged: LogRecordValue | None) -> list[LogRecordValue]:
    return [] if logged is None else [logged]


def _released(release: Release, went_on: list[str], key: bytes, waits: str) -> dict[str, Any]:
    """The releasing call's log record: its outcome, which held calls went on then, and which
    waits now (``waits``; "": none)."""
    said = [release.outcome]
    if went_on:
        named = ", ".join(went_on[:NAMED_CALLS])
        if len(went_on) > NAMED_CALLS:
            named += f" and {len(went_on) - NAMED_CALLS} more"
        past = " past it" if release.outcome == "dead_lettered" else ""
        said.append(f"{len(went_on)} held calls went on{past}: {named}")
    if waits:
        said.append(f"{waits} is next, and waits in a retry tier")
    return released_log_record(
        release.message_id,
        release.source,
        release.call_type,
        key_destination(key),
        _now_ms(),
        "; ".join(said),
    )


def _now_ms() -> int:
    return int(time.time() * 1000)
