"""At-least-once across crashes: SIGKILL a worker mid-stream, start another, nothing is lost."""

from __future__ import annotations

import signal
from collections import Counter

from tests.support import apply, send_calls, simple_config, wait_for

CALLS = 400


def test_sigkill_mid_stream_then_restart_delivers_every_call(
    settings, receiver_factory, process_factory
):
    receiver = receiver_factory()
    apply(settings, simple_config(receiver.url))
    first = process_factory(settings, "worker")
    calls = [
        {"type": "track", "userId": f"u{i % 37}", "event": "Tick", "messageId": f"m-{i}"}
        for i in range(CALLS)
    ]
    send_calls(settings, calls, "wk")

    wait_for(lambda: receiver.count() >= 20, timeout=60)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    at_kill = receiver.count()

    process_factory(settings, "worker")
    wait_for(lambda: len({b["messageId"] for b in receiver.bodies()}) == CALLS, timeout=90)
    seen = Counter(b["messageId"] for b in receiver.bodies())
    duplicates = sum(n - 1 for n in seen.values())
    print(
        f"\nsent {CALLS}, delivered {len(seen)} unique, {duplicates} duplicates "
        f"({at_kill} had arrived at the kill)"
    )
    assert set(seen) == {f"m-{i}" for i in range(CALLS)}
