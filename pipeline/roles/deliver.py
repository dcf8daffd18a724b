"""The delivery handler: attempt a delivery record, then hand it on by outcome.

The same handler serves the ``deliver`` role (main topic) and the ``retry`` role (the tier topics);
a record due later (``notBefore``) waits, in memory or in its paused partition (step 0).

For each record:

0. Not due yet (``notBefore``): due within ``HOLD_SECONDS`` → held here until it is; later → the
   consumer loop pauses the partition until ``HOLD_SECONDS`` before it is due.
1. A deletion request for the call's user came after the call → suppressed: logged and counted,
   never attempted (``pipeline.core.suppression``). Then look the destination up in the live
   config (deleted → dead letter, disabled → dead letter).
2. Past the deadline → dead letter ``deadline_exceeded`` without an attempt.
3. POST to every webhook at once and combine the answers (``pipeline.core.outcomes.decide``).
4. Delivered → finished. Retry → the next tier with its ``notBefore`` (``RetrySchedule``), or the
   dead-letter topic when the deadline leaves no room. Permanent failure → dead letter.
5. The record is finished only after Kafka acknowledged the hand-off, and the delivery log's
   record of the attempt and its conclusion (``PIPELINE_LOG``): the log records of every hand-off
   made in one turn of the event loop go out together, in one Kafka record (``LogBatcher``). A
   record whose partition was revoked or lost meanwhile is not handed off at all: its new owner
   reads it again.

Steps 1, 2 and 4 are decided by ``pipeline.core.delivery_policy`` (pure); this module does the
I/O around them: decode, send, produce, finish, and the metrics.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any, NamedTuple

from pipeline.core.config import Destination
from pipeline.core.dead_letters import dead_letter
from pipeline.core.delivery_policy import Conclusion, Go, before_attempt, conclude, park
from pipeline.core.durations import format_duration
from pipeline.core.exceptions import UndecodableRecord
from pipeline.core.log_entries import conclusion_log_record, suppressed_log_record
from pipeline.core.outcomes import DeadLetterReason, Failure, Outcome, UrlResult
from pipeline.core.records import (
    DeadLetter,
    Delivery,
    dead_letter_to_record,
    delivery_from_record,
    delivery_to_record,
)
from pipeline.core.retry_schedule import RetrySchedule
from pipeline.core.routing import key_destination
from pipeline.core.settings import Settings
from pipeline.core.suppression import SUPPRESSED_REASON, suppressed_by
from pipeline.core.topics import Topics
from pipeline.http.sender import WebhookSender
from pipeline.kafka import parked_batches
from pipeline.kafka.codec import Codec, RecordCodec
from pipeline.kafka.config_store import ConfigFollower, destination_record
from pipeline.kafka.consumer_loop import ConsumerLoop, ConsumedRecord
from pipeline.kafka.errors import Headed
from pipeline.kafka.events import EventEmitter, EventKind
from pipeline.kafka.log_batches import (
    DeliveredArgs,
    LogBatcher,
    LogRecordValue,
    delivered_log_body,
    log_batch_records,
    writes_bodies,
    written,
)
from pipeline.kafka.producer import AsyncProducer, Outgoing
from pipeline.kafka.registry_codec import SchemaRegistryUnavailable
from pipeline.runtime import metrics

__all__ = ["DeliveryHandler", "HOLD_SECONDS", "letter_of"]
log = logging.getLogger("pipeline.deliver")

#: A ``LogRecord`` as the codec's dict (``pipeline.core.log_entries``).
LogRecordDict = dict[str, Any]
#: A record decided without a request: what to produce for it, and its log record.
Decided = tuple[ConsumedRecord, list[Outgoing | Headed], LogRecordValue | DeliveredArgs | None]

#: A record due within this many seconds is held in memory (it counts against the in-flight
#: limit) and attempted at its ``notBefore``; one due later pauses its partition until this long
#: before it is due. Pausing and resuming a partition costs a fetch round trip (50-500 ms), so
#: pausing alone made every retry that late.
HOLD_SECONDS = 1.0


class DeliveryHandler:
    def __init__(
        self,
        role: str,
        topics_in: Sequence[str],
        *,
        settings: Settings,
        topics: Topics,
        follower: ConfigFollower,
        producer: AsyncProducer,
        sender: WebhookSender,
        stop: asyncio.Event,
        codec: RecordCodec | None = None,
        schedule: RetrySchedule | None = None,
        deleted: Mapping[str, int] | None = None,
    ) -> None:
        """``deleted``: user id → time of the user's latest deletion request (epoch ms), kept
        up to date by a ``DeletionFollower``; the user's calls received before it are
        suppressed."""
        self.role = role
        self._topics_in = list(topics_in)
        self._topics = topics
        self._follower = follower
        self._producer = producer
        self._sender = sender
        self._stop = stop
        self._codec: RecordCodec = codec or Codec.default()
        #: Set when the pipeline cannot go on (the Schema Registry is down): the worker stops.
        self.fatal: BaseException | None = None
        self._schedule = schedule or RetrySchedule(settings.retry_delays, settings.retry_deadline)
        self._tasks: set[asyncio.Task[None]] = set()
        self._tiers = len(topics.retry)
        #: Records being attempted, per destination (its ``max_in_flight``).
        self._active: dict[str, int] = {}
        #: A destination whose first requests have been out for a moment without an answer
        #: (``WebhookSender.unproven``) takes at most this many of the worker's in-flight slots:
        #: as many requests as its host has connections, none waiting behind them. A new
        #: endpoint that hangs otherwise filled every slot with records waiting behind its first
        #: requests until it was found silent (``QUIET_MIN`` and a check later), and its healthy
        #: neighbours waited with them.
        self._unanswered_limit = settings.max_connections_per_host
        self._parking = settings.parking
        # With parking, ``_park`` has asked the circuits already: a record every circuit refuses
        # is parked (or is on its final attempt, which goes through them), so asking again per
        # record could only answer "none refuses".
        self._circuits = _asked_already if self._parking else sender.refused_by_circuits
        self._owned: set[tuple[str, int]] = set()
        self._events = EventEmitter(producer, self._codec, topics.events)
        self._failing_since: dict[str, float] = {}
        #: Destinations this process disabled, as they were then: once the config holds another
        #: version (re-enabled in the console or by apply), their failures count afresh.
        self._disabling: dict[str, Destination] = {}
        self._dead_letters: dict[str, int] = {}
        main = {topics.deliveries: settings.partitions}
        self._partitions = sum(main.get(topic, settings.retry_partitions) for topic in topics_in)
        self._schedules: dict[str, tuple[tuple[Any, ...], RetrySchedule]] = {}
        #: Per destination, the reopening of its circuits a parked record comes back for (to
        #: take the probe); its other records come back once the probe has answered.
        self._carriers: dict[str, float] = {}
        self._probe_answered = settings.delivery_timeout + PROBE_HEARD_AFTER
        metrics.configure_destination_labels(settings.metrics_max_destinations)
        self._metrics: dict[str, _DestinationMetrics] = {}
        self._bodies_direct = writes_bodies(self._codec)
        self._log = LogBatcher(producer, self._codec, topics.log, stop) if settings.log else None
        self._deleted: Mapping[str, int] = {} if deleted is None else deleted

    def topics(self) -> Sequence[str]:
        return self._topics_in

    async def handle(self, batch: list[ConsumedRecord], loop: ConsumerLoop) -> None:
        now = time.time()
        deferred: dict[tuple[str, int], int] = {}  # partition → the offset it was deferred at
        # Records decided without a request (undecodable, destination gone, deadline passed,
        # parked) are handed off together: one produce and one wait for the batch, not a task, a
        # future and a wake-up each. A hanging destination's records are parked once its circuit
        # is open (or it is silent), so they cost its healthy neighbours little.
        decided: list[Decided] = []
        held: list[tuple[float, ConsumedRecord, Delivery]] = []
        # Park plans by destination and window, made once for the batch: a plan to park holds
        # for the rest of it (nothing changes while it runs but in-flight counts, which grow);
        # a record not parked is decoded and asked again (``_start``).
        plans: _Plans = {}
        # After the decode, only plans to park are kept (in-flight counts grow as records start).
        parking_plans: _Plans = {}
        # What the batch parks, by plan: records parked together go out as one (a batch).
        parking = _Parking()
        destinations = self._follower.table.destinations
        fresh = self._topics.deliveries
        parts: list[ConsumedRecord] = []  # the records of parked batches come due, once they are opened
        try:
            for taken in itertools.chain(batch, parts):
                key = taken.key
                if key in deferred and taken.offset >= deferred[key]:
                    continue  # the loop sought back; these come again after the pause
                parked = _parked(taken)  # read even with parking off: the header rules
                if parked is not None:  # passed over, or parked again, without a decode
                    not_before = parked.not_before / 1000
                    if not_before - now > HOLD_SECONDS:
                        loop.defer(taken, not_before - HOLD_SECONDS)
                        deferred.setdefault(key, taken.offset)
                        continue
                    if parked.parts and not_before > now:
                        # A batch is not held, decoded, in memory: it waits undecoded, its
                        # partition paused, and is then parked again whole if it must be.
                        loop.defer(taken, not_before)
                        deferred.setdefault(key, taken.offset)
                        continue
                    if not_before <= now and self._parking:
                        destination = destinations.get(parked.destination)
                        if self._park(taken, parked, destination, now, decided, plans, parking):
                            continue  # parked again, still undecoded
                    if parked.parts:  # come due, not parked again: each record goes its way
                        message = taken.message
                        headers = message.headers() or []  # a list on consumed records
                        assert isinstance(headers, list)
                        try:
                            parts += taken.split(parked_batches.unpacked(message.value(), headers))
                        except ValueError as exc:
                            letter = letter_of(DeadLetterReason.UNDECODABLE, taken, detail=str(exc))
                            decided.append((taken, [self._dlq(letter)], None))
                        continue
                elif key[0] == fresh and self._parking:  # parked before its decode, if it must
                    destination = destinations.get(key_destination(taken.message.key()))
                    if self._park(taken, _FRESH, destination, now, decided, plans, parking):
                        continue
                try:
                    record = delivery_from_record(
                        self._codec.decode("Delivery", taken.message.value())
                    )
                except UndecodableRecord as exc:
                    letter = letter_of(DeadLetterReason.UNDECODABLE, taken, detail=str(exc))
                    decided.append((taken, [self._dlq(letter)], None))
                    continue
                if parked is not None:  # the value is as it was first parked: the header rules
                    record = parked.applied_to(record)
                not_before = record.not_before / 1000
                if not_before > now:
                    if not_before - now <= HOLD_SECONDS:
                        held.append((not_before, taken, record))
                        continue
                    # Pause the partition; resume a little early so the head is then held here
                    # and attempted on time (a resume costs a fetch round trip).
                    loop.defer(taken, not_before - HOLD_SECONDS)
                    deferred.setdefault(key, taken.offset)
                    continue
                self._start(taken, record, loop, now, decided, parking_plans, parking)
        except SchemaRegistryUnavailable as exc:
            self._give_up(exc)  # nothing of this batch is finished: a restart delivers it
            return
        parking.close()
        if decided:
            self._spawn(self._hand_off_all(decided, loop))
        if held:  # one task for the batch's held records, not a task and a timer each
            self._spawn(self._start_when_due(held, loop))

    def _start(
        self,
        taken: ConsumedRecord,
        record: Delivery,
        loop: ConsumerLoop,
        now: float,
        decided: list[Decided],
        plans: _Plans | None = None,
        parking: _Parking | None = None,
    ) -> None:
        """A due record: decided without a request (appended to ``decided``), or a request's
        task started. ``plans``: the batch's plans to park (only those: a record that is not
        parked may start, and the next one asks again); ``parking``: the batch's parked records
        (see ``_park``). Raises ``SchemaRegistryUnavailable`` (the caller stops the worker)."""
        try:
            if self._deleted and suppressed_by(record, self._deleted) is not None:
                decided.append(self._suppressed(taken, record, now))
                return
            destination = self._follower.table.destinations.get(record.destination_id)
            if self._parking and self._park(
                taken, record, destination, now, decided, plans, parking, keep_none=False
            ):
                return
            before = before_attempt(
                record,
                destination,
                self._schedule_of(destination),
                now,
                self._circuits,
            )
            if isinstance(before, Go):
                active = self._active
                active[record.destination_id] = active.get(record.destination_id, 0) + 1
                self._spawn(self._process(taken, before, loop, now))
                return
            out, logged = self._hand_off(taken, record, before, now)
        except SchemaRegistryUnavailable:
            raise
        except Exception as exc:  # a bug must neither lose the record nor stall it
            out, logged = self._internal_error(taken, record, exc), None
        decided.append((taken, list(out), logged))

    async def _start_when_due(
        self, held: list[tuple[float, ConsumedRecord, Delivery]], loop: ConsumerLoop
    ) -> None:
        """Start each held record at its ``notBefore``, never before; those due together are
        decided together (one hand-off)."""
        held.sort(key=itemgetter(0))  # by due time; stable: a partition's records keep their order
        index = 0
        while index < len(held):
            while (wait := held[index][0] - time.time()) > 0:  # never early, whatever the timer
                await asyncio.sleep(wait)
            now = time.time()
            decided: list[Decided] = []
            plans: _Plans = {}
            parking = _Parking()
            try:
                while index < len(held) and held[index][0] <= now:
                    _, taken, record = held[index]
                    index += 1
                    self._start(taken, record, loop, now, decided, plans, parking)
            except SchemaRegistryUnavailable as exc:
                self._give_up(exc)  # what is not finished is delivered after a restart
                return
            parking.close()
            if decided:
                self._spawn(self._hand_off_all(decided, loop))

    def _suppressed(self, taken: ConsumedRecord, record: Delivery, now: float) -> Decided:
        """A record a deletion request suppresses: nothing to produce but its log record."""
        self._metrics_of(record.destination_id).suppressed.inc()
        logged = None
        if self._log is not None:
            logged = suppressed_log_record(record, int(now * 1000), SUPPRESSED_REASON)
        return (taken, [], logged)

    def _give_up(self, exc: BaseException) -> None:
        """Not a record's fault (the Schema Registry is down): stop the worker, finish nothing."""
        if self.fatal is None:
            log.error("%s: stopping: %s", self.role, exc)
        self.fatal = exc
        self._stop.set()

    def assigned(self, keys: Sequence[tuple[str, int]]) -> None:
        self._owned.update(keys)
        self._share_changed()

    def released(self, keys: Sequence[tuple[str, int]]) -> None:
        # What is in flight finishes; the loop ignores records of released partitions.
        self._owned.difference_update(keys)
        self._share_changed()

    def _share_changed(self) -> None:
        """Rate limits are the group's: this process sends its partitions' share of them."""
        self._sender.set_share(self.role, len(self._owned) / self._partitions)

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        if self._log is not None:
            await self._log.aclose()
        await self._events.aclose()

    # ---- operational events and auto-disable ----------------------------------------------------

    def _circuits_seen(self, destination: Destination, counted: _DestinationMetrics) -> None:
        """The gauge of open circuits, and an event when it leaves or returns to zero."""
        now_open = self._sender.open_circuits(destination)
        before = counted.circuits(now_open)
        if now_open and before <= 0:
            self._events.emit(
                EventKind.CIRCUIT_OPENED,
                destination.id,
                f"{now_open} of {len(destination.webhooks)} webhooks failed repeatedly; "
                "their records are parked until a probe succeeds",
                open=now_open,
                webhooks=len(destination.webhooks),
            )
        elif not now_open and before > 0:
            self._events.emit(
                EventKind.CIRCUIT_CLOSED, destination.id, "every webhook answers again", open=0
            )

    def _failing(self, destination: Destination, outcome: Outcome, at: float) -> None:
        """Auto-disable (``disable_after``): a destination whose every attempt failed for that
        long is disabled in the config; its pending records are then dead-lettered
        ``destination_disabled`` (replayable) as they come up."""
        assert destination.disable_after is not None
        if outcome is Outcome.DELIVERED:
            self._failing_since.pop(destination.id, None)
            return
        disabled_from = self._disabling.get(destination.id)
        if disabled_from is not None:
            if destination == disabled_from:
                return  # disabled already; the config does not say so yet
            del self._disabling[destination.id]  # enabled again since: a new run of failures
            self._failing_since[destination.id] = at
        since = self._failing_since.setdefault(destination.id, at)
        if at - since < destination.disable_after:
            return
        self._disabling[destination.id] = destination
        reason = (
            f"every attempt failed for {format_duration(at - since)} "
            f"(disable_after {format_duration(destination.disable_after)})"
        )
        disabled = destination.model_copy(
            update={"enabled": False, "disabled_reason": reason, "disabled_at": int(at * 1000)}
        )
        self._spawn(self._disable(disabled, reason))

    async def _disable(self, disabled: Destination, reason: str) -> None:
        record = destination_record(self._topics.config, self._codec, disabled)
        await self._producer.send_all_until_acked([record], self._stop)
        log.warning("%s: destination %s disabled: %s", self.role, disabled.id, reason)
        self._events.emit(EventKind.DESTINATION_DISABLED, disabled.id, reason, reason=reason)

    def _dead_lettered(self, destination: str) -> None:
        """An event each time a destination's dead letters here reach 1, 10, 100, ..."""
        count = self._dead_letters[destination] = self._dead_letters.get(destination, 0) + 1
        if count == 10 ** (len(str(count)) - 1):
            self._events.emit(
                EventKind.DEAD_LETTERS,
                destination,
                f"{count} dead letter{'s' if count > 1 else ''} since this worker started",
                count=count,
            )

    # ---- parking -------------------------------------------------------------------------------

    def _park_reason(self, destination: Destination | None) -> tuple[str, float] | None:
        """Why (and for how many seconds) records for ``destination`` should wait rather than be
        attempted now: its ``max_in_flight`` taken, every webhook's circuit open, every webhook
        silent (requests out, none back lately), as many records out as its host has connections
        while its first requests go unanswered (``_unanswered_limit``), or its turn under
        ``rate_limit`` far off."""
        if destination is None or not destination.enabled:
            return None  # dead-lettered, which needs the record
        active = self._active.get(destination.id, 0)
        limit = destination.max_in_flight
        if limit is not None and active >= limit:
            return ("in_flight", IN_FLIGHT_WAIT)
        reopens_in = self._sender.reopens_in(destination)
        if reopens_in is not None:
            return ("circuit_open", max(MIN_PARK_WAIT, reopens_in))
        silence = self._sender.silence_ends_in(destination)
        if silence is not None:  # until its requests out have timed out
            return ("silent", max(SILENT_WAIT, silence))
        if active >= self._unanswered_limit and self._sender.unproven(destination):
            return ("unanswered", IN_FLIGHT_WAIT)
        rate_wait = self._sender.rate_wait(destination)
        if rate_wait > RATE_WAIT_IN_FLIGHT:
            return ("rate_limited", rate_wait)
        return None

    def _park(
        self,
        taken: ConsumedRecord,
        window: Delivery | _ParkHeader | _Window,
        destination: Destination | None,
        now: float,
        decided: list[Decided],
        plans: _Plans | None = None,
        parking: _Parking | None = None,
        *,
        keep_none: bool = True,
    ) -> bool:
        """Park ``taken`` as it is (a decoded record, or a parked one come due, still undecoded,
        perhaps a batch) if its destination cannot take it now; ``window``: the record, or its
        park header, whose first attempt and deadline bound the wait (its final attempt is not
        parked). ``plans``: the batch's plans so far, by destination and window (records parked
        together come due together, with one window: a hanging destination's backlog, 5.7 →
        0.7 µs a record), and whether ``plans`` keeps an answer not to park (see
        ``_park_plan``); ``parking``: the batch's parked records, which go out as one record per
        plan and partition (``_Parking``)."""
        first, deadline = window.first_attempt_at, window.deadline
        plan = self._park_plan(destination, first, deadline, now, plans=plans, keep_none=keep_none)
        if plan is None:
            return False
        message = taken.message
        parts = window.parts if isinstance(window, _ParkHeader) else 0
        out: list[Outgoing | Headed]
        if parts > 1 and not plan.shared:
            out = self._carried_by_one(plan, message, parts, destination, first, deadline, now)
        elif parking is None:
            out = [plan.parked_record(message.key(), message.value(), parts)]
        else:
            out = parking.add(plan, taken.key, message.key(), message.value(), parts)
        decided.append((taken, out, None))
        return True

    def _carried_by_one(
        self,
        plan: _ParkPlan,
        message: Any,
        parts: int,
        destination: Destination | None,
        first: int | None,
        deadline: int | None,
        now: float,
    ) -> list[Outgoing | Headed]:
        """A parked batch come due and parked again as the probe's carrier (``plan``): its first
        record carries the probe, alone; the others go on together, back once the probe has
        answered, as the other records of the reopening do. A whole batch carrying it came back
        to a circuit ready for its probe, so it was opened and every record started: one took
        the probe, and the others were refused and parked one by one (48 of them in a `/tmp`
        harness of a hang, once a cool-down)."""
        try:
            key, value, rest = parked_batches.split_first(message.value())
            next_key, next_value, after = parked_batches.split_first(rest)
        except ValueError:  # it will not read back: parked as it is, dead-lettered when due
            return [plan.parked_record(message.key(), message.value(), parts)]
        others = self._park_plan(destination, first, deadline, now)
        if others is None or not others.shared:
            return [plan.parked_record(message.key(), message.value(), parts)]
        return [
            plan.parked_record(key, value),
            others.parked_record(next_key, rest, parts - 1)
            if after
            else others.parked_record(next_key, next_value),
        ]

    def parked_at_routing(self, key: bytes | None, value: bytes, destination: str) -> Headed | None:
        """The router's fresh record ``value`` for ``destination``, parked straight in a retry tier
        if this process would park it on arrival because its destination's endpoints are down
        or hang (every circuit open: a run of failures; every webhook silent: requests out and
        none back; unproven, its first requests unanswered, with its host's connections' worth
        of records out); ``None``: it goes to ``deliveries``.

        One produce instead of a produce, a consume, a decode and a produce again: a hanging
        or failing neighbour costs a healthy destination that much less (``make bench`` section
        3, a hang's first seconds: 0.69 → 0.81 of the healthy destination alone, for silence).
        Unproven is asked here too: silence takes a quarter of a second to tell, in which the
        router, running ahead, sent a new hanging destination's records to ``deliveries`` by the
        thousand for the deliver role to park (a median of 3,700-4,200 of 10,000 in section 3's
        first run; 1,600-2,300 with it, ``docs/decisions.md``). A destination at its in-flight
        limit or over its rate is decided on arrival, where the records ahead of it have been
        counted: the router runs ahead of delivery."""
        parker = self.routing_parker()
        if not parker(key, value, destination):
            return None
        (record,) = parker.records()
        return record

    def routing_parker(self) -> RoutingParker:
        """``parked_at_routing`` for the records of one batch, which the router routes without
        yielding: nothing the decision depends on changes meanwhile (bar the clock, by
        milliseconds), so each destination's is made for its first record and kept for the
        rest (a hanging destination's fresh record: 6.1 → 0.6 µs, in a micro-benchmark), and
        the records it parks go out as one (``RoutingParker.records``)."""
        return RoutingParker(self if self._parking else None, time.time())

    def _park_plan(
        self,
        destination: Destination | None,
        first_attempt_at: int | None,
        deadline: int | None,
        now: float,
        reasons: frozenset[str] | None = None,
        plans: _Plans | None = None,
        *,
        keep_none: bool = True,
    ) -> _ParkPlan | None:
        """Where a record of ``destination`` (its retry window starting at ``first_attempt_at``,
        ending at ``deadline``; ``None``: a fresh record) waits if the destination cannot take it
        now (for one of ``reasons``, when given), and the count of such records; ``None`` when
        it can, or when its final attempt is due. ``plans``: the batch's plans so far, by
        destination and window, which the plan made here joins if it holds for the others (and
        an answer not to park, with ``keep_none``: for records that start no request)."""
        if plans is not None:
            key = (None if destination is None else destination.id, first_attempt_at, deadline)
            if key in plans:
                return plans[key]
            made = self._park_plan(destination, first_attempt_at, deadline, now, reasons)
            if _holds_for_batch(made, keep_none):
                plans[key] = made
            return made
        why = self._park_reason(destination)
        if why is None or (reasons is not None and why[0] not in reasons):
            return None
        assert destination is not None
        reason, wait = why
        shared = True
        if reason == "circuit_open":
            # One record comes back when the circuits may be tried again, to take the probe
            # (unless a fresh record takes it first); the others once its answer is known. Parked
            # records then come back once a cool-down, not twice (again during the probe).
            reopens_at = now + wait
            if abs(self._carriers.get(destination.id, 0.0) - reopens_at) > 1.0:
                self._carriers[destination.id] = reopens_at
                shared = False
            else:
                wait += self._probe_answered
        plan = park(first_attempt_at, deadline, self._schedule_of(destination), now, wait)
        if plan is None:
            return None
        header = _ParkHeader(
            plan.tier, plan.not_before, plan.first_attempt_at, plan.deadline, destination.id
        )
        return _ParkPlan(
            self._topics.retry[plan.tier],
            [(PARK_HEADER, header.encoded())],
            self._metrics_of(destination.id).parked[reason],
            shared,
        )

    def _schedule_of(self, destination: Destination | None) -> RetrySchedule:
        """The destination's retry schedule: its own ``retry`` policy over the global one."""
        policy = destination.retry if destination is not None else None
        if policy is None:
            return self._schedule
        assert destination is not None
        key = (tuple(policy.delays or ()), policy.deadline)
        known = self._schedules.get(destination.id)
        if known is None or known[0] != key:
            schedule = self._schedule.for_policy(policy.delays, policy.deadline)
            known = self._schedules[destination.id] = (key, schedule)
        return known[1]

    def _metrics_of(self, destination: str) -> _DestinationMetrics:
        found = self._metrics.get(destination)
        if found is None:
            found = self._metrics[destination] = _DestinationMetrics(destination, self._tiers)
        return found

    def _dlq(self, letter: DeadLetter) -> Outgoing:
        destination = letter.delivery.destination_id if letter.delivery is not None else None
        if destination is None:
            label = metrics.UNKNOWN_DESTINATION
        else:
            label = metrics.destination_label(destination)
            self._dead_lettered(destination)
        metrics.DEAD_LETTERS.labels(label, letter.reason).inc()
        key = letter.delivery.destination_id.encode() if letter.delivery is not None else None
        return (
            self._topics.dlq,
            key or None,
            self._codec.encode("DeadLetter", dead_letter_to_record(letter)),
        )

    async def _hand_off_all(self, decided: list[Decided], loop: ConsumerLoop) -> None:
        """Hand records decided without a request off together: one produce, log included."""
        decided = [item for item in decided if loop.owns(item[0])]
        records = [record for _, out, _ in decided for record in out]
        logged = [record for _, _, record in decided if record is not None]
        if logged:  # only made when the log is on
            bodies = written(logged, delivered_log_body)
            records += log_batch_records(self._codec, self._topics.log, bodies)
        await self._producer.send_all_until_acked(records, self._stop)
        for taken, _, _ in decided:
            loop.finish(taken)

    def _internal_error(self, taken: ConsumedRecord, record: Delivery, exc: Exception) -> list[Outgoing]:
        """The dead letter of a record a bug stopped (called in the ``except`` block)."""
        log.exception("%s: unexpected error on %s", self.role, record.message_id)
        letter = letter_of(
            DeadLetterReason.INTERNAL_ERROR,
            taken,
            delivery=record,
            detail=f"{type(exc).__name__}: {exc}",
        )
        return [self._dlq(letter)]

    async def _process(self, taken: ConsumedRecord, go: Go, loop: ConsumerLoop, now: float) -> None:
        """Steps 3 to 5 for a record ``before_attempt`` (at ``now``) cleared for a request."""
        try:
            await self._attempt(taken, go, loop, now)
        finally:
            self._active[go.delivery.destination_id] -= 1

    async def _attempt(self, taken: ConsumedRecord, go: Go, loop: ConsumerLoop, now: float) -> None:
        record = go.delivery
        try:
            results = await self._sender.attempt(
                go.destination, record.body, record.message_id, final=go.final
            )
            if self._parking and not go.final and _all_refused(results):
                # Refused while it waited (a circuit opened, the endpoint fell silent): parked.
                parked: list[Decided] = []
                if self._park(taken, record, go.destination, time.time(), parked):
                    if loop.owns(taken):
                        await self._producer.send_all_until_acked(parked[0][1], self._stop)
                        loop.finish(taken)
                    return
            finished = time.time()
            conclusion = conclude(record, results, self._schedule_of(go.destination), now, finished)
            counted = self._metrics_of(record.destination_id)
            if conclusion.requested:
                counted.attempt_seconds.observe(finished - now)
            self._circuits_seen(go.destination, counted)
            if conclusion.requested and go.destination.disable_after is not None:
                self._failing(go.destination, conclusion.outcome, finished)
            out, logged = self._hand_off(taken, record, conclusion, finished, results, now)
        except SchemaRegistryUnavailable as exc:
            self._give_up(exc)  # the record stays unfinished: a restart delivers it
            return
        except Exception as exc:  # a bug must neither lose the record nor stall the partition
            out, logged = self._internal_error(taken, record, exc), None
        if not loop.owns(taken):
            return  # the partition was lost meanwhile: its new owner hands the record off
        if out:
            await self._producer.send_all_until_acked(out, self._stop)
        if logged is not None and self._log is not None:
            self._log.add(logged, loop.finish, taken)  # finished once the log has it
        else:
            loop.finish(taken)

    def _hand_off(
        self,
        taken: ConsumedRecord,
        before: Delivery,
        conclusion: Conclusion,
        finished: float,
        results: Sequence[UrlResult] = (),
        started: float = 0.0,
    ) -> tuple[list[Outgoing], LogRecordValue | DeliveredArgs | None]:
        """The records to produce for ``conclusion`` (reached at ``finished``; ``results`` of the
        request begun at ``started``, if one was made) and its log record, and its metrics."""
        outcome, record = conclusion.outcome, conclusion.delivery
        counted = self._metrics_of(before.destination_id)
        counted.outcomes[outcome].inc()
        logged: LogRecordValue | DeliveredArgs | None = None
        if self._log is not None:
            if outcome is Outcome.DELIVERED and self._bodies_direct:
                logged = (before, list(results), started, finished)  # written with its batch
            else:
                logged = self._log_record(before, conclusion, finished, results, started)
        if outcome is Outcome.DELIVERED:
            if not record.replays:  # a replay's call arrived long ago: not the pipeline's latency
                metrics.END_TO_END_SECONDS.observe(max(0.0, finished - record.received_at / 1000))
            return [], logged  # a delivered record is not kept, so neither is its attempt history
        if outcome is Outcome.RETRY:
            counted.retries[record.tier].inc()
            value = self._codec.encode("Delivery", delivery_to_record(record))
            return [(self._topics.retry[record.tier], taken.message.key(), value)], logged
        assert conclusion.reason is not None
        letter = letter_of(conclusion.reason, taken, delivery=record, detail=conclusion.detail)
        return [self._dlq(letter)], logged

    def _log_record(
        self,
        before: Delivery,
        conclusion: Conclusion,
        finished: float,
        results: Sequence[UrlResult],
        started: float,
    ) -> LogRecordDict:
        """The delivery log's record of this attempt (if a request was made) and conclusion."""
        reason = conclusion.reason or ("" if conclusion.requested else "circuit_open")
        return conclusion_log_record(
            before,
            conclusion.outcome,
            conclusion.delivery,
            finished,
            results=results,
            started=started,
            reason=str(reason) if conclusion.outcome is not Outcome.DELIVERED else "",
        )


