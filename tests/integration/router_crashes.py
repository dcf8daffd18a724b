"""What the router crash tests share (``test_crash_router.py``, ``test_router_zombie.py``).

The router crashes mid-stream (SIGKILL, or SIGSTOP as a zombie): nothing is lost, and with
transactions a crash doubles at most what one open transaction held.

Each test prints ``sent N, delivered U unique, D duplicates (bound B), at kill K`` (``pytest -s``).

The embedded broker (tansu 0.6) does not hide aborted transactions from read_committed readers,
and a new producer of the same transactional id makes the killed producer's open transaction
visible. So here a router killed mid-transaction can leave one open transaction's records behind
(at most one consume batch, ``OPEN_TRANSACTION`` = 500 calls); on Apache Kafka that allowance is 0.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from pipeline.core.settings import Settings
from pipeline.kafka.clients import topics_for
from pipeline.kafka.codec import Codec
from pipeline.kafka.topic_reader import read_topic
from tests.support import (
    ChunkedSender,
    Receiver,
    Stderr,
    apply,
    caught_up,
    crash_calls,
    delivery_figures,
    group_positions,
    positions,
    ready,
    simple_config,
    started,
    topic_ends,
    transactions_stall_is_expected,
    unique_delivered,
    wait_for,
    wait_or_tell,
)

CALLS = 3000
#: Calls go out in chunks of ``CHUNK``: each ``send_calls`` takes about 1 s (it loads the config
#: and waits for Kafka's acknowledgements), so 4 chunks make a stream of some 4 s; the kill, at a
#: third (not a chunk boundary), lands while the router works on the second chunk.
CHUNK = 750
#: A short pause between chunks (load pacing, not waiting for a condition).
PACE = 0.05
#: The deliver role's in-flight limit and the receiver's answer delay: it keeps up with the router,
#: so the receiver's count follows the delivery records the router produced.
#: With transactions, the delivery log stays off: each router transaction then spans the
#: deliveries topic only, as when these bounds were measured. Tansu 0.6 sometimes never makes a
#: killed producer's open transaction readable (docs/decisions.md); the first full run with the
#: log's records in the router's transactions stalled so here. That the log's records go into the
#: transaction is tested in tests/unit/roles/test_router_handler.py.
TRANSACTIONS_ON = {
    "PIPELINE_TRANSACTIONS": "on",
    "PIPELINE_LOG": "off",
    "PIPELINE_DEDUPE_WINDOW": "off",
}
#: The same with the router's dedupe on: its changelog records are in the same transactions.
TRANSACTIONS_ON_DEDUPE = {**TRANSACTIONS_ON, "PIPELINE_DEDUPE_WINDOW": "1h"}
TRANSACTIONS_OFF = {"PIPELINE_TRANSACTIONS": "off"}
DELIVER_ENV = {"PIPELINE_MAX_IN_FLIGHT": "100", "PIPELINE_COMMIT_INTERVAL": "100ms"}
RECEIVER_DELAY = 0.01
#: What one router transaction can hold (one consume batch): the tansu allowance, 0 on Kafka.
OPEN_TRANSACTION = 500
TANSU_NOTE = (
    f"bound {OPEN_TRANSACTION} = one open transaction that tansu 0.6 lets through after the "
    "next owner initialises its id; on Apache Kafka it is 0"
)


def router_bound() -> int:
    """Duplicates a router crash may cause with transactions (tansu; 0 on Apache Kafka)."""
    return OPEN_TRANSACTION


def progress(receiver: Receiver, settings: Settings) -> Callable[[], str]:
    """What a failed wait tells: the deliveries so far and where each group stands."""
    return lambda: (
        f"{unique_delivered(receiver)} of {CALLS} delivered, {receiver.count()} requests\n"
        + positions(
            settings,
            {"router": topics_for(settings).calls, "deliver": topics_for(settings).deliveries},
        )
    )


def sender(settings: Settings) -> ChunkedSender:
    """The stream: ``CALLS`` calls in chunks of ``CHUNK``, ``PACE`` apart, started."""
    stream = ChunkedSender(settings, crash_calls(CALLS), CHUNK, PACE)
    stream.start()
    return stream


def everything(settings: Settings, receiver: Receiver, logs: dict[str, Stderr]) -> None:
    """Wait until every call is delivered and both groups committed the end of their topics."""
    topics = topics_for(settings)
    roles = {"router": [topics.calls], "deliver": [topics.deliveries]}
    told = progress(receiver, settings)
    all_delivered = until_quiet(lambda: unique_delivered(receiver), CALLS, QUIET)
    wait_or_tell(all_delivered, 90, logs, told)
    wait_or_tell(lambda: caught_up(settings, roles), 45, logs, told, 0.5)


#: No call delivered for this long while some are missing: the stream has stalled (a router
#: taking over takes about a session timeout, 6 s, to start routing).
QUIET = 25.0


def until_quiet(count: Callable[[], int], expected: int, quiet: float) -> Callable[[], bool]:
    """A predicate: ``count()`` reached ``expected``; fails at once when it has not moved for
    ``quiet`` seconds (a stalled transaction is then told apart without waiting out the
    whole timeout)."""
    last, moved = -1, time.monotonic()

    def reached() -> bool:
        nonlocal last, moved
        now = count()
        if now != last:
            last, moved = now, time.monotonic()
        elif time.monotonic() - moved > quiet:
            raise AssertionError(f"{now} of {expected}, none more for {quiet:.0f} s")
        return now >= expected

    return reached


def delivery_records(settings: Settings) -> Counter[str]:
    """Delivery records on the deliveries topic, by message id (the whole topic)."""
    codec = Codec.default()
    return Counter(
        codec.decode("Delivery", record.value())["messageId"]
        for record in read_topic(settings, topics_for(settings).deliveries)
    )


def figures(name: str, receiver: Receiver, bound: int | None, at_kill: int, sent: int) -> int:
    return delivery_figures(name, receiver, CALLS, bound, at_kill, f"{sent} calls sent then")


def topic_figures(settings: Settings) -> int:
    records = delivery_records(settings)
    duplicates = sum(n - 1 for n in records.values())
    print(
        f"  deliveries topic: {sum(records.values())} records, {len(records)} message ids, "
        f"{duplicates} duplicates"
    )
    return duplicates


def streamed_a_third(
    settings: Settings,
    receiver: Receiver,
    process_factory: Callable[..., subprocess.Popen[bytes]],
    router_env: dict[str, str],
) -> tuple[subprocess.Popen[bytes], Stderr, Stderr, ChunkedSender]:
    """Router and deliver in their own processes, ready, and the stream going until about a
    third of the calls arrived: the router, both logs and the stream."""
    apply(settings, simple_config(receiver.url))
    router, router_log = started(process_factory, settings, "router", router_env)
    _, deliver_log = started(process_factory, settings, "deliver", DELIVER_ENV)
    ready((router_log, "router"), (deliver_log, "deliver"))
    stream = sender(settings)
    wait_for(lambda: receiver.count() >= CALLS // 3, timeout=60, interval=0.01)
    return router, router_log, deliver_log, stream


def kill_router_mid_stream(
    settings: Settings,
    receiver: Receiver,
    process_factory: Callable[..., subprocess.Popen[bytes]],
    router_env: dict[str, str],
) -> tuple[int, int]:
    """Router and deliver in their own processes; SIGKILL the router at about a third of the
    calls, restart it, wait for every call. Returns the receiver's count at the kill and the
    calls sent by then."""
    streamed = streamed_a_third(settings, receiver, process_factory, router_env)
    router, router_log, deliver_log, stream = streamed
    router.send_signal(signal.SIGKILL)
    router.wait(10)
    at_kill, sent = receiver.count(), stream.sent
    assert sent < CALLS, "the stream ended before the kill: pace it slower"

    _, successor_log = started(process_factory, settings, "router", router_env)
    stream.finish()
    logs = {"killed router": router_log, "deliver": deliver_log, "new router": successor_log}
    everything(settings, receiver, logs)
    return at_kill, sent


def passed_unseen(settings: Settings, receiver: Receiver) -> list[int]:
    """Partitions of the deliveries topic where the deliver group committed past records it
    never delivered although a read_committed reader sees them now; empty unless every call
    the receiver lacks is such a record. Seen once in CI on tansu 0.6 with router transactions
    (93 calls: one killed transaction's records, shown to the deliver group's reader only after
    it had read past them, while the next router restored that transaction's dedupe entries).
    On Apache Kafka the killed transaction is aborted whole, changelog entries included."""
    missing = {f"m-{i}" for i in range(CALLS)} - {b["messageId"] for b in receiver.delivered()}
    codec = Codec.default()
    where: dict[str, tuple[int, int]] = {}
    for record in read_topic(settings, topics_for(settings).deliveries):
        message_id = codec.decode("Delivery", record.value())["messageId"]
        partition, offset = record.partition(), record.offset()
        if message_id in missing and partition is not None and offset is not None:
            where[message_id] = (partition, offset)
    committed = group_positions(settings, "deliver", topics_for(settings).deliveries)
    if not missing or set(where) != missing:
        return []
    if any(offset >= committed.get(partition, 0) for partition, offset in where.values()):
        return []
    return sorted({partition for partition, _ in where.values()})


def routed_never(settings: Settings, receiver: Receiver) -> int:
    """How many calls the receiver lacks that are on no delivery record at all, although the
    router group committed the end of ``calls``: routed in a transaction that was aborted (the
    killed router's) while its consumed offsets counted. On Apache Kafka an aborted
    transaction's offsets are aborted with it; tansu 0.6 was seen to keep them (CI: 94 calls).
    0 when anything else explains the missing calls."""
    missing = {f"m-{i}" for i in range(CALLS)} - {b["messageId"] for b in receiver.delivered()}
    if not missing:
        return 0
    codec = Codec.default()
    topics = topics_for(settings)
    for record in read_topic(settings, topics.deliveries):
        if codec.decode("Delivery", record.value())["messageId"] in missing:
            return 0  # on the topic: not this fault
    committed = group_positions(settings, "router", topics.calls)
    ends = topic_ends(settings, topics.calls)
    if any(committed.get(partition, 0) < end for partition, end in ends.items()):
        return 0  # the router has not finished: not this fault
    return len(missing)


@contextmanager
def tansu_transaction_faults_expected(settings: Settings, receiver: Receiver) -> Iterator[None]:
    """``transactions_stall_is_expected`` on the deliveries topic, and the same for records
    the deliver group was not shown before it read past them (``passed_unseen``)."""
    with transactions_stall_is_expected(settings, topics_for(settings).deliveries):
        try:
            yield
        except AssertionError:
            passed = passed_unseen(settings, receiver)
            if passed:
                pytest.xfail(
                    "tansu 0.6 showed the deliver group's read_committed reader the deliveries "
                    f"topic without records it shows now (partitions {passed}); see "
                    "docs/decisions.md, Kafka"
                )
            lost = routed_never(settings, receiver)
            if lost:
                pytest.xfail(
                    f"tansu 0.6 kept the consumed offsets of an aborted router transaction: {lost} "
                    "calls routed in it were never routed again; see docs/decisions.md, Kafka"
                )
            raise
