"""``DeliveryHandler`` driven without a broker or HTTP: what it produces, sends and finishes."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from pipeline.core.admission import PROBE_HEARD_AFTER, RATE_PARK_MAX
from pipeline.core.config import ConfigTable, Destination, Source
from pipeline.core.endpoint_health import EndpointHealth, Health
from pipeline.core.outcomes import Failure, UrlResult
from pipeline.core.records import Attempt, Delivery, delivery_to_record
from pipeline.core.retry_schedule import RetrySchedule
from pipeline.core.settings import Settings
from pipeline.core.topics import Topics
from pipeline.kafka.codec import Codec
from pipeline.kafka.log_reading import decode_log_records
from pipeline.kafka.registry_codec import SchemaRegistryUnavailable
from pipeline.roles import deliver as deliver_module
from pipeline.roles import parking as parking_module
from pipeline.roles.deliver import HOLD_SECONDS, DeliveryHandler
from pipeline.roles.delivery_decisions import Defer, Retake, Retakes
from pipeline.roles.delivery_tracing import WAIT_HEADER
from pipeline.roles.parking import MAX_BYTES, PARTS_HEADER, SCHEDULE_HEADER, packed, unpacked
from pipeline.runtime import metrics
from tests.unit.roles._fakes import (
    Clock,
    FakeFollower,
    FakeLoop,
    FakeProducer,
    FakeSender,
    RegistryDown,
    health_of,
    open_circuit,
    request_out,
    taken,
)

TOPICS = Topics("t.", retry_tiers=2)
CODEC = Codec.default()
SCHEDULE = RetrySchedule(delays=(10.0, 60.0), deadline=1000.0, jitter=0.0)
URL = "https://a.example/h"
TABLE = ConfigTable.build(
    [Source(id="web", write_keys=["wk"])],
    [
        Destination(id="hooks", sources=["web"], webhooks=[{"url": URL}]),
        Destination(id="off", sources=["web"], enabled=False, webhooks=[{"url": URL}]),
    ],
)
OK = UrlResult(URL, 200)
E503 = UrlResult(URL, 503, Failure.SERVER_ERROR, "503")
E404 = UrlResult(URL, 404, Failure.CLIENT_ERROR, "404")


def delivery(destination: str = "hooks", **changes: Any) -> Delivery:
    fresh = Delivery("m1", destination, "web", "track", b'{"a":1}', int(time.time() * 1000))
    return fresh._replace(**changes)


def encoded(record: Delivery) -> bytes:
    return CODEC.encode("Delivery", delivery_to_record(record))


def handler_for(
    producer: FakeProducer,
    sender: FakeSender,
    *,
    table: ConfigTable = TABLE,
    settings: Settings | None = None,
    codec: Any = CODEC,
    health: EndpointHealth | None = None,
    schedule: RetrySchedule = SCHEDULE,
) -> DeliveryHandler:
    settings = settings or Settings()
    return DeliveryHandler(
        "deliver",
        [TOPICS.deliveries],
        settings=settings,
        topics=TOPICS,
        follower=FakeFollower(table),
        producer=producer,
        sender=sender,
        health=health or health_of(settings),
        stop=asyncio.Event(),
        codec=codec,
        schedule=schedule,
    )


def circuits_open(settings: Settings | None = None) -> EndpointHealth:
    """A health in which the webhook's circuit is open (30 s until it half-opens)."""
    health = health_of(settings)
    open_circuit(health, URL)
    return health


def silent(seconds_out: float = 2.5) -> EndpointHealth:
    """A health in which the webhook has had a request out for ``seconds_out``: silent, its
    oldest request timing out in 5 s - ``seconds_out`` (heard of half a second later)."""
    clock = Clock()
    health = health_of(clock=clock)
    request_out(health, clock, URL, seconds_out)
    return health


def routed(handler: DeliveryHandler, key: bytes, value: bytes, destination: str) -> Any:
    """The record the router's parker parks for one fresh record (``None``: not parked)."""
    parker = handler.parking.routing_parker(TABLE.destinations)
    if not parker(key, value, destination):
        return None
    (record,) = parker.records()
    return record


def run(
    records: list[bytes | None],
    sender: FakeSender,
    codec: Any = CODEC,
    loop: FakeLoop | None = None,
    settings: Settings | None = None,
    *,
    table: ConfigTable = TABLE,
    batch: list[Any] | None = None,
    health: EndpointHealth | None = None,
) -> tuple[DeliveryHandler, FakeLoop, FakeProducer, list[Any]]:
    """Handle ``records`` (or ``batch``, taken records) and wait for every task."""
    loop, producer = loop or FakeLoop(), FakeProducer()
    if batch is None:
        batch = [
            taken(TOPICS.deliveries, value, key=b"hooks/u1", partition=2, offset=10 + i)
            for i, value in enumerate(records)
        ]

    async def go() -> DeliveryHandler:
        handler = handler_for(
            producer, sender, table=table, settings=settings, codec=codec, health=health
        )
        await handler.handle(batch, loop)
        while handler._tasks:
            await handler.aclose()
        return handler

    return asyncio.run(go()), loop, producer, batch


#: Produced beside the hand-off: the delivery log and operational events.
BESIDE = {TOPICS.log, TOPICS.events}


def sent(producer: FakeProducer) -> list[tuple[str, bytes | None, dict[str, Any]]]:
    """What was produced besides the delivery log and the operational events."""
    out = []
    for topic, key, value, *_ in producer.sent:
        if topic not in BESIDE:
            name = "DeadLetter" if topic == TOPICS.dlq else "Delivery"
            out.append((topic, key, CODEC.decode(name, value)))
    return out