#: The Kafka header of a parked record: where and until when it waits, and its deadline's clock.
PARK_HEADER = "pipeline-park"
#: A destination at its ``max_in_flight`` (or its unanswered limit): its next records wait this
#: long in the first tier.
IN_FLIGHT_WAIT = 1.0
#: Parked records wait at least this long (a circuit about to half-open).
MIN_PARK_WAIT = 1.0
#: A destination over its rate limit: a record that would wait longer than this for its turn is
#: parked rather than held in an in-flight slot.
RATE_WAIT_IN_FLIGHT = 1.0
#: A destination whose webhooks are saturated and silent (``WebhookSender.silent``): its next
#: records wait until its requests out have timed out (``WebhookSender.silence_ends_in``), this
#: at least.
SILENT_WAIT = 1.0
#: A circuit's probe has answered (or timed out) this long after the delivery timeout, at most:
#: when the records parked while its circuit is open come back, but one (``_park_plan``).
PROBE_HEARD_AFTER = 0.5
#: Why the router parks a fresh record itself (``DeliveryHandler.parked_at_routing``).
_AT_ROUTING = frozenset({"circuit_open", "silent", "unanswered"})


class _Window(NamedTuple):
    """A record's retry window, as ``_park`` reads it."""

    first_attempt_at: int | None
    deadline: int | None


