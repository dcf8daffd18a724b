"""Ordered delivery per user (``ordering: per_user``): real broker, real workers, real receiver.

A user's call that waits in a retry tier holds back that user's later calls to the destination,
which wait in the partition state, and go on, in order, once it has an outcome; other users'
calls flow on meanwhile. The held users' durability and what releases them:
tests/integration/test_ordering_holds.py. Each test prints its figures (``pytest -s``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from pipeline.core.settings import Settings
from tests.integration.ordered_calls import (
    FAILING,
    PATIENT,
    DownFor,
    FailsFor,
    assert_held_then_in_order,
    calls,
    delivered_in_order,
    first_delivered,
    first_request,
    interleaved,
    on_the_partition_of,
    ordered_config,
    unique,
)
from tests.support import (
    Receiver,
    apply,
    dead_letters,
    delivery_log_entries,
    run_cli,
    send_calls,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


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
    """A-2 fails past its retry deadline (4 s here): it is dead-lettered, and A-3, A-4 go on
    past it. Then `pipeline replay` of the range delivers A's calls again, in order (A-2 failing
    for 2 s holds A-3 and A-4 back again)."""
    failing = FailsFor("A-2", 3600)
    receiver = receiver_factory(default=failing)
    apply(settings, ordered_config(receiver.url))
    worker_factory(settings.model_copy(update={"retry_deadline": 4.0}))
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
