"""``RouterHandler`` driven without a broker: what it produces and finishes for a batch."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import parse_call
from pipeline.core.config import ConfigTable, Destination, Source
from pipeline.core.records import Delivery, call_to_record, delivery_to_record
from pipeline.core.render import render_body
from pipeline.core.routing import Routed
from pipeline.core.settings import Settings
from pipeline.core.timestamps import format_timestamp
from pipeline.core.topics import Topics
from pipeline.kafka.codec import Codec
from pipeline.kafka.log_reading import decode_log_records
from pipeline.kafka.partition_state import PartitionState
from pipeline.kafka.registry_codec import SchemaRegistryUnavailable
from pipeline.kafka.transactions import Fenced, TransactionFailed
from pipeline.roles.dedupe import Dedupe
from pipeline.roles.router import RouterHandler
from pipeline.runtime import metrics, tracing
from tests.unit.roles._fakes import FakeFollower, FakeLoop, FakeProducer, RegistryDown, taken

TOPICS = Topics("t.", retry_tiers=2)
CODEC = Codec.default()
TABLE = ConfigTable.build(
    [Source(id="web", write_keys=["wk"], blocked_events=["Heartbeat"])],
    [
        Destination(id=d, sources=["web"], webhooks=[{"url": f"https://x/{d}"}])
        for d in ("hooks-a", "hooks-b")
    ],
)


def call_value(raw: dict[str, Any]) -> bytes:
    return CODEC.encode("Call", call_to_record(parse_call(raw, source_id="web", received_at=1)))


def run(
    values: list[bytes | None],
    codec: Any = CODEC,
    headers: list[list[tuple[str, bytes]] | None] | None = None,
    **options: Any,
) -> tuple[RouterHandler, FakeLoop, FakeProducer, list[Any]]:
    loop, producer = FakeLoop(), FakeProducer()
    batch = [
        taken(
            TOPICS.calls, v, partition=1, offset=i, headers=(headers or [])[i] if headers else None
        )
        for i, v in enumerate(values)
    ]

    async def go() -> RouterHandler:
        handler = RouterHandler(
            topics=TOPICS,
            follower=FakeFollower(TABLE),
            producer=producer,
            stop=asyncio.Event(),
            codec=codec,
            **options,
        )
        await handler.handle(batch, loop)
        return handler

    return asyncio.run(go()), loop, producer, batch


def test_the_log_records_each_calls_fate_beside_its_delivery_records() -> None:
    track = {"type": "track", "event": "Order", "userId": "u1", "messageId": "m1"}
    blocked = {"type": "track", "event": "Heartbeat", "anonymousId": "a2", "messageId": "m2"}
    off = {"type": "identify", "userId": "u3", "messageId": "m3", "integrations": {"All": False}}
    values = [call_value(track), call_value(blocked), call_value(off), b"junk"]
    _, loop, producer, batch = run(values, log=True)
    # One Kafka record for the batch's log, keyed by its input partition.
    ((key, value),) = [(key, v) for t, key, v in producer.sent if t == TOPICS.log]
    assert key == str(batch[0].key[1]).encode()
    logs = decode_log_records(CODEC, value)
    assert [r["messageId"] for r in logs] == ["m1", "m2", "m3"]  # none for the undecodable one
    first, second, third = logs
    assert (first["sourceId"], first["callType"], first["userId"], first["event"]) == (
        "web",
        "track",
        "u1",
        "Order",
    )

    def kinds(record: dict[str, Any]) -> list[tuple[Any, ...]]:
        return [
            (e["kind"], e["destination"], e["reason"], e["destinations"]) for e in record["entries"]
        ]

    assert kinds(first) == [("received", "", "", []), ("routed", "", "", ["hooks-a", "hooks-b"])]
    assert first["entries"][0]["size"] == len(values[0]) and first["entries"][0]["at"] == 1
    assert first["entries"][0]["body"] is None  # bodies only with PIPELINE_LOG_BODIES
    assert second["anonymousId"] == "a2"
    assert kinds(second) == [("received", "", "", []), ("dropped", "", "blocked_event", [])]
    assert kinds(third) == [
        ("received", "", "", []),
        ("dropped", "", "no_destination", []),
        ("dropped", "hooks-a", "integrations", []),
        ("dropped", "hooks-b", "integrations", []),
    ]
    assert len([t for t, _, _ in producer.sent if t == TOPICS.deliveries]) == 2
    assert loop.finished == batch


def test_the_log_holds_call_bodies_only_when_asked_to() -> None:
    track = {"type": "track", "event": "Order", "userId": "u1", "messageId": "m1"}
    blocked = {"type": "track", "event": "Heartbeat", "userId": "u2", "messageId": "m2"}
    _, _, producer, _ = run([call_value(track), call_value(blocked)], log=True, log_bodies=True)
    bodies = [
        record["entries"][0]["body"]
        for t, _, v in producer.sent
        if t == TOPICS.log
        for record in decode_log_records(CODEC, v)
    ]
    expected = [
        render_body(parse_call(raw, source_id="web", received_at=1)).decode()
        for raw in (track, blocked)
    ]
    assert bodies == expected
    _, _, quiet, _ = run([call_value(track)])
    assert [t for t, _, _ in quiet.sent] == [TOPICS.deliveries, TOPICS.deliveries]


def test_a_batch_routes_drops_and_dead_letters_then_finishes_every_record() -> None:
    track = {"type": "track", "event": "Order", "userId": "u1", "messageId": "m1"}
    blocked = {"type": "track", "event": "Heartbeat", "userId": "u2"}
    _, loop, producer, batch = run([call_value(track), call_value(blocked), b"junk"])
    [a, b, dlq] = producer.sent
    assert [(topic, key) for topic, key, _ in (a, b)] == [
        (TOPICS.deliveries, b"hooks-a/u1"),
        (TOPICS.deliveries, b"hooks-b/u1"),
    ]
    record = CODEC.decode("Delivery", a[2])
    body = render_body(parse_call(track, source_id="web", received_at=1))
    assert (record["messageId"], record["destinationId"], record["body"], record["tier"]) == (
        "m1",
        "hooks-a",
        body,
        -1,
    )
    assert (dlq[0], dlq[1]) == (TOPICS.dlq, None)
    letter = CODEC.decode("DeadLetter", dlq[2])
    assert (letter["reason"], letter["raw"], letter["sourcePartition"], letter["sourceOffset"]) == (
        "undecodable",
        b"junk",
        1,
        2,
    )
    assert loop.finished == batch


def test_registry_down_stops_the_worker_and_finishes_nothing() -> None:
    handler, loop, producer, _ = run([b"anything"], codec=RegistryDown())
    assert isinstance(handler.fatal, SchemaRegistryUnavailable)
    assert loop.finished == [] and producer.sent == []


# ---- in transactions ------------------------------------------------------------------------------


@dataclass
class FakeTransactions:
    """One input partition's transactions: commits what it is given, or fails as scripted."""

    topic: str
    partition: int
    failures: list[Exception] = field(default_factory=list)
    commits: list[tuple[list[Any], int, Any]] = field(default_factory=list)
    fenced: bool = False
    closed: bool = False
    prepared: int = 0

    def prepare(self) -> None:
        self.prepared += 1

    def commit(self, records: Sequence[Any], *, next_offset: int, group: Any) -> None:
        if self.fenced:
            raise Fenced("fenced")
        if self.failures:
            failure = self.failures.pop(0)
            self.fenced = isinstance(failure, Fenced)
            raise failure
        self.commits.append((list(records), next_offset, group))

    def close(self) -> None:
        self.closed = True


