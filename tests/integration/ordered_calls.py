"""What the tests of ordered delivery share (tests/integration/test_ordering*.py): calls of a few
users, receivers that fail one call for a while, and what the receiver saw, per user and in order.
"""

from __future__ import annotations

import threading
import time
import zlib
from typing import Any

import orjson
from prometheus_client import REGISTRY

from pipeline.core.settings import Settings
from pipeline.kafka.clients import topics_for
from pipeline.kafka.codec import Codec
from pipeline.kafka.topic_reader import read_topic as read_to_end
from tests.support import Receiver, delivery_log_entries, simple_config

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


def on_the_partition_of(user: str, partitions: int) -> str:
    """A user whose calls to ``hooks`` share ``user``'s partition of ``deliveries`` (librdkafka's
    default partitioner: CRC32 of the key)."""
    wanted = zlib.crc32(f"hooks/{user}".encode()) % partitions
    return next(
        f"B{n}" for n in range(1000) if zlib.crc32(f"hooks/B{n}".encode()) % partitions == wanted
    )
