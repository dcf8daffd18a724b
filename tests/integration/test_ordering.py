"""Ordered delivery per user (``ordering: per_user``): real broker, real workers, real receiver.

A user's call that waits in a retry tier holds back that user's later calls to the destination,
which wait in the partition state, and go on, in order, once it has an outcome; other users'
calls flow on meanwhile. Each test prints its figures (``pytest -s``).
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from prometheus_client import REGISTRY

from pipeline.core.settings import Settings
from pipeline.kafka.clients import topics_for
from pipeline.kafka.codec import Codec
from pipeline.kafka.topic_reader import read_topic as read_to_end
from pipeline.ops.deletion import request_deletion
from tests.support import (
    Receiver,
    apply,
    dead_letters,
    delivery_log_entries,
    ready,
    run_cli,
    send_calls,
    simple_config,
    started,
    wait_for,
    wait_or_tell,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

#: How long the receiver refuses user A's third call.
FAILING = 5.0


def calls(user: str, count: int, event: str = "Step") -> list[dict[str, Any]]:
    return [
        {"type": "track", "userId": user, "event": event, "messageId": f"{user}-{i}"}
        for i in range(count)
    ]


def interleaved(*users: str, count: int = 5) -> list[dict[str, Any]]:
    """``count`` calls of each user, one user's after another's, in turn."""
    per_user = [calls(user, count) for user in users]
    return [call for row in zip(*per_user, strict=True) for call in row]


class FailsFor:
    """Answers 503 to ``message_id`` for ``seconds`` from its first request, 200 to the rest."""

    def __init__(self, message_id: str, seconds: float) -> None:
        self.message_id = message_id
        self.seconds = seconds
        self.first: float | None = None
        self.lock = threading.Lock()

    def again(self, seconds: float) -> None:
        """Fail it for ``seconds`` from its next request."""
        with self.lock:
            self.first, self.seconds = None, seconds

    def __call__(self, body: bytes) -> int:
        if orjson.loads(body).get("messageId") != self.message_id:
            return 200
        with self.lock:
            now = time.monotonic()
            if self.first is None:
                self.first = now
            return 503 if now - self.first < self.seconds else 200


def delivered_in_order(receiver: Receiver, user: str) -> list[tuple[str, float]]:
    """(messageId, when) of the user's requests answered 2xx, in the order they came."""
    with receiver.lock:
        return [
            (r.json.get("messageId"), r.at)
            for r in receiver.requests
            if r.json.get("userId") == user and isinstance(r.answer, int) and r.answer < 300
        ]


def first_request(receiver: Receiver, message_id: str, since: float = 0.0) -> float:
    with receiver.lock:
        return min(
            r.at
            for r in receiver.requests
            if r.json.get("messageId") == message_id and r.at >= since
        )


def unique(delivered: list[tuple[str, float]]) -> list[str]:
    """The messageIds in the order of their first delivery."""
    seen: list[str] = []
    for message_id, _ in delivered:
        if message_id not in seen:
            seen.append(message_id)
    return seen


def ordered_config(url: str, **destination: Any) -> dict[str, Any]:
    return simple_config(url, ordering="per_user", **destination)


def first_delivered(receiver: Receiver, user: str, since: float = 0.0) -> dict[str, float]:
    """When each of the user's calls was first delivered (since ``since``; a kill may deliver
    one again)."""
    first: dict[str, float] = {}
    for message_id, at in delivered_in_order(receiver, user):
        if at >= since:
            first.setdefault(message_id, at)
    return first