@dataclass
class Transactional:
    """A router handing off in transactions, fed batch by batch."""

    failures: dict[int, list[Exception]] = field(default_factory=dict)
    made: list[FakeTransactions] = field(default_factory=list)
    loop: FakeLoop = field(default_factory=FakeLoop)
    producer: FakeProducer = field(default_factory=FakeProducer)
    parking: Any = None

    def new(self, topic: str, partition: int) -> FakeTransactions:
        made = FakeTransactions(topic, partition, self.failures.pop(partition, []))  # the first one
        self.made.append(made)
        return made

    def handler(self) -> RouterHandler:
        return RouterHandler(
            topics=TOPICS,
            follower=FakeFollower(TABLE),
            producer=self.producer,
            stop=asyncio.Event(),
            codec=CODEC,
            transactions=self.new,
            retake_after=6.0,
            parking=self.parking,
        )

    def run(self, *batches: list[Any]) -> None:
        async def go() -> None:
            handler = self.handler()
            assert handler.transactional
            for batch in batches:
                await handler.handle(batch, self.loop)
            await handler.aclose()

        asyncio.run(go())


def calls(partition: int, offsets: range) -> list[Any]:
    track = {"type": "track", "event": "Order", "userId": "u1"}
    return [taken(TOPICS.calls, call_value(track), partition=partition, offset=o) for o in offsets]


