"""``WebhookSender.refused_by_circuits``: the attempt decided without a request, only when every
webhook's circuit refuses, and without taking the half-open probe."""

from __future__ import annotations

from pipeline.core.config import Destination
from pipeline.core.outcomes import Failure
from pipeline.core.settings import Settings
from pipeline.http.sender import WebhookSender

SETTINGS = Settings(allowed_networks=("127.0.0.0/8",), circuit_failures=1, circuit_cool_down=60.0)
A, B = "http://127.0.0.1:9001/hook", "http://127.0.0.1:9002/hook"


def destination(*urls: str) -> Destination:
    return Destination(id="d", sources=["web"], webhooks=[{"url": url} for url in urls])


def open_circuit(sender: WebhookSender, url: str) -> None:
    endpoint = sender._target(url).endpoint
    assert endpoint is not None
    endpoint.breaker.record(ok=False)  # one failure opens it (circuit_failures=1)


def test_closed_circuits_need_a_request() -> None:
    sender = WebhookSender(SETTINGS)
    assert sender.refused_by_circuits(destination(A)) is None


def test_every_circuit_open_gives_circuit_open_results() -> None:
    sender = WebhookSender(SETTINGS)
    open_circuit(sender, A)
    open_circuit(sender, B)
    results = sender.refused_by_circuits(destination(A, B))
    assert results is not None
    assert [(r.url, r.failure) for r in results] == [
        (A, Failure.CIRCUIT_OPEN),
        (B, Failure.CIRCUIT_OPEN),
    ]
    assert "circuit open" in results[0].detail


def test_one_open_circuit_among_several_still_needs_the_attempt() -> None:
    """Seed rule: any webhook's 2xx delivers the call, so the closed one must be tried."""
    sender = WebhookSender(SETTINGS)
    open_circuit(sender, A)
    assert sender.refused_by_circuits(destination(A, B)) is None


def test_asking_does_not_take_the_half_open_probe() -> None:
    now = [0.0]
    sender = WebhookSender(SETTINGS)
    endpoint = sender._target(A).endpoint
    assert endpoint is not None
    endpoint.breaker._clock = lambda: now[0]
    endpoint.breaker.record(ok=False)
    now[0] = 61.0  # cool-down over: the next allow() is the probe
    assert sender.refused_by_circuits(destination(A)) is None
    assert sender.refused_by_circuits(destination(A)) is None
    assert endpoint.breaker.allow()  # the probe is still there for the real attempt
    assert sender.refused_by_circuits(destination(A)) is not None  # probe in flight: refused
