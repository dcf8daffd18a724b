"""Ordered delivery: a held user survives a SIGKILL and two workers, and what releases it besides
its call's outcome (a deletion request; its destination disabled, deleted or no longer ordered).
Real broker, real workers, real receiver.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest

from pipeline.core.settings import Settings
from pipeline.ops.deletion import request_deletion
from tests.integration.ordered_calls import (
    FAILING,
    PATIENT,
    FailsFor,
    Switch,
    assert_held_then_in_order,
    calls,
    dead_lettered,
    delivered_in_order,
    first_delivered,
    first_request,
    held,
    held_users,
    interleaved,
    ordered_config,
    unique,
)
from tests.support import (
    Receiver,
    apply,
    delivery_log_entries,
    ready,
    send_calls,
    started,
    wait_for,
    wait_or_tell,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


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