def test_each_partition_of_a_batch_commits_its_records_and_next_offset_together() -> None:
    router = Transactional()
    batch = calls(0, range(5, 8)) + calls(2, range(40, 42))
    router.run(batch)
    by_partition = {t.partition: t.commits for t in router.made}
    [(records, next_offset, group)] = by_partition[0]
    assert (len(records), next_offset, group) == (
        6,
        8,
        "group-metadata",
    )  # 3 calls × 2 destinations
    assert {topic for topic, _, _ in records} == {TOPICS.deliveries}
    [(records, next_offset, _)] = by_partition[2]
    assert (len(records), next_offset) == (4, 42)
    assert router.loop.finished == batch and router.producer.sent == []
    assert all(t.closed for t in router.made)


def test_an_aborted_transaction_is_tried_again_until_it_commits() -> None:
    router = Transactional(failures={0: [TransactionFailed("broker away"), TransactionFailed("x")]})
    batch = calls(0, range(3))
    router.run(batch)
    [made] = router.made
    assert [offset for _, offset, _ in made.commits] == [3]
    assert router.loop.finished == batch


def test_a_fenced_partition_pauses_then_starts_again_from_its_last_commit() -> None:
    router = Transactional(failures={1: [Fenced("a newer producer")]})
    first, other, later = calls(1, range(2)), calls(0, range(2)), calls(1, range(2))
    before = time.time()
    router.run(first + other, later)
    [(deferred, until)] = router.loop.deferred
    # Left to the new owner: nothing finished; paused one session timeout, sought back to it.
    assert deferred is first[0] and before + 6.0 <= until <= time.time() + 6.0
    assert router.loop.finished == other + later  # partition 0 is not affected
    fenced, _, again = router.made
    assert fenced.partition == again.partition == 1 and fenced.closed
    # Still assigned after the pause: a new producer takes the id back, from the same offset.
    assert [offset for _, offset, _ in again.commits] == [2]


def test_a_released_partition_gives_its_producer_up_and_a_new_assignment_makes_a_new_one() -> None:
    router = Transactional()

    async def go() -> None:
        handler = router.handler()
        await handler.handle(calls(1, range(2)), router.loop)
        handler.released([(TOPICS.calls, 1)])
        await handler.handle(calls(1, range(5, 6)), router.loop)
        first, second = router.made
        await handler.aclose()
        assert first.closed and [c[1] for c in second.commits] == [6]

    asyncio.run(go())


def test_assigned_partitions_take_their_transactional_ids_before_any_record() -> None:
    router = Transactional()

    async def go() -> None:
        handler = router.handler()
        handler.assigned([(TOPICS.calls, 0), (TOPICS.calls, 2)])
        assert [(t.partition, t.prepared, t.commits) for t in router.made] == [
            (0, 1, []),
            (2, 1, []),
        ]
        await handler.handle(calls(2, range(3)), router.loop)
        assert len(router.made) == 2 and [c[1] for c in router.made[1].commits] == [3]
        await handler.aclose()

    asyncio.run(go())


class ParksB:
    """A deliverer whose ``hooks-b`` endpoints are down: their records are parked one by one
    (the deliverer's own parker carries a batch's in one record: ``test_deliver_handler``)."""

    def __init__(self) -> None:
        self.parked = 0
        self.kept: list[Any] = []

    def __call__(self, key: bytes | None, value: bytes, destination: str, trace: Any = ()) -> bool:
        if destination != "hooks-b":
            return False
        self.parked += 1
        self.kept.append((TOPICS.retry[0], key, value, [("pipeline-park", b"0 1 2 3 hooks-b")]))
        return True

    def records(self) -> list[Any]:
        return self.kept