#: The window of a record on ``deliveries``, not attempted yet: it starts when it is parked.
_FRESH = _Window(None, None)


class _ParkHeader(NamedTuple):
    """``PARK_HEADER``'s value: ``tier not_before first_attempt_at deadline destination``; and
    ``parts``: how many records the parked record carries (``parked_batches.PARTS_HEADER``), 0
    for a record alone."""

    tier: int
    not_before: int
    first_attempt_at: int
    deadline: int
    destination: str
    parts: int = 0

    def encoded(self) -> bytes:
        return (
            f"{self.tier} {self.not_before} {self.first_attempt_at} {self.deadline} ".encode()
            + (self.destination.encode())
        )

    def applied_to(self, record: Delivery) -> Delivery:
        """The record as parking left it (its value is as it was when first parked)."""
        return record._replace(
            tier=self.tier,
            not_before=self.not_before,
            first_attempt_at=record.first_attempt_at or self.first_attempt_at,
            deadline=record.deadline or self.deadline,
        )


class _ParkPlan(NamedTuple):
    """Where a parked record goes, its header, and the count of records parked for its reason;
    ``shared``: the plan holds for the batch's other records of its destination and window (not
    for the record that comes back for the probe)."""

    topic: str
    headers: list[tuple[str, str | bytes | None]]
    parked: Any
    shared: bool

    def parked_record(self, key: bytes | None, value: bytes | None, parts: int = 0) -> Headed:
        """The record (``key``, ``value``; a batch of ``parts`` records, if any) parked by this
        plan, counted: the same bytes, the plan in a header."""
        self.parked.inc(parts or 1)
        return (self.topic, key, value, self._headers_of(parts) if parts else self.headers)

    def batch(self, items: Sequence[tuple[bytes | None, bytes | None, int]]) -> Headed:
        """One record carrying ``items`` (key, value, parts: 0 for a record alone), counted."""
        if len(items) == 1:
            return self.parked_record(*items[0])
        parts = sum(count or 1 for _, _, count in items)
        self.parked.inc(parts)
        value = parked_batches.packed(items)
        return (self.topic, items[0][0], value, self._headers_of(parts))

    def _headers_of(self, parts: int) -> list[tuple[str, str | bytes | None]]:
        return [*self.headers, (parked_batches.PARTS_HEADER, b"%d" % parts)]