def assert_held_then_in_order(receiver: Receiver, *, others: tuple[str, ...] = ("B",)) -> None:
    """A's calls delivered in order, none of A's later ones asked before A-2 was delivered; the
    other users' delivered before it, while A waited."""
    a = delivered_in_order(receiver, "A")
    assert unique(a) == [f"A-{i}" for i in range(5)], a
    a2_delivered = first_delivered(receiver, "A")["A-2"]
    a3_asked = first_request(receiver, "A-3")
    assert a3_asked >= a2_delivered
    done = {}
    for user in others:
        theirs = first_delivered(receiver, user)
        assert list(theirs) == [f"{user}-{i}" for i in range(5)], theirs
        done[user] = max(theirs.values())
        assert done[user] < a2_delivered, f"{user} waited behind A"
    waited = a2_delivered - first_request(receiver, "A-2")
    print(
        f"A-2 delivered {waited:.1f} s after its first attempt, A-3 asked "
        f"{a3_asked - a2_delivered:.2f} s after that; the others done "
        + ", ".join(f"{a2_delivered - at:.1f} s before" for at in done.values())
    )


def test_a_waiting_call_holds_its_user_back_and_no_one_else(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    worker_factory: Callable[..., Any],
) -> None:
    """The receiver fails A's third call for 5 s: A's fourth and fifth arrive after it, B's calls
    meanwhile; an unordered destination of the same source delivers A's later calls at once."""
    ordered = receiver_factory(default=FailsFor("A-2", FAILING))
    unordered = receiver_factory(default=FailsFor("A-2", FAILING))
    config = ordered_config(ordered.url)
    config["destinations"].append(
        {"id": "plain", "name": "Plain", "sources": ["web"], "webhooks": [{"url": unordered.url}]}
    )
    apply(settings, config)
    worker_factory(settings, ("router", "deliver", "retry", "log-store"))
    send_calls(settings, interleaved("A", "B"), "wk")
    # While A-2 waits, `pipeline trace` says what A-3 waits for.
    wait_for(lambda: "held behind A-2" in run_cli(settings, "trace", "A-3").stdout, timeout=30)
    wait_for(lambda: len(unique(delivered_in_order(ordered, "A"))) == 5, timeout=60)
    wait_for(lambda: len(unique(delivered_in_order(unordered, "A"))) == 5, timeout=60)
    assert_held_then_in_order(ordered)
    plain = delivered_in_order(unordered, "A")
    a2_delivered = next(at for message_id, at in plain if message_id == "A-2")
    assert unique(plain)[-1] == "A-2", plain
    assert max(at for message_id, at in plain if message_id != "A-2") < a2_delivered
    # The log tells why waited, and what let them go.
    held = wait_for(
        lambda: {m: e["reason"] for m, e in delivery_log_entries(settings, "held")} or None
    )
    assert held == {"A-3": "A-2", "A-4": "A-2"}
    released = wait_for(lambda: delivery_log_entries(settings, "released") or None)
    assert [(m, e["destination"], e["reason"]) for m, e in released] == [
        ("A-2", "hooks", "delivered; 2 held calls went on: A-3, A-4")
    ]