def logged(producer: FakeProducer) -> list[tuple[str, ...]]:
    """The delivery log's entries produced, as (kind, destination, and what matters of it)."""
    entries: list[tuple[str, ...]] = []
    for topic, key, value, *_ in producer.sent:
        if topic != TOPICS.log:
            continue
        (record,) = decode_log_records(CODEC, value)
        assert key is None and record["messageId"] == "m1"
        for e in record["entries"]:
            detail = {
                "attempt": f"{e['attempt']}:{e['status']}:{e['error']}:{e['response']}",
                "retry_scheduled": f"tier {e['tier']} {e['reason']}",
                "dead_lettered": e["reason"],
            }.get(e["kind"], "")
            entries.append((e["kind"], e["destination"], detail))
    return entries


def test_delivered_is_finished_with_nothing_produced_but_its_log() -> None:
    sender = FakeSender(lambda d: [OK])
    _, loop, producer, batch = run([encoded(delivery())], sender)
    assert [(d, body, mid, final) for d, body, mid, final, _ in sender.attempts] == [
        ("hooks", b'{"a":1}', "m1", False)
    ]
    assert sent(producer) == [] and loop.finished == batch
    # Answered, it waited for the log's acknowledgement out of the in-flight count.
    assert loop.concluded_records == batch
    assert logged(producer) == [
        ("attempt", "hooks", "1:200::"),
        ("delivered", "hooks", ""),
    ]


def test_without_the_log_nothing_is_logged() -> None:
    for answer in (OK, E503, E404):
        _, _, producer, _ = run(
            [encoded(delivery())], FakeSender(lambda d, a=answer: [a]), settings=Settings(log=False)
        )
        assert logged(producer) == [] and len(sent(producer)) == (answer is not OK)


def test_retryable_failure_goes_to_the_first_tier_under_the_same_key() -> None:
    before = int(time.time() * 1000)
    _, loop, producer, batch = run([encoded(delivery())], FakeSender(lambda d: [E503]))
    [(topic, key, record)] = sent(producer)
    assert (topic, key, record["tier"]) == (TOPICS.retry[0], b"hooks/u1", 0)
    assert record["firstAttemptAt"] >= before
    assert record["deadline"] == record["firstAttemptAt"] + 1_000_000
    assert record["notBefore"] >= record["firstAttemptAt"] + 10_000
    assert [(a["url"], a["status"], a["error"]) for a in record["attempts"]] == [
        (URL, 503, "server_error: 503")
    ]
    assert loop.finished == batch
    assert logged(producer) == [
        ("attempt", "hooks", "1:503:server_error:"),
        ("retry_scheduled", "hooks", "tier 0 "),
    ]


def test_a_failed_answers_body_is_logged_up_to_1_kb_and_attempts_are_numbered() -> None:
    long = "x" * 3000
    failed = UrlResult(URL, 503, Failure.SERVER_ERROR, long[:200], response=long[:1024])
    earlier = delivery(tier=0, attempts=(Attempt(1, URL, 503, "server_error", 5),))
    _, _, producer, _ = run([encoded(earlier)], FakeSender(lambda d: [failed]))
    [attempt, _] = logged(producer)
    assert attempt == ("attempt", "hooks", f"2:503:server_error:{'x' * 1024}")


@pytest.mark.parametrize("answer", [E503, E404, OK])
def test_a_record_whose_partition_was_lost_meanwhile_is_neither_handed_off_nor_finished(
    answer: UrlResult,
) -> None:
    loop = FakeLoop()

    def attempt(destination: Destination) -> list[UrlResult]:
        loop.lost.add((TOPICS.deliveries, 2))  # the group moved on while the request ran
        return [answer]

    _, loop, producer, _ = run([encoded(delivery())], FakeSender(attempt), loop=loop)
    assert sent(producer) == [] and logged(producer) == [] and loop.finished == []
    assert loop.concluded_records == []


def test_records_decided_without_a_request_are_not_handed_off_for_a_lost_partition() -> None:
    loop = FakeLoop(lost={(TOPICS.deliveries, 2)})
    _, loop, producer, _ = run(
        [encoded(delivery("gone")), b"junk"], FakeSender(lambda d: [OK]), loop=loop
    )
    assert sent(producer) == [] and logged(producer) == [] and loop.finished == []


def test_permanent_failure_is_dead_lettered_with_where_it_came_from() -> None:
    _, loop, producer, batch = run([encoded(delivery())], FakeSender(lambda d: [E404]))
    [(topic, key, letter)] = sent(producer)
    assert (topic, key, letter["reason"]) == (TOPICS.dlq, b"hooks", "client_error")
    where = (letter["sourceTopic"], letter["sourcePartition"], letter["sourceOffset"])
    assert where == (TOPICS.deliveries, 2, 10)
    assert letter["delivery"]["messageId"] == "m1" and len(letter["delivery"]["attempts"]) == 1
    assert letter["raw"] is None and loop.finished == batch
    assert logged(producer) == [
        ("attempt", "hooks", "1:404:client_error:"),
        ("dead_lettered", "hooks", "client_error"),
    ]


@pytest.mark.parametrize(
    ("destination", "reason"), [("gone", "destination_deleted"), ("off", "destination_disabled")]
)
def test_destination_gone_or_off_is_dead_lettered_without_a_request(
    destination: str, reason: str
) -> None:
    sender = FakeSender(lambda d: [OK])
    _, loop, producer, batch = run([encoded(delivery(destination))], sender)
    [(topic, key, letter)] = sent(producer)
    assert (topic, key, letter["reason"]) == (TOPICS.dlq, destination.encode(), reason)
    assert sender.attempts == [] and loop.finished == batch
    assert logged(producer) == [("dead_lettered", destination, reason)]


def test_past_the_deadline_is_dead_lettered_without_a_request() -> None:
    long_ago = int(time.time() * 1000) - 2_000_000
    record = delivery(first_attempt_at=long_ago, deadline=long_ago + 1_000_000, tier=1)
    sender = FakeSender(lambda d: [OK])
    _, _, producer, _ = run([encoded(record)], sender)
    [(_, _, letter)] = sent(producer)
    assert letter["reason"] == "deadline_exceeded" and sender.attempts == []


