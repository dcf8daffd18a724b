"""Batching (``batch`` in a destination's config): one POST carries a JSON array of calls.

Real broker, a real worker, real HTTP receivers on 127.0.0.1. The tests' retry tiers are 1 s and
2 s (``settings``), so a failed batch comes back within about a second.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from pipeline.core.signing import SIGNATURE_HEADER, verify, verify_standard_webhooks
from tests.integration.log_journeys import WORKER_ROLES, Store, logged
from tests.support import Request, apply, send_calls, simple_config, stays, wait_for

SECRET = "batch-secret-0042"


def calls(count: int, users: int = 3, padding: int = 0, prefix: str = "b") -> list[dict[str, Any]]:
    """``count`` track calls of ``users`` users, numbered per user in the order they are sent."""
    return [
        {
            "type": "track",
            "event": "Batched",
            "userId": f"u{n % users}",
            "messageId": f"{prefix}{n}",
            "properties": {"n": n, "pad": "x" * padding},
        }
        for n in range(count)
    ]


def message_ids(request: Request) -> list[str]:
    return [call["messageId"] for call in request.json]


def test_calls_go_in_batches_signed_whole_to_every_webhook(
    settings, tmp_path, receiver_factory, worker_factory
):
    """25 calls, batches of at most 10, to a destination with two webhooks: each request is a
    JSON array of at most 10 calls, its signatures cover the whole array, a user's calls keep
    their order in it, both webhooks get every call once, and the log names each call's batch."""
    settings = logged(settings, tmp_path)
    first, second = receiver_factory(), receiver_factory()
    config = simple_config(
        first.url,
        second.url,
        secret=SECRET,
        standard_webhooks=True,
        batch={"max_events": 10, "max_wait": "500ms"},
    )
    apply(settings, config)
    worker_factory(settings, WORKER_ROLES)
    sent = calls(25)
    send_calls(settings, sent, "wk")

    everyone = {call["messageId"] for call in sent}
    for receiver in (first, second):
        wait_for(lambda r=receiver: {m for q in r.requests for m in message_ids(q)} >= everyone)
    for receiver in (first, second):
        requests = list(receiver.requests)
        carried = Counter(m for request in requests for m in message_ids(request))
        assert carried == Counter(everyone)  # every call once, in one batch
        assert all(isinstance(request.json, list) for request in requests)
        assert max(len(request.json) for request in requests) <= 10
        assert len(requests) < 25  # batched: fewer requests than calls
        for request in requests:
            assert request.headers["Content-Type"] == "application/json"
            assert verify(request.body, SECRET, request.headers.get(SIGNATURE_HEADER))
            assert request.headers["webhook-id"].startswith("batch_")
            assert verify_standard_webhooks(request.headers, request.body, SECRET, now=request.at)
            numbers: dict[str, list[int]] = {}
            for call in request.json:
                numbers.setdefault(call["userId"], []).append(call["properties"]["n"])
            assert all(ns == sorted(ns) for ns in numbers.values())  # receipt order per user
    # The same batches went to both webhooks: one request, every webhook.
    assert sorted(map(message_ids, first.requests)) == sorted(map(message_ids, second.requests))

    store = Store(settings)

    def batch_named(message_id: str) -> str | None:
        trace = store.trace(message_id)
        if trace is None:
            return None
        attempts = [e for e in trace.entries if e.kind.value == "attempt"]
        return attempts[0].reason if attempts else None

    wait_for(lambda: all(batch_named(m) for m in everyone))
    ident = first.requests[0].headers["webhook-id"]
    carried_first = message_ids(first.requests[0])
    assert {batch_named(m) for m in carried_first} == {f"{ident} of {len(carried_first)} calls"}


def test_a_failed_batch_is_retried_whole_and_delivered_once(
    settings, receiver_factory, worker_factory
):
    """The receiver answers the first batch 500, then 200: the same five calls come back
    together in one batch (one due time for all), and each is delivered once."""
    receiver = receiver_factory()
    receiver.responses = [500]
    apply(settings, simple_config(receiver.url, batch={"max_events": 5, "max_wait": "1s"}))
    worker_factory(settings)
    sent = calls(5)
    send_calls(settings, sent, "wk")

    wait_for(lambda: receiver.count() >= 2)
    assert stays(lambda: receiver.count() == 2, 2.5)  # nothing after the retried batch
    failed, retried = receiver.requests
    assert failed.answer == 500 and retried.answer == 200
    everyone = sorted(call["messageId"] for call in sent)
    assert sorted(message_ids(failed)) == everyone
    assert sorted(message_ids(retried)) == everyone


def test_a_batch_never_exceeds_its_byte_limit(settings, receiver_factory, worker_factory):
    """Calls of about 400 bytes, batches of at most 2,000 bytes: every request stays under the
    limit, several calls still share one, and every call arrives once."""
    receiver = receiver_factory()
    config = simple_config(
        receiver.url, batch={"max_events": 100, "max_bytes": "2KB", "max_wait": "500ms"}
    )
    apply(settings, config)
    worker_factory(settings)
    sent = calls(20, padding=300)
    send_calls(settings, sent, "wk")

    everyone = {call["messageId"] for call in sent}
    wait_for(lambda: {m for q in receiver.requests for m in message_ids(q)} >= everyone)
    requests = list(receiver.requests)
    assert max(len(request.body) for request in requests) <= 2000
    assert max(len(request.json) for request in requests) > 1
    assert Counter(m for r in requests for m in message_ids(r)) == Counter(everyone)