def test_a_dead_lettered_call_lets_the_later_ones_go_in_order(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    worker_factory: Callable[..., Any],
) -> None:
    """A-2 fails past its retry deadline (8 s in tests): it is dead-lettered, and A-3, A-4 go on
    past it. Then `pipeline replay` of the range delivers A's calls again, in order (A-2 failing
    for 2 s holds A-3 and A-4 back again)."""
    failing = FailsFor("A-2", 3600)
    receiver = receiver_factory(default=failing)
    apply(settings, ordered_config(receiver.url))
    worker_factory(settings)
    send_calls(settings, interleaved("A", "B"), "wk")
    wait_for(lambda: len(unique(delivered_in_order(receiver, "A"))) == 4, timeout=60)
    a = delivered_in_order(receiver, "A")
    assert unique(a) == ["A-0", "A-1", "A-3", "A-4"], a
    [letter] = [d for d in dead_letters(settings, 1) if d["delivery"]["messageId"] == "A-2"]
    assert "go on past it" in letter["detail"]
    with receiver.lock:
        last_a2 = max(r.at for r in receiver.requests if r.json.get("messageId") == "A-2")
    assert first_request(receiver, "A-3") > last_a2
    # A-2's failures may have opened the endpoint's circuit: A-3 then waits its turn in a retry
    # tier (and holds A-4) until it closes.
    released = dict(wait_for(lambda: delivery_log_entries(settings, "released") or None))
    assert released["A-2"]["reason"] in (
        "dead_lettered; 2 held calls went on past it: A-3, A-4",
        "dead_lettered; A-3 is next, and waits in a retry tier",
    )
    # `dlq replay` says what a replay does to order.
    replay = run_cli(settings, "dlq", "replay", "--dry-run")
    assert "note: hooks deliver each user's calls in order" in replay.stdout, replay.stdout
    failing.again(2.0)
    replayed_at = time.time()
    replayed = run_cli(settings, "replay", "--destination", "hooks", "--since", "1h", "--yes")
    assert replayed.returncode == 0, replayed.stderr
    wait_for(lambda: len(first_delivered(receiver, "A", replayed_at)) == 5, timeout=60)
    again = first_delivered(receiver, "A", replayed_at)
    assert list(again) == [f"A-{i}" for i in range(5)], again
    assert first_request(receiver, "A-3", replayed_at) >= again["A-2"]


class Switch:
    """Answers 503 to ``message_id`` until ``open()``, 200 to everything else."""

    def __init__(self, message_id: str) -> None:
        self.message_id = message_id
        self.failing = True

    def open(self) -> None:
        self.failing = False

    def __call__(self, body: bytes) -> int:
        failing = self.failing and orjson.loads(body).get("messageId") == self.message_id
        return 503 if failing else 200


#: A-2 may wait across a kill and a rebalance (a session timeout, 6 s, and a group join) without
#: reaching its retry deadline.
PATIENT = {"retry": {"delays": ["1s", "2s"], "deadline": "2m"}}


def test_a_held_user_stays_held_across_a_sigkill(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    process_factory: Callable[..., subprocess.Popen[bytes]],
) -> None:
    switch = Switch("A-2")
    receiver = receiver_factory(default=switch)
    apply(settings, ordered_config(receiver.url, **PATIENT))
    first, first_log = started(process_factory, settings, "worker")
    ready((first_log, "deliver"), (first_log, "retry"))
    send_calls(settings, interleaved("A", "B"), "wk")
    logs = {"killed worker": first_log}
    # wait in the state, behind A-2, when the worker is killed.
    wait_or_tell(
        lambda: {m for m, _ in delivery_log_entries(settings, "held")} == {"A-3", "A-4"},
        60,
        logs,
        lambda: f"delivered {unique(delivered_in_order(receiver, 'A'))}",
    )
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    killed_at = time.time()
    _, second_log = started(process_factory, settings, "worker")
    logs["new worker"] = second_log
    ready((second_log, "deliver"), (second_log, "retry"))
    switch.open()
    wait_or_tell(
        lambda: len(unique(delivered_in_order(receiver, "A"))) == 5,
        90,
        logs,
        lambda: f"delivered {unique(delivered_in_order(receiver, 'A'))}",
    )
    assert_held_then_in_order(receiver)
    after = first_request(receiver, "A-3") - killed_at
    print(f"killed while A was held; A-3 first asked {after:.1f} s after the kill")
    assert first_request(receiver, "A-3") > killed_at


def test_two_workers_keep_each_users_order(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    process_factory: Callable[..., subprocess.Popen[bytes]],
) -> None:
    receiver = receiver_factory(default=FailsFor("A-2", FAILING))
    apply(settings, ordered_config(receiver.url, **PATIENT))
    _, first_log = started(process_factory, settings, "worker")
    _, second_log = started(process_factory, settings, "worker")
    both = ((first_log, "deliver"), (second_log, "deliver"), (first_log, "retry"))
    ready(*both, (second_log, "retry"))
    users = ("A", "B", "C", "D", "E", "F")
    send_calls(settings, interleaved(*users), "wk")
    logs = {"first worker": first_log, "second worker": second_log}
    wait_or_tell(
        lambda: all(len(unique(delivered_in_order(receiver, u))) == 5 for u in users),
        90,
        logs,
        lambda: f"delivered {[unique(delivered_in_order(receiver, u)) for u in users]}",
    )
    assert_held_then_in_order(receiver, others=users[1:])