def test_every_circuit_open_goes_to_the_next_tier_without_a_request() -> None:
    """Without parking (``PIPELINE_PARKING=off``): decided, re-encoded with the refusal."""
    sender = FakeSender(lambda d: [OK])
    off = Settings(parking=False)
    _, loop, producer, batch = run(
        [encoded(delivery())], sender, settings=off, health=circuits_open(off)
    )
    [(topic, _, record)] = sent(producer)
    assert topic == TOPICS.retry[0]
    assert (
        record["attempts"][0]["error"]
        == "circuit_open: not tried: it failed repeatedly; circuit open"
    )
    assert sender.attempts == [] and loop.finished == batch
    assert logged(producer) == [("retry_scheduled", "hooks", "tier 0 circuit_open")]


def test_undecodable_is_dead_lettered_raw() -> None:
    _, loop, producer, batch = run([b"\x00garbage"], FakeSender(lambda d: [OK]))
    [(topic, key, letter)] = sent(producer)
    assert (topic, key, letter["reason"], letter["raw"]) == (
        TOPICS.dlq,
        None,
        "undecodable",
        b"\x00garbage",
    )
    assert letter["delivery"] is None and loop.finished == batch


def test_a_bug_dead_letters_the_record_as_internal_error() -> None:
    def broken(destination: Destination) -> list[UrlResult]:
        raise RuntimeError("boom")

    _, loop, producer, batch = run([encoded(delivery())], FakeSender(broken))
    [(_, _, letter)] = sent(producer)
    assert (letter["reason"], letter["detail"]) == ("internal_error", "RuntimeError: boom")
    assert letter["delivery"]["firstAttemptAt"] is not None and loop.finished == batch


def test_due_later_pauses_the_partition_until_shortly_before() -> None:
    due = time.time() + 60
    sender = FakeSender(lambda d: [OK])
    _, loop, producer, batch = run([encoded(delivery(not_before=int(due * 1000)))], sender)
    [(record, until)] = loop.deferred
    assert record is batch[0] and until == pytest.approx(due - HOLD_SECONDS, abs=0.002)
    assert loop.finished == [] and sender.attempts == [] and producer.sent == []


def test_due_soon_is_held_and_attempted_at_its_not_before_never_early() -> None:
    due_ms = int((time.time() + 0.2) * 1000)
    sender = FakeSender(lambda d: [OK])
    _, loop, _, batch = run([encoded(delivery(not_before=due_ms))], sender)
    [(_, _, _, _, at)] = sender.attempts
    assert at >= due_ms / 1000 and loop.finished == batch


def test_registry_down_stops_the_worker_and_finishes_nothing() -> None:
    handler, loop, producer, _ = run(
        [encoded(delivery())], FakeSender(lambda d: [OK]), codec=RegistryDown()
    )
    assert isinstance(handler.fatal, SchemaRegistryUnavailable) and handler._stop.is_set()
    assert loop.finished == [] and producer.sent == []


def test_the_log_of_attempts_ending_in_one_turn_is_one_kafka_record() -> None:
    sender = FakeSender(lambda d: [OK])
    values = [encoded(delivery()._replace(message_id=f"m{i}")) for i in range(5)]
    _, loop, producer, batch = run(values, sender)
    logs = [value for topic, _, value in producer.sent if topic == TOPICS.log]
    assert len(logs) == 1
    records = decode_log_records(CODEC, logs[0])
    assert sorted(r["messageId"] for r in records) == [f"m{i}" for i in range(5)]
    assert sorted(t.offset for t in loop.finished) == [t.offset for t in batch]


# ---- parking -----------------------------------------------------------------------------------


def park_header(taken_record: Any) -> tuple[str, ...] | None:
    topic, key, value, *headers = taken_record
    if not headers:
        return None
    found = dict(headers[0])
    assert set(found) <= {SCHEDULE_HEADER, PARTS_HEADER, WAIT_HEADER}
    return tuple(found[SCHEDULE_HEADER].decode().split(" "))


def parts_of(parked: Any) -> list[tuple[bytes | None, bytes]]:
    """The records a parked record carries: itself, or a parked batch's records (as many as its
    header says)."""
    headers = dict(parked[3])
    if PARTS_HEADER not in headers:
        return [(parked[1], parked[2])]
    parts = [(m.key(), m.value()) for m in unpacked(parked[2], parked[3])]
    assert len(parts) == int(headers[PARTS_HEADER]) > 1
    return parts


def test_every_circuit_open_parks_the_record_as_it_is() -> None:
    value = encoded(delivery())
    sender = FakeSender(lambda d: [OK])
    before = time.time()
    _, loop, producer, batch = run([value], sender, health=circuits_open())
    [parked] = producer.sent
    assert (parked[0], parked[1], parked[2]) == (TOPICS.retry[1], b"hooks/u1", value)  # as is
    tier, not_before, first, deadline, destination = park_header(parked) or ()
    # 30 s until the circuit half-opens: the 60 s tier, not the 10 s one, whose short parks
    # (a second for a silent destination) would wait behind it
    assert (tier, destination) == ("1", "hooks")
    assert before + 29 <= int(not_before) / 1000 <= time.time() + 30
    assert int(deadline) - int(first) == 1000 * 1000  # its deadline's clock started
    assert sender.attempts == [] and loop.finished == batch
    assert logged(producer) == []  # not an attempt