def test_records_the_parking_takes_are_produced_parked_instead() -> None:
    track = {"type": "track", "event": "Order", "userId": "u1", "messageId": "m1"}
    routed = metrics.DELIVERIES_ROUTED._value.get()
    _, loop, producer, batch = run([call_value(track)], parking=ParksB)
    by_topic = {record[0]: record for record in producer.sent}
    assert set(by_topic) == {TOPICS.deliveries, TOPICS.retry[0]}
    delivered, parked = by_topic[TOPICS.deliveries], by_topic[TOPICS.retry[0]]
    assert CODEC.decode("Delivery", delivered[2])["destinationId"] == "hooks-a"
    assert CODEC.decode("Delivery", parked[2])["destinationId"] == "hooks-b"  # as encoded
    assert parked[3] == [("pipeline-park", b"0 1 2 3 hooks-b")]
    assert metrics.DELIVERIES_ROUTED._value.get() == routed + 2  # routed, parked or not
    assert loop.finished == batch


def test_a_parked_record_goes_in_the_partitions_transaction_with_its_header() -> None:
    router = Transactional(parking=ParksB)
    router.run(calls(0, range(3)))
    [(records, next_offset, _)] = router.made[0].commits
    assert next_offset == 3
    assert sorted(r[0] for r in records) == [TOPICS.deliveries] * 3 + [TOPICS.retry[0]] * 3
    assert all(len(r) == 4 for r in records if r[0] == TOPICS.retry[0])


_ID = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}", fullmatch=True)


@settings(max_examples=100, deadline=None)
@given(
    names=st.lists(_ID, min_size=1, max_size=6, unique=True),
    message_id=st.text(min_size=1, max_size=80),
)
def test_a_calls_delivery_records_are_the_codecs_bytes_for_each_destination(
    names: list[str], message_id: str
) -> None:
    """The first is encoded, the others spliced from it: each is what the codec writes for it,
    whatever the lengths of the ids (past 63 bytes a length takes two bytes)."""
    call = parse_call(
        {"type": "track", "event": "E", "userId": "u", "messageId": message_id},
        source_id="web",
        received_at=1,
    )
    body = render_body(call)
    routed = Routed(
        call.type, Delivery.for_call(call, names[0], body), tuple((b"k", n) for n in names)
    )
    expected = [CODEC.encode("Delivery", delivery_to_record(d)) for _, d in routed.deliveries]
    assert [d.destination_id for _, d in routed.deliveries] == names
    assert routed.delivery is not None
    assert CODEC.delivery_values(routed.delivery, names) == expected


# ---- resends (``PIPELINE_DEDUPE_WINDOW``) ---------------------------------------------------------


def dedupe_in(directory: Any) -> Dedupe:
    state = PartitionState(
        Settings(), changelog=TOPICS.changelog("dedupe"), directory=str(directory), retention=60.0
    )
    state.assigned([1], restore=False)
    return Dedupe(state, 60.0)


def test_a_resend_is_dropped_logged_as_a_duplicate_and_remembered_after_its_hand_off(
    tmp_path: Any,
) -> None:
    dedupe = dedupe_in(tmp_path)
    dropped = metrics.CALLS_DROPPED.labels("duplicate")
    before = dropped._value.get()
    track = {"type": "track", "event": "Order", "userId": "u1", "messageId": "m1"}
    now = int(time.time() * 1000)
    value = CODEC.encode(
        "Call", call_to_record(parse_call(track, source_id="web", received_at=now))
    )
    _, loop, producer, batch = run([value, value], log=True, dedupe=dedupe)
    deliveries = [key for topic, key, *_ in producer.sent if topic == TOPICS.deliveries]
    assert deliveries == [b"hooks-a/u1", b"hooks-b/u1"]  # the first copy's, once
    assert dropped._value.get() == before + 1
    # Its changelog record went out after the routed records, to the input partition's.
    changelog = [r for r in producer.sent if r[0] == TOPICS.changelog("dedupe")]
    assert [(r[1], r[4]) for r in changelog] == [(b"web\x00m1", 1)]
    assert producer.sent.index(changelog[0]) > max(
        i for i, r in enumerate(producer.sent) if r[0] == TOPICS.deliveries
    )
    [log] = [v for t, k, v, *_ in producer.sent if t == TOPICS.log]
    first, resend = decode_log_records(CODEC, log)
    assert [e["kind"] for e in first["entries"]] == ["received", "routed"]
    [_, drop] = resend["entries"]
    assert (drop["kind"], drop["reason"]) == ("dropped", "duplicate")
    assert drop["error"] == f"a resend of the call first received at {format_timestamp(now)}"
    assert loop.finished == batch
    # The next batch's resend is recognised from the local store.
    _, _, later, _ = run([value], dedupe=dedupe)
    assert [r for r in later.sent if r[0] == TOPICS.deliveries] == []