def _holds_for_batch(plan: _ParkPlan | None, keep_none: bool = True) -> bool:
    """Does an answer of ``_park_plan`` hold for the rest of a batch's records of its destination
    and window? A plan to park does unless it is the probe's carrier's (only the first record
    carries it); an answer not to park does where records start no request (``keep_none``), as
    in-flight counts only grow within a batch."""
    return (plan is None and keep_none) or (plan is not None and plan.shared)


#: ``RoutingParker``'s answer for a destination it has not asked about yet in its batch.
_UNASKED: Any = object()
#: A batch's park plans so far, by destination and retry window (``DeliveryHandler._park_plan``).
_Plans = dict[tuple[str | None, int | None, int | None], _ParkPlan | None]


class _Group:
    """Records parked by one plan from one partition (``size``: their bytes in a batch);
    ``out`` gets the record carrying them."""

    __slots__ = ("plan", "out", "items", "size")

    def __init__(self, plan: _ParkPlan) -> None:
        self.plan = plan
        self.out: list[Outgoing | Headed] = []
        self.items: list[tuple[bytes | None, bytes | None, int]] = []
        self.size = 0


class _Parking:
    """The records one batch parks. Those of a shared plan (one destination and window) from one
    partition go out as one Kafka record carrying them all (``parked_batches``), up to
    ``parked_batches.MAX_BYTES``: the first one's hand-off produces it (``close``), the others'
    produce nothing, and all are finished when the batch's records are acknowledged. A record
    parked by a plan of its own (the probe's carrier) goes alone."""

    __slots__ = ("_groups", "_all")

    def __init__(self) -> None:
        self._groups: dict[tuple[int, object], _Group] = {}
        self._all: list[_Group] = []

    def add(
        self,
        plan: _ParkPlan,
        source: object,
        key: bytes | None,
        value: bytes | None,
        parts: int = 0,
    ) -> list[Outgoing | Headed]:
        """Park (``key``, ``value``: a batch of ``parts``, if any) by ``plan``; what its hand-off
        produces (a list ``close`` fills in for the first record of a group)."""
        if not plan.shared:
            return [plan.parked_record(key, value, parts)]
        size = parked_batches.entry_size(key, value)
        group = self._groups.get((id(plan), source))
        if group is None or group.size + size > parked_batches.MAX_BYTES:
            group = _Group(plan)
            self._groups[(id(plan), source)] = group
            self._all.append(group)
            out = group.out
        else:
            out = []
        group.items.append((key, value, parts))
        group.size += size
        return out

    def close(self) -> list[Headed]:
        """Each group's record, into its first record's hand-off; returned too (the batched
        records of a group each)."""
        made = [group.plan.batch(group.items) for group in self._all]
        for group, record in zip(self._all, made, strict=True):
            group.out.append(record)
        self._all.clear()
        self._groups.clear()
        return made