def held_users(destination: str = "hooks") -> float:
    """``pipeline_ordering_held_users`` of ``destination`` (the worker runs in this process)."""
    sample = REGISTRY.get_sample_value("pipeline_ordering_held_users", {"destination": destination})
    return sample or 0.0


def dead_lettered(settings: Settings, *message_ids: str) -> dict[tuple[str, str], str]:
    """(destination, messageId) → reason of the dead letters of ``message_ids`` now."""
    found = {}
    for message in read_to_end(settings, topics_for(settings).dlq):
        letter = Codec.default().decode("DeadLetter", message.value())
        delivery = letter["delivery"]
        if delivery is not None and delivery["messageId"] in message_ids:
            found[(delivery["destinationId"], delivery["messageId"])] = letter["reason"]
    return found


def held(settings: Settings) -> set[str]:
    return {message_id for message_id, _ in delivery_log_entries(settings, "held")}


def test_a_deletion_request_releases_the_user(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    worker_factory: Callable[..., Any],
) -> None:
    """The calls held behind A-2 are suppressed by a deletion request for A, and the delete call
    itself goes at once, A-2 still failing."""
    receiver = receiver_factory(default=Switch("A-2"))
    apply(settings, ordered_config(receiver.url, **PATIENT))
    worker_factory(settings)
    send_calls(settings, interleaved("A", "B"), "wk")
    wait_for(lambda: held(settings) == {"A-3", "A-4"}, timeout=60)
    assert held_users() == 1
    request_deletion(settings, "A")
    wait_for(lambda: any(b["type"] == "delete" for b in receiver.delivered()), timeout=30)
    suppressed = wait_for(
        lambda: {m for m, e in delivery_log_entries(settings, "suppressed")} >= {"A-3", "A-4"}
    )
    assert suppressed
    assert held_users() == 0
    with receiver.lock:
        asked = {r.json.get("messageId") for r in receiver.requests}
    assert not asked & {"A-3", "A-4"}


def test_a_destination_disabled_deleted_or_unordered_releases_its_users(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    worker_factory: Callable[..., Any],
) -> None:
    """Held calls of a destination disabled, and of one deleted, are dead-lettered with the
    reason, and those of one set back to ``ordering: none`` delivered, without waiting for the
    call that held them (A-2, failing throughout)."""
    receivers = {name: receiver_factory(default=Switch("A-2")) for name in ("hooks", "b", "c")}
    config = ordered_config(receivers["hooks"].url, **PATIENT)
    for name in ("b", "c"):
        config["destinations"].append(
            {
                "id": name,
                "name": name.upper(),
                "sources": ["web"],
                "webhooks": [{"url": receivers[name].url}],
                "ordering": "per_user",
                **PATIENT,
            }
        )
    apply(settings, config)
    worker_factory(settings)
    send_calls(settings, calls("A", 5), "wk")
    wait_for(lambda: all(held_users(name) == 1 for name in receivers), timeout=60)
    hooks, _, c = config["destinations"]
    config["destinations"] = [dict(hooks, enabled=False), dict(c, ordering="none")]
    apply(settings, config)
    wait_for(lambda: len(dead_lettered(settings, "A-3", "A-4")) == 4, timeout=30)
    assert dead_lettered(settings, "A-3", "A-4") == {
        ("hooks", "A-3"): "destination_disabled",
        ("hooks", "A-4"): "destination_disabled",
        ("b", "A-3"): "destination_deleted",
        ("b", "A-4"): "destination_deleted",
    }
    wait_for(lambda: set(first_delivered(receivers["c"], "A")) >= {"A-3", "A-4"}, timeout=30)
    assert all(held_users(name) == 0 for name in receivers)
    for name in ("hooks", "b"):
        with receivers[name].lock:
            assert not {r.json.get("messageId") for r in receivers[name].requests} & {"A-3", "A-4"}