def test_a_state_that_cannot_be_written_stops_the_router_with_the_batch_unfinished(
    tmp_path: Any,
) -> None:
    class Broken(Dedupe):
        def apply(self, taken: Any, ends: Any = None) -> None:
            raise OSError("No space left on device")

    dedupe = dedupe_in(tmp_path)
    broken = Broken(dedupe.state, 60.0)
    track = {"type": "track", "event": "Order", "userId": "u1", "messageId": "m1"}
    handler, loop, _, _ = run([call_value(track)], dedupe=broken)
    assert isinstance(handler.fatal, OSError)
    assert loop.finished == []  # routed again after a restart, its resends known or not


def test_without_dedupe_a_resend_is_routed_again() -> None:
    track = {"type": "track", "event": "Order", "userId": "u1", "messageId": "m1"}
    _, _, producer, _ = run([call_value(track), call_value(track)])
    assert len([r for r in producer.sent if r[0] == TOPICS.deliveries]) == 4


GOOD_TRACEPARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def traced_calls() -> tuple[list[bytes], list[list[tuple[str, bytes]] | None]]:
    """Two calls, the first with a valid ``traceparent``, the second with one that is not W3C
    (a record anyone may produce)."""
    calls = [
        call_value({"type": "track", "event": "Order", "userId": "u1", "messageId": "m1"}),
        call_value({"type": "track", "event": "Order", "userId": "u2", "messageId": "m2"}),
    ]
    return calls, [[("traceparent", GOOD_TRACEPARENT)], [("traceparent", b"00-4bf9\n")]]


@pytest.fixture
def pass_through() -> Iterator[None]:
    """Tracing off, contexts passed on (``PIPELINE_TRACE_PASS_THROUGH``)."""
    tracing.configure("test", {}, pass_through=True)
    yield
    tracing.configure("test", {})


def test_tracing_off_a_calls_context_names_its_trace_in_the_log_and_goes_no_further() -> None:
    calls, headers = traced_calls()
    _, _, producer, _ = run(calls, headers=headers, log=True)
    deliveries = [r for r in producer.sent if r[0] == TOPICS.deliveries]
    assert len(deliveries) == 4 and all(len(r) == 3 for r in deliveries)  # no headers
    ((_, _, value),) = [r for r in producer.sent if r[0] == TOPICS.log]
    received = [record["entries"][0] for record in decode_log_records(CODEC, value)]
    assert [e["traceId"] for e in received] == ["4bf92f3577b34da6a3ce929d0e0e4736", ""]


@pytest.mark.usefixtures("pass_through")
def test_passed_through_a_valid_context_goes_on_its_delivery_records() -> None:
    """Tracing off with ``trace_pass_through``: a valid ``traceparent`` is copied onto the call's
    delivery records as it came; one that is not W3C is dropped, the call routed as any."""
    calls, headers = traced_calls()
    _, _, producer, _ = run(calls, headers=headers)
    traced = [r for r in producer.sent if r[0] == TOPICS.deliveries]
    assert [r[3] if len(r) > 3 else None for r in traced] == [
        [("traceparent", GOOD_TRACEPARENT)],
        [("traceparent", GOOD_TRACEPARENT)],
        None,
        None,
    ]