class RoutingParker:
    """Asked by the router of each fresh delivery record of one batch: is it parked? (Then it
    is kept here, and goes out with the others in ``records``: one record per destination and
    window.) ``handler`` ``None``: parking is off, nothing is parked."""

    __slots__ = ("_handler", "_now", "_destinations", "_plans", "_parking", "_alone", "parked")

    def __init__(self, handler: DeliveryHandler | None, now: float) -> None:
        self._handler = handler
        self._now = now
        self._destinations = {} if handler is None else handler._follower.table.destinations
        #: By destination: a fresh record's window is its destination's (none started yet).
        self._plans: dict[str, _ParkPlan | None] = {}
        self._parking = _Parking()
        self._alone: list[Headed] = []  # the probe's carriers
        self.parked = 0

    def __call__(self, key: bytes | None, value: bytes, destination: str) -> bool:
        handler = self._handler
        if handler is None:
            return False
        plan = self._plans.get(destination, _UNASKED)
        if plan is _UNASKED:  # asked once a batch, as ``_park_plan`` keeps plans (a destination
            # of 50 asked per call: 0.5 µs each, a key and a call fewer than through ``plans``)
            found = self._destinations.get(destination)
            plan = handler._park_plan(found, None, None, self._now, _AT_ROUTING)
            if _holds_for_batch(plan):
                self._plans[destination] = plan
        if plan is None:
            return False
        if plan.shared:
            self._parking.add(plan, None, key, value)  # its record comes from ``close``
        else:
            self._alone.append(plan.parked_record(key, value))
        self.parked += 1
        return True

    def records(self) -> list[Headed]:
        """The parked records, batched (once, when the batch is routed)."""
        return [*self._alone, *self._parking.close()]


