"""After a deletion request, nothing of that user still pending reaches a receiver: real broker,
real worker, real receiver."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from prometheus_client import REGISTRY

from pipeline.core.settings import Settings
from pipeline.core.timestamps import format_timestamp
from pipeline.ops.deletion import request_deletion
from tests.support import (
    Receiver,
    apply,
    by_attempt,
    dead_letters,
    delivery_log_entries,
    run_cli,
    send_calls,
    simple_config,
    wait_for,
)

pytestmark = pytest.mark.integration


def suppressed_metric() -> float:
    """``pipeline_suppressed_total`` of destination ``hooks`` (the worker runs in this process)."""
    return REGISTRY.get_sample_value("pipeline_suppressed_total", {"destination": "hooks"}) or 0.0


def calls(user: str, event: str, count: int) -> list[dict[str, Any]]:
    return [
        {"type": "track", "userId": user, "event": event, "messageId": f"{user}-{event}-{i}"}
        for i in range(count)
    ]


def requests_of(receiver: Receiver, user: str, event: str) -> list[tuple[str, float]]:
    """(messageId, when) of every request for ``user``'s calls of ``event``."""
    with receiver.lock:
        return [
            (r.json["messageId"], r.at)
            for r in receiver.requests
            if r.json.get("userId") == user and r.json.get("event") == event
        ]


def delivered(receiver: Receiver, user: str) -> int:
    return len({b["messageId"] for b in receiver.delivered() if b.get("userId") == user})


def suppressed(settings: Settings) -> set[str]:
    return {message_id for message_id, _ in delivery_log_entries(settings, "suppressed")}


def test_pending_retries_are_suppressed_and_later_calls_delivered(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    worker_factory: Callable[..., Any],
) -> None:
    others = by_attempt(503, then=200)

    def answer(body: bytes) -> int:
        call = orjson.loads(body)
        if call.get("event") != "Before":
            return 200  # the delete call, and calls after the request
        return 503 if call["userId"] == "gone" else others(body)

    receiver = receiver_factory(default=answer)
    apply(settings, simple_config(receiver.url))
    worker_factory(settings)
    before = suppressed_metric()
    send_calls(settings, calls("gone", "Before", 10) + calls("stays", "Before", 10), "wk")
    # Every call of the user failed once: they wait in the retry tiers.
    wait_for(lambda: len({m for m, _ in requests_of(receiver, "gone", "Before")}) == 10)

    outcome = request_deletion(settings, "gone")
    assert outcome.notified == ["web"]
    send_calls(settings, calls("gone", "After", 3), "wk")  # the user came back

    pending = {f"gone-Before-{i}" for i in range(10)}
    wait_for(lambda: suppressed(settings) >= pending, timeout=30)
    assert suppressed(settings) == pending
    assert suppressed_metric() - before == 10
    # Not attempted once the workers knew of the request (they follow it within a second).
    known = outcome.requested_at / 1000 + 1.0
    assert [m for m, at in requests_of(receiver, "gone", "Before") if at > known] == []
    wait_for(lambda: len({m for m, _ in requests_of(receiver, "gone", "After")}) == 3)
    wait_for(lambda: any(b["type"] == "delete" for b in receiver.delivered()))
    wait_for(lambda: delivered(receiver, "stays") == 10)  # other users' retries go on


def test_dead_letter_replays_and_range_replays_are_suppressed(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    worker_factory: Callable[..., Any],
) -> None:
    first_refused = by_attempt(400, then=200)  # a permanent failure: straight to the DLQ

    def answer(body: bytes) -> int:
        return 200 if orjson.loads(body)["type"] == "delete" else first_refused(body)

    receiver = receiver_factory(default=answer)
    apply(settings, simple_config(receiver.url))
    worker_factory(settings)
    before = suppressed_metric()
    started = time.time() - 1
    send_calls(settings, calls("gone", "Before", 5) + calls("stays", "Before", 5), "wk")
    dead_letters(settings, 10)
    request_deletion(settings, "gone")
    wait_for(lambda: any(b["type"] == "delete" for b in receiver.delivered()))

    replayed = run_cli(settings, "dlq", "replay")
    assert replayed.returncode == 0, replayed.stderr
    assert "replayed 10;" in replayed.stdout
    gone = {f"gone-Before-{i}" for i in range(5)}
    wait_for(lambda: suppressed(settings) >= gone, timeout=30)
    wait_for(lambda: len(requests_of(receiver, "stays", "Before")) == 10)  # refused, then replayed
    assert len(requests_of(receiver, "gone", "Before")) == 5  # only the refused first attempts

    # A range replay begun after the request: the user's older calls are suppressed again.
    again = run_cli(
        settings,
        "replay",
        "--destination",
        "hooks",
        "--since",
        format_timestamp(int(started * 1000)),
        "--yes",
    )
    assert again.returncode == 0, again.stderr
    wait_for(lambda: len(requests_of(receiver, "stays", "Before")) == 15)
    wait_for(lambda: len(delivery_log_entries(settings, "suppressed")) == 10, timeout=30)
    entries = delivery_log_entries(settings, "suppressed")
    assert sorted(m for m, _ in entries) == sorted([*gone, *gone])  # DLQ replay, range replay
    assert {e["reason"] for _, e in entries} == {"deletion_request"}
    assert len(requests_of(receiver, "gone", "Before")) == 5
    assert suppressed_metric() - before == 10