class Admissions:
    """Counts the admissions made (``admit`` asked), not those a batch kept."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made = 0
        real = parking_module.admit

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.made += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(parking_module, "admit", counted)


def test_a_fresh_record_is_parked_at_routing_when_every_circuit_is_open() -> None:
    value = encoded(delivery())
    handler = handler_for(FakeProducer(), FakeSender(lambda d: [OK]), health=circuits_open())
    parked_before = metrics.PARKED.labels(metrics.destination_label("hooks"), "circuit_open")
    count = parked_before._value.get()
    before = time.time()
    parked = routed(handler, b"hooks/u1", value, "hooks")
    assert parked is not None
    assert (parked[0], parked[1], parked[2]) == (TOPICS.retry[1], b"hooks/u1", value)
    tier, not_before, first, deadline, destination = park_header(parked) or ()
    assert (tier, destination) == ("1", "hooks")
    assert int(before * 1000) <= int(first) <= time.time() * 1000  # the window starts now
    assert int(deadline) - int(first) == 1000 * 1000
    # until the circuit half-opens (30 s)
    assert int(first) + 29_950 <= int(not_before) <= int(first) + 30_050
    assert parked_before._value.get() == count + 1


def test_the_routers_parker_decides_once_a_batch_per_destination(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    admissions = Admissions(monkeypatch)
    health = EndpointHealth(Settings())
    open_circuit(health, URL)
    handler = handler_for(FakeProducer(), FakeSender(lambda d: [OK]), health=health)
    parked = metrics.PARKED.labels(metrics.destination_label("hooks"), "circuit_open")
    count = parked._value.get()
    parker = handler.parking.routing_parker(TABLE.destinations)
    value, gone = encoded(delivery()), encoded(delivery("gone"))
    assert parker(b"k1", value, "hooks")  # comes back for the probe: its own plan
    assert parker(b"k2", value, "hooks") and parker(b"k3", value, "hooks")
    assert not parker(b"k4", gone, "gone")  # not configured: dead-lettered later
    # The carrier's, the plan the others share, and the unconfigured destination's.
    assert admissions.made == 3
    carrier, shared = parker.records()  # the others in one record: one plan
    assert parts_of(carrier) == [(b"k1", value)] and shared[1] == b"k2"
    assert parts_of(shared) == [(b"k2", value), (b"k3", value)]
    assert park_header(carrier) != park_header(shared)
    assert parked._value.get() == count + 3 and parker.parked == 3  # each record counted
    assert handler.parking.routing_parker(TABLE.destinations)(b"k5", value, "hooks")
    assert admissions.made == 4  # the next batch asks again


def test_a_fresh_record_for_a_silent_destination_is_parked_at_routing() -> None:
    value = encoded(delivery())
    before = time.time()
    handler = handler_for(FakeProducer(), FakeSender(lambda d: [OK]), health=silent())
    parked = routed(handler, b"k", value, "hooks")
    assert parked is not None and parked[2] == value
    tier, not_before, *_ = park_header(parked) or ()
    assert tier == "0" and before + 2.95 <= int(not_before) / 1000 <= time.time() + 3.05


class Limited(EndpointHealth):
    """Every destination's next turn under its rate limit is ``wait`` seconds off."""

    wait = 30.0

    def rate_wait(self, destination: Destination) -> float:
        return self.wait


def test_a_fresh_record_goes_to_deliveries_unless_its_endpoints_are_down_or_hang() -> None:
    value, fresh, sender = encoded(delivery()), "hooks", FakeSender(lambda d: [OK])
    healthy = handler_for(FakeProducer(), sender)
    assert routed(healthy, b"k", value, fresh) is None
    # Decided on arrival, where the records ahead of it have been counted: over its rate.
    limited = handler_for(FakeProducer(), sender, health=Limited(Settings()))
    assert routed(limited, b"k", value, fresh) is None
    off = Settings(parking=False)
    parking_off = handler_for(FakeProducer(), sender, settings=off, health=circuits_open(off))
    assert routed(parking_off, b"k", value, fresh) is None
    gone = handler_for(FakeProducer(), sender, health=circuits_open())  # dead-lettered on arrival
    assert routed(gone, b"k", encoded(delivery("gone")), "gone") is None


def test_a_record_for_a_silent_destination_waits_as_long_as_its_health_says() -> None:
    # Out 2.5 s: its oldest request times out in 2.5 s and is heard of 0.5 s later. Out 5.3 s:
    # heard of in 0.2 s, so SILENT_WAIT (1 s).
    for out, wait in ((2.5, 3.0), (5.3, 1.0)):
        before = time.time()
        _, loop, producer, batch = run(
            [encoded(delivery())], FakeSender(lambda d: [OK]), health=silent(out)
        )
        [parked] = producer.sent
        _tier, not_before, *_ = park_header(parked) or ()
        # the sender's wait, SILENT_WAIT (1 s) at least
        assert before + wait - 0.05 <= int(not_before) / 1000 <= time.time() + wait + 0.05
        assert loop.finished == batch


def parked_taken(value: bytes | None, not_before: float, **changes: Any) -> Any:
    fields = {"tier": 1, "first": int(time.time() * 1000) - 5000, "destination": "hooks"}
    fields.update(changes)
    header = f"{fields['tier']} {int(not_before * 1000)} {fields['first']} "
    header += f"{fields['first'] + 1_000_000} {fields['destination']}"
    return [(SCHEDULE_HEADER, header.encode())], value


def run_parked(
    value: bytes | None,
    not_before: float,
    sender: FakeSender,
    health: EndpointHealth | None = None,
    **changes: Any,
) -> tuple[FakeLoop, FakeProducer, Any]:
    headers, value = parked_taken(value, not_before, **changes)
    batch = [taken(TOPICS.retry[1], value, key=b"hooks/u1", offset=3, headers=headers)]
    _, loop, producer, batch = run([], sender, batch=batch, health=health)
    return loop, producer, batch


def test_a_parked_record_still_refused_is_parked_again_without_a_decode() -> None:
    # The value is not even a record: parked again untouched, it was never decoded.
    ok = FakeSender(lambda d: [OK])
    loop, producer, batch = run_parked(b"not decoded", time.time() - 1, ok, circuits_open())
    [again] = producer.sent
    assert again[2] == b"not decoded" and park_header(again) is not None
    assert loop.finished == batch


