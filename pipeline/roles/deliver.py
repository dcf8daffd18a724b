"""The delivery handler: each consumed delivery record gets one decision, and is handed on by it.

The same handler serves the ``deliver`` role (``deliveries``) and the ``retry`` role (the tier
topics). For each record, in order (``_decide``):

1. **When is it due?** Its schedule (``pipeline.roles.parking.Schedule``: the header every record
   in a tier carries; a record on ``deliveries`` is due now). Due in more than ``HOLD_SECONDS``:
   the consumer loop pauses its partition until then (``Defer``); due sooner: held here until it
   is (``Hold``; a parked batch undecoded, ``Retake``), since a pause costs a fetch round trip.
2. **Can its destination take it now?** Asked before the decode where the record may still be
   parked as it is (a fresh one, or a parked one come due): if not, it is parked again undecoded
   (``HandOff``). A parked batch come due is split into the records it carries (``Split``). A
   fresh record of an ordered destination, or a release, goes to its user's lane instead
   (``InLane``; ``pipeline.roles.ordering``), which takes the next steps in the user's order.
3. **Decode** (an undecodable record is dead-lettered ``undecodable``).
4. **Suppressed?** A deletion request for the call's user came after the call: logged and
   counted, never attempted.
5. **Admission** (``pipeline.core.admission``): dead letter (destination deleted or disabled,
   deadline passed), park, or attempt (``Start``).

An attempt (a batching destination's: of a batch, ``pipeline.roles.batches``) POSTs to every
webhook of the destination at once; its results are concluded (``delivery_policy.conclude``):
delivered (finished), the next retry tier, or the dead-letter topic. A record is finished only
once Kafka has acknowledged its hand-off and the delivery log's record (those of one turn of the
event loop go out together, ``LogBatcher``); waiting, it is out of the in-flight count. A record
whose partition was revoked or lost meanwhile is not handed off: its new owner reads it again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any

from pipeline.core.admission import FRESH, Attempt, Limits, Park, Refused, Reject, window_of
from pipeline.core.config import Destination
from pipeline.core.delivery_policy import Conclusion, Schedules, conclude
from pipeline.core.endpoint_health import EndpointHealth
from pipeline.core.exceptions import UndecodableRecord
from pipeline.core.outcomes import Outcome, UrlResult
from pipeline.core.records import Delivery, delivery_from_record
from pipeline.core.retry_schedule import RetrySchedule
from pipeline.core.routing import key_destination
from pipeline.core.settings import Settings
from pipeline.core.suppression import suppressed_by
from pipeline.core.topics import Topics
from pipeline.kafka.codec import Codec, RecordCodec
from pipeline.kafka.consumer_loop import ConsumedRecord, Progress
from pipeline.kafka.errors import Produced
from pipeline.kafka.events import EventEmitter
from pipeline.kafka.log_batches import LogBatcher, log_batch_records
from pipeline.kafka.producer import Producing
from pipeline.kafka.registry_codec import SchemaRegistryUnavailable
from pipeline.roles.batches import Batches
from pipeline.roles.delivery_decisions import (
    Concluded,
    Decision,
    Defer,
    HandOff,
    Hold,
    InLane,
    LiveConfig,
    Logged,
    Retake,
    Retakes,
    Sender,
    Skip,
    Split,
    Start,
    all_refused,
    due_groups,
)
from pipeline.roles.delivery_outcomes import (
    DeadLetters,
    DestinationWatch,
    MetricsByDestination,
)
from pipeline.roles.delivery_tracing import waited
from pipeline.roles.hand_offs import HandOffs
from pipeline.roles.holds import Holds
from pipeline.roles.ordering import Lanes
from pipeline.roles.parking import (
    Parking,
    ParkingBatch,
    schedule_of,
    unpacked,
)
from pipeline.runtime import metrics
from pipeline.runtime.tracing import trace_headers

__all__ = ["DeliveryHandler", "Sender", "HOLD_SECONDS"]
log = logging.getLogger("pipeline.deliver")

#: A record due within this many seconds is held in memory (it counts against the in-flight
#: limit) and attempted at its due time; one due later pauses its partition until this long
#: before it is due. Pausing and resuming a partition costs a fetch round trip (50 ms to a second),
#: so pausing alone made every retry that late.
HOLD_SECONDS = 1.0


class DeliveryHandler:
    def __init__(
        self,
        role: str,
        topics_in: Sequence[str],
        *,
        settings: Settings,
        topics: Topics,
        follower: LiveConfig,
        producer: Producing,
        sender: Sender,
        health: EndpointHealth,
        stop: asyncio.Event,
        codec: RecordCodec | None = None,
        schedule: RetrySchedule | None = None,
        deleted: Mapping[str, int] | None = None,
        holds: Holds | None = None,
    ) -> None:
        """``health``: the endpoints' health the sender keeps; ``deleted``: user id → time of the
        user's latest deletion request (epoch ms), kept up to date by a ``DeletionFollower``;
        the user's calls received before it are suppressed. ``holds`` (the deliver role): the
        held users of ordered destinations, whose calls go through lanes (``Lanes``)."""
        self.role = role
        self._topics_in = list(topics_in)
        self._topics = topics
        self._follower = follower
        self._producer = producer
        self._sender = sender
        self._health = health
        self._stop = stop
        self._codec: RecordCodec = codec or Codec.default()
        #: Set when the pipeline cannot go on (the Schema Registry is down): the worker stops.
        self.fatal: BaseException | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._retakes = Retakes()
        self._schedules = Schedules(
            schedule or RetrySchedule(settings.retry_delays, settings.retry_deadline)
        )
        #: Records being attempted, per destination (its ``max_in_flight``).
        self._in_flight: dict[str, int] = {}
        self._limits = Limits(
            parking=settings.parking,
            unanswered=settings.max_connections_per_host,
            probe_answered=settings.delivery_timeout + 0.5,
        )
        metrics.configure_destination_labels(settings.metrics_max_destinations)
        self._metrics = MetricsByDestination(len(topics.retry))
        #: Parking in this process; the router's parker (in a worker) shares it.
        self.parking = Parking(
            health=health,
            in_flight=self._in_flight,
            schedules=self._schedules,
            topics=topics,
            limits=self._limits,
            counters=self._metrics.parked,
            tier_partitions=settings.retry_partitions,
        )
        events = EventEmitter(producer, self._codec, topics.events)
        self._events = events
        self._dead_letters = DeadLetters(topics, self._codec, events)
        self._watch = DestinationWatch(
            role=role,
            topics=topics,
            codec=self._codec,
            producer=producer,
            events=events,
            stop=stop,
            spawn=self._spawn,
        )
        self._owned: set[tuple[str, int]] = set()
        self._batches = Batches(self, sender, self._in_flight, self._spawn)
        main = {topics.deliveries: settings.partitions}
        self._partitions = sum(main.get(topic, settings.retry_partitions) for topic in topics_in)
        self._log = LogBatcher(producer, self._codec, topics.log, stop) if settings.log else None
        self._hand_offs = HandOffs(
            role,
            topics=topics,
            codec=self._codec,
            follower=follower,
            counted=self._metrics,
            dead_letters=self._dead_letters,
            log_on=settings.log,
        )
        self._deleted: Mapping[str, int] = {} if deleted is None else deleted
        self._lanes = (
            None
            if holds is None
            else Lanes(
                holds,
                self,
                topics=topics,
                codec=self._codec,
                producer=producer,
                stop=stop,
                log_on=settings.log,
            )
        )

    def topics(self) -> Sequence[str]:
        return self._topics_in

    # ---- a batch: one decision a record --------------------------------------------------------

    async def handle(self, batch: list[ConsumedRecord], loop: Progress) -> None:
        now = time.time()
        parking = self.parking.batch(now)
        deferred: dict[tuple[str, int], int] = {}  # partition → the offset it was deferred at
        # Records decided without a request go out together: one produce and one wait for the
        # batch, not a task, a future and a wake-up each.
        handed: list[tuple[ConsumedRecord, HandOff]] = []
        held: list[tuple[float, ConsumedRecord, Delivery]] = []
        retaken: list[tuple[float, ConsumedRecord, int]] = []
        records = list(batch)
        try:
            for consumed in records:  # a parked batch's parts join the list as it is read
                decision = self._decide(consumed, now, parking, deferred)
                if isinstance(decision, HandOff):
                    handed.append((consumed, decision))
                elif isinstance(decision, Start):
                    self._start(consumed, decision, loop, now)
                elif isinstance(decision, Defer):
                    loop.defer(consumed, decision.until)
                    deferred.setdefault(consumed.key, consumed.offset)
                elif isinstance(decision, Hold):
                    held.append((decision.at, consumed, decision.record))
                elif isinstance(decision, Retake):
                    retaken.append((decision.at, consumed, decision.size))
                elif isinstance(decision, Split):
                    records += decision.parts
                elif isinstance(decision, InLane):
                    assert self._lanes is not None
                    self._lanes.add(consumed, loop)
        except SchemaRegistryUnavailable as exc:
            self._give_up(exc)  # nothing of this batch is finished: a restart delivers it
            return
        parking.close()
        if handed:
            self._spawn(self._hand_off_all(handed, loop))
        if held:  # one task for the batch's held records, not a task and a timer each
            self._spawn(self._start_when_due(held, loop))
        if retaken:
            self._spawn(self._retake_when_due(retaken, loop))

    def _decide(
        self,
        consumed: ConsumedRecord,
        now: float,
        parking: ParkingBatch,
        deferred: Mapping[tuple[str, int], int],
    ) -> Decision:
        """Steps 1 to 5 for one record (see the module's docstring)."""
        key = consumed.key
        if key in deferred and consumed.offset >= deferred[key]:
            return Skip()
        message = consumed.message
        schedule = schedule_of(message)
        if schedule is not None:
            due = schedule.not_before / 1000
            if due - now > HOLD_SECONDS:
                return Defer(due - HOLD_SECONDS)
            if schedule.parts and due > now:  # held undecoded, parked again whole if it must
                return self._retakes.decide(message.value(), due)
            if due <= now:
                if not schedule.parts:
                    waited(message, schedule.tier, schedule.destination, now)
                destination = self._follower.table.destinations.get(schedule.destination)
                window = schedule.window
                admitted = parking.admit(destination, window, undecoded=True)
                if isinstance(admitted, Park):  # parked again as it is (a batch: whole)
                    assert destination is not None
                    out = parking.park_message(destination, admitted, consumed, schedule.parts)
                    return HandOff(out, waits=True)
            if schedule.parts:
                headers = message.headers() or []  # a list on consumed records
                assert isinstance(headers, list)
                try:
                    parts = unpacked(message.value(), headers, message.timestamp())
                    return Split(consumed.split(parts))
                except ValueError as exc:
                    return self._hand_offs.undecodable(consumed, str(exc))
        elif key[0] == self._topics.deliveries:  # a fresh record: parked undecoded, if it must
            destination_id = key_destination(message.key())
            destination = self._follower.table.destinations.get(destination_id)
            lanes = self._lanes
            if lanes is not None and lanes.takes(message, destination, destination_id):
                return InLane()
            admission = parking.admit(destination, FRESH, undecoded=True)
            if isinstance(admission, Park):
                assert destination is not None
                out = parking.park_message(destination, admission, consumed)
                return HandOff(out, waits=True)
        try:
            record = delivery_from_record(self._codec.decode("Delivery", message.value()))
        except UndecodableRecord as exc:
            return self._hand_offs.undecodable(consumed, str(exc))
        if schedule is not None:
            record = schedule.applied_to(record)
        due = record.not_before / 1000
        if due > now:
            if due - now <= HOLD_SECONDS:
                return Hold(due, record)
            # Resume a little early, so the head is then held here and attempted on time.
            return Defer(due - HOLD_SECONDS)
        return self._admitted(consumed, record, now, parking)

    def _admitted(
        self, consumed: ConsumedRecord, record: Delivery, now: float, parking: ParkingBatch
    ) -> HandOff | Start:
        """Steps 4 and 5: a due, decoded record is suppressed, dead-lettered, parked or started.
        Raises ``SchemaRegistryUnavailable`` (the caller stops the worker)."""
        try:
            if self._deleted and suppressed_by(record, self._deleted) is not None:
                return self._hand_offs.suppressed(consumed, record, now)
            destination = self._follower.table.destinations.get(record.destination_id)
            admission = parking.admit(destination, window_of(record), undecoded=False)
            if isinstance(admission, Attempt):
                assert destination is not None
                stamped = record
                if record.first_attempt_at is None:
                    stamped = record.stamped(admission.first_attempt_at, admission.deadline)
                if destination.batch is not None:  # its batch takes one turn when it goes
                    return Start(stamped, destination, admission.final, None)
                # Its turn is taken now, so that the next record's admission counts it.
                turn = time.monotonic() + self._health.reserve(destination)
                return Start(stamped, destination, admission.final, turn)
            if isinstance(admission, Park):
                assert destination is not None
                return HandOff(parking.park_message(destination, admission, consumed), waits=True)
            if isinstance(admission, Reject):
                conclusion = Conclusion(
                    Outcome.DEAD_LETTER, record, admission.reason, admission.detail
                )
            else:
                assert isinstance(admission, Refused) and destination is not None
                refusals = self._health.refusals(destination) or []
                stamped = record
                if record.first_attempt_at is None:
                    stamped = record.stamped(admission.first_attempt_at, admission.deadline)
                conclusion = conclude(stamped, refusals, self._schedules(destination), now, now)
            return HandOff(*self._hand_offs.concluded(consumed, record, conclusion, now))
        except SchemaRegistryUnavailable:
            raise
        except Exception as exc:  # a bug must neither lose the record nor stall it
            return HandOff(self._hand_offs.internal_error(consumed, record, exc))

    async def _start_when_due(
        self, held: list[tuple[float, ConsumedRecord, Delivery]], loop: Progress
    ) -> None:
        """Start each held record at its due time; those due together are decided together
        (one hand-off)."""
        async for now, due in due_groups(held, itemgetter(0)):
            parking = self.parking.batch(now)
            handed: list[tuple[ConsumedRecord, HandOff]] = []
            try:
                for _, consumed, record in due:
                    if consumed.key[0] != self._topics.deliveries:  # it waited in a tier
                        waited(consumed.message, record.tier, record.destination_id, now)
                    decision = self._admitted(consumed, record, now, parking)
                    if isinstance(decision, Start):
                        self._start(consumed, decision, loop, now)
                    else:
                        handed.append((consumed, decision))
            except SchemaRegistryUnavailable as exc:
                self._give_up(exc)  # what is not finished is delivered after a restart
                return
            parking.close()
            if handed:
                self._spawn(self._hand_off_all(handed, loop))

    async def _retake_when_due(
        self, retaken: list[tuple[float, ConsumedRecord, int]], loop: Progress
    ) -> None:
        """Decide each retaken batch again at its due time, unless its partition went."""
        async for _, due in due_groups(retaken, itemgetter(0)):
            self._retakes.released(sum(size for *_, size in due))
            await self.handle([consumed for _, consumed, _ in due if loop.owns(consumed)], loop)

    async def _hand_off_all(
        self, handed: list[tuple[ConsumedRecord, HandOff]], loop: Progress
    ) -> None:
        """Hand records decided without a request off together: one produce, log included."""
        handed = [item for item in handed if loop.owns(item[0])]
        records = [record for _, hand_off in handed for record in hand_off.out]
        logged = [hand_off.logged for _, hand_off in handed if hand_off.logged is not None]
        if logged:  # only made when the log is on
            records += log_batch_records(self._codec, self._topics.log, logged)
        await self._producer.send_all_until_acked(records, self._stop)
        for consumed, _ in handed:
            loop.finish(consumed)

    # ---- an attempt ----------------------------------------------------------------------------

    def _start(self, consumed: ConsumedRecord, start: Start, loop: Progress, now: float) -> None:
        in_flight = self._in_flight
        destination = start.record.destination_id
        in_flight[destination] = in_flight.get(destination, 0) + 1
        if start.destination.batch is not None:
            self._batches.add(consumed, start, loop)
        else:
            self._spawn(self._attempt_in_flight(consumed, start, loop, now))

    async def _attempt_in_flight(
        self, consumed: ConsumedRecord, start: Start, loop: Progress, now: float
    ) -> None:
        """Make the request, conclude from its results, and hand the record off; counted in
        flight for its destination until then."""
        try:
            concluded = await self._concluded(consumed, start, now)
        finally:
            self._in_flight[start.record.destination_id] -= 1
        if concluded is not None:
            await self.finish(consumed, concluded.out, concluded.logged, loop)

    async def _concluded(
        self, consumed: ConsumedRecord, start: Start, now: float
    ) -> Concluded | None:
        """Make the request and conclude from its results (``None``: the worker stops)."""
        record, destination = start.record, start.destination
        try:
            trace, resends = trace_headers(consumed.message.headers()), len(record.attempts)
            results = await self._sender.attempt(
                destination,
                record.body,
                record.message_id,
                final=start.final,
                turn=start.turn,
                trace=trace,
                resends=resends,
            )
            finished = time.time()
            conclusion = self.conclusion(consumed, start, results, now, finished)
            if isinstance(conclusion, Concluded):
                return conclusion
            return self.handed(consumed, start, conclusion, results, now, finished)
        except SchemaRegistryUnavailable as exc:
            self._give_up(exc)  # the record stays unfinished: a restart delivers it
            return None
        except Exception as exc:  # a bug must neither lose the record nor stall the partition
            return self.failed(consumed, record, exc)

    def conclusion(
        self,
        consumed: ConsumedRecord,
        start: Start,
        results: list[UrlResult],
        now: float,
        finished: float,
    ) -> Conclusion | Concluded:
        """What the answers mean for the record (``Concluded``: it is parked again as it is)."""
        record, destination = start.record, start.destination
        if self._limits.parking and not start.final and all_refused(results):
            # Refused while it waited (a circuit opened, the endpoint fell silent, a pause was
            # heard): parked.
            out = self._parked_alone(consumed, record, destination)
            if out:
                return Concluded(out, None, True)
        return conclude(record, results, self._schedules(destination), now, finished)

    def handed(
        self,
        consumed: ConsumedRecord,
        start: Start,
        conclusion: Conclusion,
        results: list[UrlResult],
        now: float,
        finished: float,
        batch: str = "",
    ) -> Concluded:
        """The record's hand-off for ``conclusion``, counted and watched."""
        record, destination = start.record, start.destination
        counted = self._metrics(record.destination_id)
        if conclusion.requested:
            counted.attempt_seconds.observe(finished - now)
            self._watch.outcome(destination, conclusion.outcome, finished)
        self._watch.circuits(destination, self._health.open_circuits(destination), counted)
        out, logged = self._hand_offs.concluded(
            consumed, record, conclusion, finished, results, now, batch
        )
        return Concluded(out, logged, conclusion.outcome is Outcome.RETRY)

    def failed(self, consumed: ConsumedRecord, record: Delivery, exc: Exception) -> Concluded:
        return Concluded(self._hand_offs.internal_error(consumed, record, exc), None, False)

    async def finish(
        self, consumed: ConsumedRecord, out: list[Produced], logged: Logged, loop: Progress
    ) -> None:
        """Produce ``out``, then finish ``consumed`` once the log has ``logged`` (meanwhile it is
        concluded: out of the in-flight count); nothing if its partition was lost meanwhile."""
        if not loop.owns(consumed):
            return
        loop.concluded(consumed)
        if out:
            await self._producer.send_all_until_acked(out, self._stop)
        if logged is not None and self._log is not None:
            self._log.add(logged, loop.finish, consumed)  # finished once the log has it
        else:
            loop.finish(consumed)

    # ---- what a user's lane asks (ordered destinations) -----------------------------------------

    def decode(self, consumed: ConsumedRecord) -> Delivery | Concluded:
        """The delivery ``consumed`` carries, or its dead letter."""
        try:
            return delivery_from_record(self._codec.decode("Delivery", consumed.message.value()))
        except UndecodableRecord as exc:
            return Concluded(self._hand_offs.undecodable(consumed, str(exc)).out, None, False)

    async def decided(self, consumed: ConsumedRecord, record: Delivery) -> Concluded | None:
        """``record`` (due) admitted, and attempted if it may be (``None``: the worker stops)."""
        now = time.time()
        parking = self.parking.batch(now)
        try:
            decision = self._admitted(consumed, record, now, parking)
        except SchemaRegistryUnavailable as exc:
            self._give_up(exc)
            return None
        parking.close()
        if isinstance(decision, HandOff):
            return Concluded(decision.out, decision.logged, decision.waits)
        destination = decision.record.destination_id
        self._in_flight[destination] = self._in_flight.get(destination, 0) + 1
        try:
            return await self._concluded(consumed, decision, now)
        finally:
            self._in_flight[destination] -= 1

    def give_up(self, exc: BaseException) -> None:
        self._give_up(exc)

    def _parked_alone(
        self, consumed: ConsumedRecord, record: Delivery, destination: Destination
    ) -> list[Produced]:
        """``record`` parked by itself, as it was consumed, if its destination cannot take it
        now ([] if it can, or its final attempt is due)."""
        admission = self.parking.admit(destination, window_of(record), time.time())
        if not isinstance(admission, Park):
            return []
        plan = self.parking.plan(destination.id, admission, consumed.key)
        message = consumed.message
        return [plan.parked_record(message.key(), message.value())]

    # ---- the process around it ------------------------------------------------------------------

    def _give_up(self, exc: BaseException) -> None:
        """Not a record's fault (the Schema Registry is down): stop the worker, finish nothing."""
        if self.fatal is None:
            log.error("%s: stopping: %s", self.role, exc)
        self.fatal = exc
        self._stop.set()

    def assigned(self, keys: Sequence[tuple[str, int]]) -> None:
        """On the consumer's thread, before the partitions' records are read: their holds are
        restored (ordered destinations)."""
        if self._lanes is not None:
            self._lanes.holds.assigned([partition for _, partition in keys])
        self._owned.update(keys)
        self._share_changed()

    def released(self, keys: Sequence[tuple[str, int]]) -> None:
        # What is in flight finishes; the loop ignores records of released partitions.
        self._owned.difference_update(keys)
        self._health.pace.moved(keys)  # records parked there for a turn are another's now
        self._batches.released(set(keys))
        self._share_changed()
        if self._lanes is not None:
            self._lanes.holds.released([partition for _, partition in keys])

    def start(self) -> None:
        """Start what runs beside the records: the sweeps of holds and of ended rotations."""
        if self._lanes is not None:
            self._lanes.start_sweep(lambda: self._follower.table)
        if self.role == "deliver":
            self._spawn(self._watch.sweep_secrets(lambda: self._follower.table))
        self._spawn(self._batches.flush_on(self._stop))

    def holds_place(self, place: tuple[str, int]) -> bool:
        """Is ``place`` (topic, partition) held here?"""
        return place in self._owned

    def _share_changed(self) -> None:
        """Rate limits are the group's: this process sends its partitions' share of them."""
        self._health.set_share(self.role, len(self._owned) / self._partitions)

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        self._batches.flush()  # what is gathered goes now, as the attempts in flight finish
        if self._lanes is not None:
            await self._lanes.aclose()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        if self._log is not None:
            await self._log.aclose()
        await self._events.aclose()