class DownFor:
    """Answers 503 to everything for ``seconds`` from the first request, then 200."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.first: float | None = None

    def __call__(self, body: bytes) -> int:
        now = time.monotonic()
        if self.first is None:
            self.first = now
        return 503 if now - self.first < self.seconds else 200


def test_an_outage_and_a_rate_limit_keep_each_users_order(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    worker_factory: Callable[..., Any],
) -> None:
    """``hooks``' endpoint is down for 3 s (its circuit opens, its calls are parked); ``paced``
    takes 20 calls a second (calls over the rate are parked): each user's calls still arrive in
    order at both."""
    down = receiver_factory(default=DownFor(3.0))
    paced = receiver_factory()
    config = ordered_config(down.url, **PATIENT)
    config["destinations"].append(
        {
            "id": "paced",
            "name": "Paced",
            "sources": ["web"],
            "webhooks": [{"url": paced.url}],
            "ordering": "per_user",
            "rate_limit": 20,
            **PATIENT,
        }
    )
    apply(settings, config)
    worker_factory(settings)
    users = ("A", "B", "C")
    send_calls(settings, interleaved(*users, count=10), "wk")
    for receiver in (down, paced):
        wait_for(
            lambda receiver=receiver: all(len(first_delivered(receiver, u)) == 10 for u in users),
            timeout=90,
        )
        for user in users:
            delivered = first_delivered(receiver, user)
            assert list(delivered) == [f"{user}-{i}" for i in range(10)]
            for i in range(1, 10):  # no call asked before the one ahead of it was delivered
                assert first_request(receiver, f"{user}-{i}") >= delivered[f"{user}-{i - 1}"]


def on_the_partition_of(user: str, partitions: int) -> str:
    """A user whose calls to ``hooks`` share ``user``'s partition of ``deliveries`` (librdkafka's
    default partitioner: CRC32 of the key)."""
    wanted = zlib.crc32(f"hooks/{user}".encode()) % partitions
    return next(
        f"B{n}" for n in range(1000) if zlib.crc32(f"hooks/B{n}".encode()) % partitions == wanted
    )


def test_a_busy_user_spills_to_the_state_and_holds_no_one_back(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    worker_factory: Callable[..., Any],
) -> None:
    """A's 400 calls come faster than one at a time can deliver them (10 ms each): past 100 in
    memory, A's lane moves them to the state, so they neither fill the worker's in-flight limit
    (200) nor stand in the way of B's calls behind them in the same partition: B's calls are
    delivered before A's 150th; A's in order."""
    receiver = receiver_factory(delay=0.01)
    apply(settings, ordered_config(receiver.url))
    worker_factory(settings.model_copy(update={"max_in_flight": 200}))
    b_user = on_the_partition_of("A", settings.partitions)
    send_calls(settings, calls("A", 400) + calls(b_user, 10), "wk")
    wait_for(lambda: len(first_delivered(receiver, "A")) == 400, timeout=120)
    a = first_delivered(receiver, "A")
    assert list(a) == [f"A-{i}" for i in range(400)]
    for i in range(1, 400):  # none asked before the one ahead of it was delivered
        assert first_request(receiver, f"A-{i}") >= a[f"A-{i - 1}"]
    b = first_delivered(receiver, b_user)
    assert list(b) == [f"{b_user}-{i}" for i in range(10)]
    assert max(b.values()) < a["A-150"]
    print(f"{b_user} done {a['A-399'] - max(b.values()):.1f} s before A's last call")
