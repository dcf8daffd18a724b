"""Nothing acknowledged is lost when processes, the broker or receivers misbehave.

Each test prints calls sent / delivered / duplicated (run with ``-s`` to see them).
"""

from __future__ import annotations

import signal

from tests.support import apply, delivery_report, fault_calls, send_calls, simple_config, wait_for


def test_sigkill_of_the_retry_worker_while_records_wait_in_a_tier(
    settings, receiver_factory, worker_factory, process_factory
):
    # The killed member's session (3 s) must expire before the new one takes over: a deadline
    # longer than the compressed 8 s keeps this about loss, not about the deadline. No circuit
    # opens either: one can (the calls reach a worker in two batches, five 503s come back between
    # them), and the rest then go one probe a cool-down; a clean-clone run once timed out
    # waiting for the 60 requests that way. This test is about the tier, not the breaker.
    settings = settings.replace(retry_deadline=60.0, circuit_failures=1000)
    receiver = receiver_factory(200)
    receiver.responses = [503] * 60  # every first attempt fails: all 60 go to tier 0
    apply(settings, simple_config(receiver.url))
    worker_factory(settings, ("router", "deliver"))
    retry = process_factory(settings, "retry")
    send_calls(settings, fault_calls(60, "k"), "wk")

    wait_for(lambda: receiver.count() >= 60)  # all failed once: they now wait in tier 0 (1 s)
    retry.send_signal(signal.SIGKILL)
    retry.wait(10)
    assert len(receiver.delivered()) < 60
    process_factory(settings, "retry")

    wait_for(lambda: len({b["messageId"] for b in receiver.delivered()}) == 60, timeout=60)
    delivered = delivery_report("SIGKILL retry worker", 60, receiver)
    assert set(delivered) == {f"k-{i}" for i in range(60)}


def test_a_flapping_receiver_gets_every_call(settings, receiver_factory, worker_factory):
    # Alternating answers halve the failures per round; 8 s would dead-letter the unlucky few.
    settings = settings.replace(retry_deadline=60.0)
    receiver = receiver_factory(200)
    receiver.responses = [200, 503] * 100
    apply(settings, simple_config(receiver.url))
    worker_factory(settings)
    send_calls(settings, fault_calls(100, "f"), "wk")

    wait_for(lambda: len({b["messageId"] for b in receiver.delivered()}) == 100, timeout=60)
    delivered = delivery_report("flapping receiver", 100, receiver)
    assert set(delivered) == {f"f-{i}" for i in range(100)}
    assert sum(delivered.values()) == 100, "a 503 is not a delivery; a 200 is never repeated"
