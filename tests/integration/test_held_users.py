"""Held users of ordered destinations, read back from the ordering changelog: by
``pipeline.ops.ordering.held_users`` and by ``pipeline stats`` (text and JSON), with hand-made
changelog records (holds, a tombstone, a queued call, a hold past the retention) and with a real
hold of a real worker; Kafka unreachable and a changelog topic not created yet.
(The console's line: tests/integration/test_console.py.)
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from pipeline.core.held_users import RETENTION, HeldUsers
from pipeline.core.settings import Settings
from pipeline.core.timestamps import format_timestamp, now_ms
from pipeline.kafka.clients import topics_for
from pipeline.ops.ordering import held_users
from pipeline.runtime.net import free_port
from tests.support import Receiver, apply, run_cli, send_calls, simple_config, wait_for

pytestmark = pytest.mark.integration

MINUTE_MS = 60_000


def held_key(destination_user: str) -> bytes:
    return b"h\x00" + destination_user.encode()


def at(ms: int, payload: bytes = b"") -> bytes:
    """A state value: 8-byte big-endian epoch ms, then the payload."""
    return ms.to_bytes(8, "big") + payload


def produce_changelog(settings: Settings, now: int) -> int:
    """Hand-made ordering changelog records, as the deliver role writes them (a key always in
    one partition). Returns the oldest live hold's time: ``hooks/u1``'s."""
    oldest = now - 4 * MINUTE_MS - 30_000
    queued = b"q\x00hooks/u1\x00" + (42).to_bytes(8, "big")
    records: list[tuple[int, bytes, bytes | None]] = [
        (0, held_key("hooks/u1"), at(oldest, b"m-blocker-1")),
        (0, queued, at(now, b"\x00avro record of the queued call")),
        (1, held_key("hooks/u2"), at(now - MINUTE_MS, b"m-2")),
        (1, held_key("crm/u3"), at(now - 10_000, b"m-3")),
        # Held, then released: gone.
        (2, held_key("hooks/u4"), at(now - 9 * MINUTE_MS, b"m-4")),
        (2, held_key("hooks/u4"), None),
        # Past the state's retention: the state reads it as absent.
        (2, held_key("hooks/u5"), at(now - int(RETENTION * 1000) - MINUTE_MS, b"m-5")),
        # A destination whose only hold is released.
        (0, held_key("gone/u6"), at(now - MINUTE_MS, b"m-6")),
        (0, held_key("gone/u6"), None),
    ]
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    topic = topics_for(settings).changelog("ordering")
    for partition, key, value in records:
        producer.produce(topic, key=key, value=value, partition=partition)
    assert producer.flush(10) == 0
    return oldest


def expected(now: int, oldest: int) -> dict[str, HeldUsers]:
    return {
        "crm": HeldUsers(1, now - 10_000, "u3", "m-3"),
        "hooks": HeldUsers(2, oldest, "u1", "m-blocker-1"),
    }


def test_held_users_counts_the_latest_holds_per_destination(settings: Settings) -> None:
    now = now_ms()
    oldest = produce_changelog(settings, now)
    wait_for(lambda: held_users(settings, now=now) == expected(now, oldest), timeout=30)


def test_stats_shows_held_users_per_destination(settings: Settings) -> None:
    now = now_ms()
    oldest = produce_changelog(settings, now)
    wait_for(lambda: held_users(settings, now=now) == expected(now, oldest), timeout=30)
    since = HeldUsers(2, oldest, "u1", "m").since_text(now_ms())  # "…Z, 4m ago"
    crm_since = format_timestamp(now - 10_000)[:-5] + "Z"
    text = run_cli(settings, "stats")
    assert text.returncode == 0, text.stderr
    crm, hooks = text.stdout.splitlines()
    assert re.fullmatch(rf"crm: 1 user held \(oldest since {crm_since}, \d+s ago\)", crm), crm
    assert hooks == f"hooks: 2 users held (oldest since {since})"
    assert "stats: no deliveries in that window" in text.stderr

    result = run_cli(settings, "stats", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["destination"]: row for row in map(orjson.loads, result.stdout.splitlines())}
    assert set(rows) == {"crm", "hooks"}
    hooks = rows["hooks"]
    assert (hooks["held_users"], hooks["oldest_held_user"], hooks["oldest_held_behind"]) == (
        2,
        "u1",
        "m-blocker-1",
    )
    assert hooks["oldest_held_since"] == format_timestamp(oldest)
    assert (hooks["attempts"], hooks["waiting"], hooks["success_ratio"]) == (0, 0, None)
    assert rows["crm"]["held_users"] == 1


def test_stats_without_kafka_says_held_users_are_unknown(settings: Settings) -> None:
    nobody = {"PIPELINE_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}"}
    text = run_cli(settings, "stats", env=nobody)
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines() == ["held users: unknown (Kafka unreachable)"]
    assert "Traceback" not in text.stderr
    result = run_cli(settings, "stats", "--json", env=nobody)
    assert (result.returncode, result.stdout) == (0, "")
    assert "stats: held users: unknown (Kafka unreachable)" in result.stderr


def test_a_changelog_topic_not_created_yet_means_no_held_users(settings: Settings) -> None:
    uncreated = settings.replace(topic_prefix=settings.topic_prefix + "uncreated.")
    assert held_users(uncreated) == {}
    text = run_cli(uncreated, "stats")
    assert (text.returncode, text.stdout) == (0, ""), text.stderr
    assert "stats: no deliveries in that window" in text.stderr


def test_a_real_hold_is_counted_until_its_call_goes_on(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    worker_factory: Callable[..., Any],
) -> None:
    """A-1 fails until let through: A is held behind it (A-2 queued), B is not; once A-1 is
    delivered, the hold's tombstone leaves no held user."""
    through = threading.Event()

    def answer(body: bytes) -> int:
        refused = orjson.loads(body).get("messageId") == "A-1" and not through.is_set()
        return 503 if refused else 200

    receiver = receiver_factory(default=answer)
    apply(settings, simple_config(receiver.url, ordering="per_user", retry={"deadline": "1h"}))
    worker_factory(settings)
    calls = [
        {"type": "track", "userId": user, "event": "Step", "messageId": f"{user}-{i}"}
        for i in range(3)
        for user in ("A", "B")
    ]
    send_calls(settings, calls, "wk")
    held = wait_for(lambda: held_users(settings).get("hooks"), timeout=60)
    assert (held.count, held.oldest_user, held.oldest_blocker) == (1, "A", "A-1")
    assert 0 <= now_ms() - held.oldest_since < 60_000
    through.set()
    wait_for(lambda: held_users(settings) == {}, timeout=60)