def test_a_parked_record_not_due_is_deferred_without_a_decode() -> None:
    ok = FakeSender(lambda d: [OK])
    loop, producer, _ = run_parked(b"not decoded", time.time() + 20, ok, circuits_open())
    assert producer.sent == [] and len(loop.deferred) == 1


def test_a_fresh_record_is_parked_before_its_decode_when_its_destination_cannot_take_it() -> None:
    """A record on ``deliveries`` has not been attempted (the router's, a call replay's): its
    key names its destination, and its window starts when it is parked."""
    batch = [taken(TOPICS.deliveries, b"not decoded", key=b"hooks/u1", offset=0)]
    before = time.time()
    ok = FakeSender(lambda d: [OK])
    _, loop, producer, batch = run([], ok, batch=batch, health=circuits_open())
    [parked] = producer.sent
    assert (parked[1], parked[2]) == (b"hooks/u1", b"not decoded")
    tier, not_before, first, _deadline, destination = park_header(parked) or ()
    assert (tier, destination) == ("1", "hooks") and int(first) >= int(before * 1000)
    assert loop.finished == batch
    # Its key does not name a destination: decoded, and parked as decoded.
    value = encoded(delivery())
    batch = [taken(TOPICS.deliveries, value, key=b"no-slash", offset=0)]
    _, loop, producer, batch = run([], ok, batch=batch, health=circuits_open())
    [parked] = producer.sent
    assert parked[2] == value and park_header(parked) is not None


def test_parked_records_come_due_together_are_parked_again_with_one_plan_a_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    admissions = Admissions(monkeypatch)
    health = EndpointHealth(Settings())
    open_circuit(health, URL)
    first = int(time.time() * 1000) - 5000
    batch = []
    for offset, started in enumerate((first, first, first, first - 60_000)):
        headers, value = parked_taken(b"not decoded", time.time() - 1, first=started)
        batch.append(taken(TOPICS.retry[1], value, offset=offset, headers=headers))
    _, loop, producer, batch = run([], FakeSender(lambda d: [OK]), batch=batch, health=health)
    assert admissions.made == 3  # the probe's carrier, the plan of its window, the other window
    # The carrier alone, the two sharing its window's plan in one record, the other window's.
    windows = [
        (*(park_header(record) or ())[2:4], len(parts_of(record))) for record in producer.sent
    ]
    assert windows == [
        (str(first), str(first + 1_000_000), 1),
        (str(first), str(first + 1_000_000), 2),
        (str(first - 60_000), str(first - 60_000 + 1_000_000), 1),
    ]
    assert [value for record in producer.sent for _, value in parts_of(record)] == [
        b"not decoded"
    ] * 4
    assert loop.finished == batch


def test_one_parked_record_comes_back_for_the_probe_the_others_after_its_answer() -> None:
    class Reopens(EndpointHealth):
        wait = 30.0

        def snapshot(self, destination: Destination) -> Health:
            return Health(reopens_in=self.wait)

    health = Reopens(Settings())
    handler = handler_for(FakeProducer(), FakeSender(lambda d: [OK]), health=health)
    value = encoded(delivery())

    def waits(count: int) -> list[tuple[float, int]]:
        """(wait, records carried) of each record parked for ``count`` fresh records."""
        parker, now = handler.parking.routing_parker(TABLE.destinations), time.time()
        assert all(parker(b"k", value, "hooks") for _ in range(count))
        return [
            (round(int((park_header(r) or ())[1]) / 1000 - now, 1), len(parts_of(r)))
            for r in parker.records()
        ]

    answered = Settings().delivery_timeout + PROBE_HEARD_AFTER
    assert waits(3) == [(30.0, 1), (30.0 + answered, 2)]
    assert waits(2) == [(30.0 + answered, 2)]  # a later batch: the reopening has its carrier
    health.wait = 10.0  # the probe failed: the circuit opened again, reopening sooner
    assert waits(2) == [(10.0, 1), (10.0 + answered, 1)]


def test_a_parked_record_whose_circuit_closed_is_attempted_as_parked() -> None:
    sender = FakeSender(lambda d: [E503])
    value = encoded(delivery())  # as first parked: never attempted, tier -1
    loop, producer, batch = run_parked(value, time.time() - 1, sender, tier=1)
    assert len(sender.attempts) == 1 and loop.finished == batch
    [(topic, _, record)] = sent(producer)
    # The header's tier and deadline clock held: its next tier follows tier 1.
    assert topic == TOPICS.retry[1] and record["tier"] == 1
    assert record["firstAttemptAt"] is not None and record["deadline"] is not None


def parked_batch(values: list[bytes], not_before: float, **changes: Any) -> Any:
    """A parked record carrying ``values``, keyed ``hooks/u0``, ``hooks/u1``, ..."""
    headers, _ = parked_taken(None, not_before, **changes)
    headers.append((PARTS_HEADER, str(len(values)).encode()))
    value = packed([(b"hooks/u%d" % n, record, 0) for n, record in enumerate(values)])
    return taken(TOPICS.retry[1], value, key=b"hooks/u0", offset=3, headers=headers)


def test_a_parked_batch_still_refused_is_parked_again_whole_without_a_decode() -> None:
    counted = metrics.PARKED.labels(metrics.destination_label("hooks"), "circuit_open")
    before = counted._value.get()
    headers, value = parked_taken(b"alone", time.time() - 1)
    alone = taken(TOPICS.retry[1], value, key=b"hooks/u9", offset=2, headers=headers)
    batch = [alone, parked_batch([b"not decoded"] * 3, time.time() - 1)]  # the first carries
    ok = FakeSender(lambda d: [OK])
    _, loop, producer, batch = run([], ok, batch=batch, health=circuits_open())  # the probe
    carrier, again = producer.sent
    assert carrier[2] == b"alone"
    assert again[2] == batch[1].message.value()  # the same bytes: one record, one produce
    assert parts_of(again) == [(b"hooks/u%d" % n, b"not decoded") for n in range(3)]
    assert counted._value.get() == before + 4  # each record it carries counted
    assert loop.finished == batch