def _asked_already(destination: Destination) -> None:
    """The circuits' answer ``before_attempt`` gets when parking asked them first (see above)."""
    return None


def _all_refused(results: Sequence[UrlResult]) -> bool:
    """No request was made: every webhook's circuit refused it, or it fell silent."""
    return all(result.failure is Failure.CIRCUIT_OPEN for result in results)


def _parked(taken: ConsumedRecord) -> _ParkHeader | None:
    """The park header of a record, if it has one (a record of ours without headers: ``None``)."""
    headers = taken.message.headers()  # a list of (name, bytes) on consumed records
    if not headers:
        return None
    found = None
    parts = 0
    for header in headers:
        name, value = header[0], header[1]
        if name == PARK_HEADER and isinstance(value, bytes):
            try:
                tier, not_before, first, deadline, destination = value.split(b" ", 4)
                found = _ParkHeader(
                    int(tier), int(not_before), int(first), int(deadline), destination.decode()
                )
            except ValueError:
                return None  # not ours: the value decides
        elif name == parked_batches.PARTS_HEADER and isinstance(value, bytes) and value.isdigit():
            parts = int(value)
    if found is not None and parts:
        return found._replace(parts=parts)
    return found


class _DestinationMetrics:
    """One destination's metric series (``destination`` label: its id, or ``other`` past
    ``PIPELINE_METRICS_MAX_DESTINATIONS``), looked up once."""

    __slots__ = (
        "outcomes",
        "attempt_seconds",
        "retries",
        "parked",
        "suppressed",
        "_circuits",
        "_open",
    )

    def __init__(self, destination: str, tiers: int) -> None:
        label = metrics.destination_label(destination)
        self.outcomes = {o: metrics.DELIVERIES.labels(label, o.value) for o in Outcome}
        self.attempt_seconds = metrics.DELIVERY_ATTEMPT_SECONDS.labels(label)
        self.retries = [metrics.RETRIES.labels(label, str(t)) for t in range(tiers)]
        self.parked = {
            r: metrics.PARKED.labels(label, r)
            for r in ("circuit_open", "in_flight", "unanswered", "silent", "rate_limited")
        }
        self.suppressed = metrics.SUPPRESSED.labels(label)
        self._circuits = metrics.CIRCUITS_OPEN.labels(label)
        self._open = -1

    def circuits(self, open_now: int) -> int:
        """Set the gauge; returns the value before (-1: none yet)."""
        before = self._open
        if open_now != before:  # the gauge's lock only on a change
            self._open = open_now
            self._circuits.set(open_now)
        return before


def letter_of(
    reason: str, taken: ConsumedRecord, *, delivery: Delivery | None = None, detail: str = ""
) -> DeadLetter:
    """The dead letter of the Kafka record ``taken``: ``delivery`` when it decoded, else its bytes."""
    topic, partition = taken.key
    return dead_letter(
        reason,
        topic=topic,
        partition=partition,
        offset=taken.offset,
        raw=taken.message.value(),
        delivery=delivery,
        detail=detail,
    )