@pytest.mark.parametrize("count", [2, 3])
def test_a_parked_batch_parked_again_to_carry_the_probe_carries_it_with_one_record(
    count: int,
) -> None:
    """The records of a reopening come back once its probe has answered, but one, which comes
    back when the circuit half-opens, to carry the probe. A whole batch chosen for that used to
    come back to a circuit ready for one probe, be opened, and have every record started: one
    took the probe, the others were refused and parked one by one. Now its first record carries
    the probe, alone, and the others stay together (a batch, or a record alone), without a
    decode, back with the rest of the reopening."""
    counted = metrics.PARKED.labels(metrics.destination_label("hooks"), "circuit_open")
    before, now = counted._value.get(), time.time()
    batch = [parked_batch([b"record %d" % n for n in range(count)], now - 1)]
    ok = FakeSender(lambda d: [OK])
    _, loop, producer, batch = run([], ok, batch=batch, health=circuits_open())
    carrier, others = producer.sent
    answered = Settings().delivery_timeout + PROBE_HEARD_AFTER

    def wait(record: Any) -> float:
        return int((park_header(record) or ())[1]) / 1000 - now

    assert parts_of(carrier) == [(b"hooks/u0", b"record 0")]
    assert wait(carrier) == pytest.approx(30.0, abs=0.2)
    assert parts_of(others) == [(b"hooks/u%d" % n, b"record %d" % n) for n in range(1, count)]
    assert wait(others) == pytest.approx(30.0 + answered, abs=0.2)
    assert counted._value.get() == before + count and loop.finished == batch


def test_a_parked_batch_whose_circuit_closed_goes_on_record_by_record() -> None:
    """Each record it carries is attempted as a parked record (the header's tier and clock);
    the batch is finished once, when the last of them is."""
    sender = FakeSender(lambda d: [E503])
    values = [encoded(delivery(message_id=f"m{n}")) for n in range(3)]
    _, loop, producer, batch = run([], sender, batch=[parked_batch(values, time.time() - 1)])
    assert sorted(message_id for _, _, message_id, _, _ in sender.attempts) == ["m0", "m1", "m2"]
    assert loop.finished == batch
    retried = sorted((key or b"", r["messageId"], r["tier"]) for _, key, r in sent(producer))
    assert retried == [(b"hooks/u0", "m0", 1), (b"hooks/u1", "m1", 1), (b"hooks/u2", "m2", 1)]


def test_a_parked_batch_due_within_the_hold_waits_here_undecoded_and_is_decided_again() -> None:
    """Not decoded, and its partition not paused (a resumed partition came back up to a second
    late): held as it is until due, then parked again whole if its destination still cannot
    take it. The record behind it in its partition goes on meanwhile."""
    due = time.time() + HOLD_SECONDS / 2
    parked = parked_batch([b"not decoded"] * 2, due)
    headers, value = parked_taken(b"alone", time.time() - 1)
    behind = taken(TOPICS.retry[1], value, key=b"hooks/u9", offset=4, headers=headers)
    _, loop, producer, batch = run(
        [], FakeSender(lambda d: [OK]), batch=[parked, behind], health=circuits_open()
    )
    assert loop.deferred == []
    carrier, again = producer.sent  # the one behind carries the probe; the batch came after
    assert carrier[2] == b"alone"
    assert again[2] == parked.message.value()  # the same bytes: parked again whole
    assert park_header(again) is not None and int(park_header(again)[1]) / 1000 > due
    assert loop.finished == [behind, parked]


def test_parked_batches_held_until_due_stay_within_their_bytes() -> None:
    retakes = Retakes(limit=100)
    assert retakes.decide(b"x" * 60, 5.0) == Retake(5.0, 60)
    assert retakes.decide(b"x" * 60, 6.0) == Defer(6.0)  # past the limit: its partition pauses
    retakes.released(60)
    assert retakes.decide(b"x" * 100, 7.0) == Retake(7.0, 100) and retakes.held == 100


def test_a_parked_batch_past_the_bytes_held_pauses_its_partition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One batch's worth may be held: of two due within the hold, the first waits here and is
    decided again when due, the second pauses its partition until then; the bytes held are
    given back once the first is decided."""
    due = time.time() + HOLD_SECONDS / 2
    first = parked_batch([b"not decoded"] * 2, due)
    second = parked_batch([b"not decoded"] * 2, due)
    second.key = (second.key[0], 1)
    limit = len(first.message.value())
    monkeypatch.setattr(deliver_module, "Retakes", lambda: Retakes(limit=limit))
    handler, loop, producer, _ = run(
        [], FakeSender(lambda d: [OK]), batch=[first, second], health=circuits_open()
    )
    assert [(record, until) for record, until in loop.deferred] == [
        (second, int(due * 1000) / 1000)
    ]
    # the first, decided again when due: one record carries the probe, the other waits for it
    parked = [part for record in producer.sent for part in parts_of(record)]
    assert parked == [(b"hooks/u0", b"not decoded"), (b"hooks/u1", b"not decoded")]
    assert loop.finished == [first]
    assert handler._retakes.held == 0


def test_a_held_batch_whose_partition_went_is_left_to_its_new_owner() -> None:
    values = [encoded(delivery(message_id=f"m{n}")) for n in range(2)]
    parked = parked_batch(values, time.time() + HOLD_SECONDS / 2)
    sender, loop = FakeSender(lambda d: [OK]), FakeLoop()
    loop.lost = {parked.key}
    _, loop, producer, _ = run([], sender, loop=loop, batch=[parked])
    assert sender.attempts == [] and producer.sent == [] and loop.finished == []


def test_a_batch_opened_before_its_partition_is_deferred_still_goes_on() -> None:
    """Its records are read after the rest of the consumed batch; a record behind it that
    pauses the partition does not hold them back (they come before it)."""
    sender = FakeSender(lambda d: [OK])
    values = [encoded(delivery(message_id=f"m{n}")) for n in range(2)]
    opened = parked_batch(values, time.time() - 1)
    headers, value = parked_taken(b"later", time.time() + 20)
    later = taken(TOPICS.retry[1], value, key=b"hooks/u9", offset=4, headers=headers)
    _, loop, producer, batch = run([], sender, batch=[opened, later])
    assert sorted(message_id for _, _, message_id, _, _ in sender.attempts) == ["m0", "m1"]
    assert loop.finished == [opened] and [r.offset for r, _ in loop.deferred] == [4]


def test_a_parked_batch_that_does_not_read_back_is_dead_lettered_whole() -> None:
    record = parked_batch([b"xyz"], time.time() - 1)
    record.message._value = record.message._value[:-2]  # cut short
    _, loop, producer, batch = run([], FakeSender(lambda d: [OK]), batch=[record])
    [(topic, _, letter)] = sent(producer)
    assert topic == TOPICS.dlq and letter["reason"] == "undecodable"
    assert "past the batch's end" in letter["detail"]
    assert loop.finished == batch


def test_records_parked_together_past_the_size_of_a_batch_go_in_several() -> None:
    big = b"x" * (MAX_BYTES // 2 - 100)
    handler = handler_for(FakeProducer(), FakeSender(lambda d: [OK]), health=silent())
    parker = handler.parking.routing_parker(TABLE.destinations)
    assert all(parker(b"hooks/u%d" % n, big, "hooks") for n in range(5))
    records = parker.records()
    assert [len(parts_of(record)) for record in records] == [2, 2, 1]
    assert all(len(record[2]) <= MAX_BYTES for record in records)


def test_a_part_finishes_its_batch_only_when_it_is_the_last() -> None:
    whole = taken(TOPICS.retry[0], b"batch", offset=7)
    parts = whole.split(unpacked(packed([(b"a", b"1", 0), (b"b", b"2", 0)]), []))
    assert [(p.message.key(), p.offset, p.key) for p in parts] == [
        (b"a", 7, whole.key),
        (b"b", 7, whole.key),
    ]
    assert parts[1].finished() is None and parts[0].finished() is whole
    assert whole.finished() is whole


def test_a_destination_at_its_max_in_flight_parks_the_rest() -> None:
    """One slot and, its receiver's pace unknown, one more record waiting for it (the sender
    holds it): the third record is parked."""
    table = ConfigTable.build(
        [Source(id="web", write_keys=["wk"])],
        [
            Destination(id="hooks", sources=["web"], webhooks=[{"url": URL}], max_in_flight=1),
        ],
    )
    sender = FakeSender(lambda d: [OK], delay=0.05)  # its records stay in flight 50 ms
    values = [encoded(delivery()._replace(message_id=f"m{i}")) for i in range(4)]
    batch = [taken(TOPICS.deliveries, v, key=b"hooks/u1", offset=i) for i, v in enumerate(values)]
    _, loop, producer, _ = run([], sender, table=table, batch=batch)
    assert [m for _, _, m, _, _ in sender.attempts] == ["m0", "m1"]
    [parked] = [record for record in producer.sent if record[0] not in BESIDE]  # one plan
    assert (park_header(parked) or ())[0] == "0"
    assert parts_of(parked) == [(b"hooks/u1", values[2]), (b"hooks/u1", values[3])]
    assert sorted(t.offset for t in loop.finished) == [0, 1, 2, 3]


@pytest.mark.parametrize("mute", [True, False])
def test_a_destination_whose_first_requests_go_unanswered_takes_its_hosts_connections_at_most(
    mute: bool,
) -> None:
    # A new endpoint that hangs would otherwise fill every in-flight slot with records waiting
    # behind its first requests, and its healthy neighbours would wait with them.
    sender = FakeSender(lambda d: [OK], delay=0.05)  # its records stay in flight 50 ms
    clock = Clock()
    settings = Settings(max_connections_per_host=2)
    health = health_of(settings, clock)
    if mute:  # a request out for 0.1 s without an answer: unproven (silent only past 0.25 s)
        request_out(health, clock, URL, 0.1)
    values = [encoded(delivery()._replace(message_id=f"m{i}")) for i in range(5)]
    batch = [taken(TOPICS.deliveries, v, key=b"hooks/u1", offset=i) for i, v in enumerate(values)]
    counter = metrics.PARKED.labels(metrics.destination_label("hooks"), "unanswered")
    count = counter._value.get()
    before = time.time()
    _, loop, producer, _ = run([], sender, batch=batch, settings=settings, health=health)
    parked = [record for record in producer.sent if record[0] not in BESIDE]
    assert sorted(t.offset for t in loop.finished) == [0, 1, 2, 3, 4]
    if not mute:  # it answered, or had no time to: nothing holds it back
        assert len(sender.attempts) == 5 and parked == []
        return
    assert [m for _, _, m, _, _ in sender.attempts] == ["m0", "m1"]
    [batched] = parked  # one plan: the first tier, a second from now
    tier, not_before, *_ = park_header(batched) or ()
    assert tier == "0" and before + 0.999 <= int(not_before) / 1000 <= time.time() + 1
    assert parts_of(batched) == [(b"hooks/u1", value) for value in values[2:]]
    assert counter._value.get() == count + 3


def test_the_final_attempt_is_not_parked() -> None:
    now = int(time.time() * 1000)
    record = delivery(first_attempt_at=now - 999_500, deadline=now + 500, tier=1)
    sender = FakeSender(lambda d: [OK])
    retried = [taken(TOPICS.retry[1], encoded(record), key=b"hooks/u1", offset=0)]
    _, loop, producer, batch = run([], sender, batch=retried, health=circuits_open())
    assert len(sender.attempts) == 1 and sender.attempts[0][3] is True  # final, through circuits
    assert [r for r in producer.sent if r[0] not in BESIDE] == [] and loop.finished == batch


def test_a_record_that_would_wait_long_for_its_rate_limit_is_parked() -> None:
    health = Limited(Settings())
    health.wait = 7.0
    sender = FakeSender(lambda d: [OK])
    before = time.time()
    _, loop, producer, batch = run([encoded(delivery())], sender, health=health)
    [parked] = producer.sent
    tier, not_before, *_ = park_header(parked) or ()
    assert tier == "0" and sender.attempts == [] and loop.finished == batch
    # Back at the next report at the latest, where the shares of the rate may have changed.
    due = int(not_before) / 1000
    assert before + RATE_PARK_MAX - 0.002 <= due <= time.time() + RATE_PARK_MAX


def test_each_record_of_a_batch_waits_behind_the_turns_the_ones_before_it_took() -> None:
    """A batch asks a destination's health once, but its rate-limit turns record by record:
    at 4/s (a burst of 4) six start (four now, then turns in 0.25 and 0.5 s), the rest would
    wait longer than ``RATE_PARK_MAX`` and are parked."""
    limited = ConfigTable.build(
        [Source(id="web", write_keys=["wk"])],
        [Destination(id="hooks", sources=["web"], webhooks=[{"url": URL}], rate_limit=4.0)],
    )
    sender = FakeSender(lambda d: [OK])
    values = [encoded(delivery(message_id=f"m{i}")) for i in range(10)]
    _, loop, producer, batch = run(values, sender, table=limited)
    assert RATE_PARK_MAX == 0.5
    assert [attempt[2] for attempt in sender.attempts] == [f"m{i}" for i in range(6)]
    parked = [record for record in producer.sent if park_header(record) is not None]
    assert sum(len(parts_of(record)) or 1 for record in parked) == 4
    assert sorted(record.offset for record in loop.finished) == [r.offset for r in batch]


def test_records_waiting_for_a_turn_go_to_the_tier_partition_of_their_own_number() -> None:
    """A backlog stays spread over the first tier as over the partitions it was read from (a
    rebalance then moves the part whose partition moves, not a process's all), and counts in
    this process's demand where its retry role holds the partition."""
    health = Limited(Settings(retry_partitions=3))
    health.wait = 7.0
    counted: list[tuple[str, int, float, object]] = []

    def waited(destination: str, records: int = 1, back_in: float = 0.0, place: object = None):
        counted.append((destination, records, back_in, place))

    health.pace.waited = waited  # type: ignore[method-assign]
    loop, producer = FakeLoop(), FakeProducer()
    handler = handler_for(producer, FakeSender(lambda d: [OK]), health=health)
    handler.parking.holds_place = {(TOPICS.retry[0], 1)}.__contains__
    batch = [
        taken(
            TOPICS.deliveries,
            encoded(delivery(message_id=f"m{p}")),
            key=b"k",
            partition=p,
            offset=p,
        )
        for p in (2, 4)
    ]

    async def go() -> None:
        await handler.handle(batch, loop)
        while handler._tasks:
            await handler.aclose()

    asyncio.run(go())
    assert sorted((topic, placed) for topic, *_, placed in producer.sent) == [
        (TOPICS.retry[0], 1),  # read from partition 4 of 3
        (TOPICS.retry[0], 2),
    ]
    [(destination, records, back_in, place)] = counted  # the one parked where it is held
    assert (destination, records, place) == ("hooks", 1, (TOPICS.retry[0], 1))
    assert RATE_PARK_MAX - 0.1 <= back_in <= RATE_PARK_MAX


def test_the_share_of_the_rate_limit_follows_the_partitions_held() -> None:
    health = health_of()
    limited = TABLE.destinations["hooks"].model_copy(update={"rate_limit": 60.0})
    handler, *_ = run([], FakeSender(lambda d: [OK]), health=health)
    handler.assigned([(TOPICS.deliveries, 0), (TOPICS.deliveries, 1), (TOPICS.deliveries, 2)])
    # 3 of the 6 deliver partitions, none of the retry role's: a quarter of the group's 60/s
    assert health.rate_of(limited) == 15.0
    handler.released([(TOPICS.deliveries, 0)])
    assert health.rate_of(limited) == 10.0


# ---- operational events and auto-disable --------------------------------------------------------


def events(producer: FakeProducer) -> list[dict[str, Any]]:
    return [
        CODEC.decode("OperationalEvent", value)
        for topic, _, value, *_ in producer.sent
        if topic == TOPICS.events
    ]


def test_a_destinations_first_dead_letter_is_an_event() -> None:
    _, _, producer, _ = run([encoded(delivery())], FakeSender(lambda d: [E404]))
    [event] = events(producer)
    assert (event["kind"], event["destination"], event["data"]) == (
        "dead_letters",
        "hooks",
        '{"count":1}',
    )


def test_circuits_opening_and_closing_are_events() -> None:
    class Opens(EndpointHealth):
        answers = [1, 1, 0]  # open webhooks after each attempt

        def open_circuits(self, destination: Destination) -> int:
            return self.answers.pop(0)

    values = [encoded(delivery()._replace(message_id=f"m{i}")) for i in range(3)]
    _, _, producer, _ = run(values, FakeSender(lambda d: [E503]), health=Opens(Settings()))
    assert [e["kind"] for e in events(producer)] == ["circuit_opened", "circuit_closed"]


def test_a_record_refused_while_it_waited_is_parked() -> None:
    clock = Clock()
    health = health_of(clock=clock)
    refused = UrlResult(URL, failure=Failure.CIRCUIT_OPEN, detail="not tried: silent")

    def fell_silent(destination: Destination) -> list[UrlResult]:
        request_out(health, clock, URL, 2.5)  # by the time the attempt returns
        return [refused]

    value = encoded(delivery())
    _, loop, producer, batch = run([value], FakeSender(fell_silent), health=health)
    [parked] = [r for r in producer.sent if r[0] not in BESIDE]
    assert parked[2] == value and park_header(parked) is not None
    assert logged(producer) == [] and loop.finished == batch
