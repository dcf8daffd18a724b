"""OpenTelemetry traces, end to end: one call sent with a ``traceparent`` through a real ingest
and a real worker (subprocesses, configured by the standard ``OTEL_*`` variables) to a real OTLP
endpoint on 127.0.0.1 that decodes the protobuf exports (``tests/otlp_collector.py``)."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable, Iterator

import httpx
import pytest

from pipeline.core.settings import Settings
from pipeline.runtime.net import free_port
from tests.otlp_collector import Collector, ExportedSpan, start_collector, tree
from tests.support import (
    Receiver,
    ServerThread,
    Stderr,
    apply,
    run_cli,
    simple_config,
    started,
    wait_for,
    wait_until_ready,
)

pytestmark = pytest.mark.timeout(120)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SENDER_SPAN = "00f067aa0ba902b7"
LATER_TRACE_ID = "5c0a2e8f6d6b4f0c9a1b2c3d4e5f6a7b"
SECRET = "whsec_tracing-secret-0123456789"
HEADER_VALUE = "key-in-a-config-header-42"
BODY_MARKER = "body-marker-never-in-a-span"


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = ServerThread()
    yield start_collector(server)
    server.close()


def exporting(collector: Collector) -> dict[str, str]:
    """The environment of a process that sends its spans to ``collector`` at once."""
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}


def run_pipeline(
    settings: Settings,
    process_factory: Callable[..., subprocess.Popen[bytes]],
    collector: Collector,
) -> tuple[str, Stderr]:
    """Ingest and a worker exporting their spans to ``collector``; the ingest URL."""
    env = exporting(collector)
    port = free_port()
    process_factory(settings, "ingest", "--port", str(port), env=env)
    _, worker_log = started(process_factory, settings, "worker", env)
    url = f"http://127.0.0.1:{port}"
    wait_until_ready(url)
    return url, worker_log


def named(spans: list[ExportedSpan], name: str) -> list[ExportedSpan]:
    return [span for span in spans if span.name == name]


def test_one_call_is_one_trace_from_the_sender_through_a_retry_to_the_receiver(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    process_factory: Callable[..., subprocess.Popen[bytes]],
    collector: Collector,
) -> None:
    receiver = receiver_factory()
    receiver.responses = [500]  # the first attempt fails, the retry (1 s later) is delivered
    quiet = receiver_factory()  # a destination whose requests carry no trace context
    config = simple_config(receiver.url, secret=SECRET)
    config["destinations"][0]["webhooks"][0]["headers"] = {"X-Api-Key": HEADER_VALUE}
    config["destinations"][0]["ordering"] = "per_user"  # the user's next call waits behind it
    config["destinations"].append(
        {**simple_config(quiet.url)["destinations"][0], "id": "quiet", "trace_context": False}
    )
    apply(settings, config)
    url, worker_log = run_pipeline(settings, process_factory, collector)

    answer = httpx.post(
        f"{url}/v1/track",
        json={
            "userId": "u1",
            "event": "Signed Up",
            "messageId": "m-traced",
            "properties": {"note": BODY_MARKER},
        },
        auth=("wk", ""),
        headers={"traceparent": f"00-{TRACE_ID}-{SENDER_SPAN}-01", "tracestate": "vendor=1"},
    )
    assert answer.status_code == 200
    later = httpx.post(
        f"{url}/v1/track",
        json={"userId": "u1", "event": "Upgraded", "messageId": "m-later"},
        auth=("wk", ""),
        headers={"traceparent": f"00-{LATER_TRACE_ID}-{SENDER_SPAN}-01"},
    )
    assert later.status_code == 200

    wait_for(lambda: len(receiver.delivered()) == 2, timeout=60)
    wanted = {"POST /v1/track", "route track", "wait (retry)"}

    def whole() -> bool:
        spans = collector.of_trace(TRACE_ID)
        return wanted <= {s.name for s in spans} and len(named(spans, "POST")) == 3

    wait_for(whole, timeout=30)
    spans = collector.of_trace(TRACE_ID)
    print("\n" + tree(spans))

    (ingest,) = named(spans, "POST /v1/track")
    assert (ingest.kind, ingest.service, ingest.parent_id) == (
        "server",
        "pipeline-ingest",
        SENDER_SPAN,
    )
    assert ingest.attributes["http.response.status_code"] == 200
    assert ingest.attributes["pipeline.calls"] == 1

    (route,) = named(spans, "route track")
    assert (route.service, route.parent_id) == ("pipeline-worker", ingest.span_id)
    assert sorted(route.attributes["pipeline.destinations"]) == ["hooks", "quiet"]

    attempts = named(spans, "POST")
    (unsent,) = [s for s in attempts if s.attributes["pipeline.destination"] == "quiet"]
    assert unsent.parent_id == route.span_id  # its span is made all the same
    assert "traceparent" not in quiet.requests[0].headers
    failed, delivered = sorted((s for s in attempts if s is not unsent), key=lambda s: s.start)
    for attempt in (failed, delivered):
        assert (attempt.kind, attempt.parent_id) == ("client", route.span_id)
        # Only the origin: a webhook's path may hold its secret.
        assert attempt.attributes["url.full"] == receiver.url.removesuffix("/hook")
        assert attempt.attributes["pipeline.destination"] == "hooks"
    assert failed.attributes["http.response.status_code"] == 500
    assert failed.attributes["error.type"] == "500" and failed.error
    assert delivered.attributes["http.response.status_code"] == 200
    assert delivered.attributes["http.request.resend_count"] == 1
    assert not delivered.error

    (waited,) = named(spans, "wait (retry)")
    assert waited.parent_id == route.span_id
    assert waited.attributes["pipeline.retry.tier"] == 0
    # The wait spans the time between the two attempts (1 s in the test's retry schedule).
    assert failed.end <= waited.start + 50_000_000
    assert waited.end <= delivered.start + 50_000_000
    assert waited.end - waited.start >= 500_000_000

    # The receiver got the trace: the delivered attempt's span as the parent.
    (got,) = [r.headers for r in receiver.delivered_requests() if r.json["messageId"] == "m-traced"]
    assert got["traceparent"] == f"00-{TRACE_ID}-{delivered.span_id}-01"
    assert got["tracestate"] == "vendor=1"

    # The user's later call waited behind it: that wait is in the later call's trace, and ends
    # as its request to the ordered destination starts. That request's span may be exported
    # after the wait's (its "quiet" one went at routing, long before).
    def later_hooks_posts() -> list[ExportedSpan]:
        posts = named(collector.of_trace(LATER_TRACE_ID), "POST")
        return [s for s in posts if s.attributes["pipeline.destination"] == "hooks"]

    wait_for(lambda: named(collector.of_trace(LATER_TRACE_ID), "wait (held user)"), timeout=30)
    wait_for(later_hooks_posts, timeout=30)
    later_spans = collector.of_trace(LATER_TRACE_ID)
    print("\n" + tree(later_spans))
    (held,) = named(later_spans, "wait (held user)")
    assert held.attributes["pipeline.held_behind"] == "m-traced"
    assert held.end - held.start >= 500_000_000  # about the first call's retry delay
    (later_post,) = later_hooks_posts()
    assert held.end <= later_post.start + 50_000_000
    (later_got,) = [r for r in receiver.requests if r.json["messageId"] == "m-later"]
    assert later_got.headers["traceparent"].split("-")[1] == LATER_TRACE_ID

    # The delivery log keeps the trace id: ``pipeline trace`` shows it, linked by the template.
    jaeger = {"PIPELINE_TRACE_URL_TEMPLATE": "http://jaeger.test:16686/trace/{trace_id}"}
    line = f"trace {TRACE_ID}  http://jaeger.test:16686/trace/{TRACE_ID}"
    wait_for(lambda: line in run_cli(settings, "trace", "m-traced", env=jaeger).stdout, timeout=30)

    # No span holds the shared secret, a config header's value or the body.
    for span in collector.spans:
        for value in span.values():
            assert SECRET not in value and HEADER_VALUE not in value and BODY_MARKER not in value


def test_a_dead_letter_replay_and_a_range_replay_go_on_in_the_calls_trace(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    process_factory: Callable[..., subprocess.Popen[bytes]],
    collector: Collector,
) -> None:
    """Both replays keep the call's trace: a ``replay (dead letter)`` step under the routing
    span, a ``replay (range)`` step under the ingestion span (the call as it was received), each
    followed by its attempt."""
    receiver = receiver_factory()
    receiver.responses = [400]  # a client error: dead-lettered at once
    apply(settings, simple_config(receiver.url))
    url, _ = run_pipeline(settings, process_factory, collector)
    answer = httpx.post(
        f"{url}/v1/track",
        json={"userId": "u1", "event": "Signed Up", "messageId": "m-replayed"},
        auth=("wk", ""),
        headers={"traceparent": f"00-{TRACE_ID}-{SENDER_SPAN}-01"},
    )
    assert answer.status_code == 200
    wait_for(lambda: named(collector.of_trace(TRACE_ID), "POST"), timeout=60)
    wait_for(lambda: "1 dead letter" in run_cli(settings, "dlq", "list").stdout, timeout=30)

    env = exporting(collector)
    replayed = run_cli(settings, "dlq", "replay", env=env)
    assert "replayed 1;" in replayed.stdout, replayed.stderr
    wait_for(lambda: len(receiver.delivered()) == 1, timeout=30)
    ranged = run_cli(
        settings, "replay", "--destination", "hooks", "--since", "1h", "--yes", env=env
    )
    assert ranged.returncode == 0, ranged.stderr
    wait_for(lambda: len(receiver.delivered()) == 2, timeout=30)

    def whole() -> bool:
        spans = collector.of_trace(TRACE_ID)
        return len(named(spans, "POST")) == 3 and len(named(spans, "replay (range)")) == 1

    wait_for(whole, timeout=30)
    spans = collector.of_trace(TRACE_ID)
    print("\n" + tree(spans))
    (ingest,) = named(spans, "POST /v1/track")
    (route,) = named(spans, "route track")
    (from_dlq,) = named(spans, "replay (dead letter)")
    (from_range,) = named(spans, "replay (range)")
    assert (from_dlq.parent_id, from_dlq.service) == (route.span_id, "pipeline-dlq")
    assert (from_range.parent_id, from_range.service) == (ingest.span_id, "pipeline-replay")
    first, second, third = sorted(named(spans, "POST"), key=lambda s: s.start)
    assert first.attributes["http.response.status_code"] == 400
    assert second.parent_id == from_dlq.span_id
    assert second.attributes["http.response.status_code"] == 200
    assert third.parent_id == from_range.span_id
    assert third.attributes["http.response.status_code"] == 200
    traceparents = [r.headers["traceparent"] for r in receiver.requests]
    assert traceparents[1:] == [
        f"00-{TRACE_ID}-{second.span_id}-01",
        f"00-{TRACE_ID}-{third.span_id}-01",
    ]


def test_calls_made_inside_an_applications_span_are_its_children_over_http_and_kafka(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    process_factory: Callable[..., subprocess.Popen[bytes]],
    collector: Collector,
) -> None:
    """Our client takes the active span's context when a call is made: over HTTP the request
    carries it (the calls of a request share it), over Kafka each record does."""
    from opentelemetry.sdk.trace import TracerProvider

    from pipeline.client import AsyncClient, Client

    receiver, batched = receiver_factory(), receiver_factory()
    config = simple_config(receiver.url)
    config["destinations"].append(
        {
            **simple_config(batched.url)["destinations"][0],
            "id": "batched",
            "batch": {"max_events": 2, "max_wait": "10s"},
        }
    )
    apply(settings, config)
    url, _ = run_pipeline(settings, process_factory, collector)
    tracer = TracerProvider().get_tracer("the application")
    sent: dict[str, tuple[str, str]] = {}  # transport → (trace id, span id) of the app's span
    clients = {
        "http": Client("wk", endpoint=url, flush_at=1),
        "kafka": Client(
            "wk",
            bootstrap_servers=settings.bootstrap_servers,
            topic_prefix=settings.topic_prefix,
            source_id="web",
            flush_at=1,
        ),
    }
    for name, client in clients.items():
        with tracer.start_as_current_span(f"checkout over {name}") as span:
            context = span.get_span_context()
            sent[name] = (f"{context.trace_id:032x}", f"{context.span_id:016x}")
            client.track(user_id="u1", event="Checked Out", message_id=f"m-{name}")
        client.flush()
        client.close()

    async def from_asyncio() -> None:  # the asyncio client, over Kafka
        async with AsyncClient(
            "wk",
            bootstrap_servers=settings.bootstrap_servers,
            topic_prefix=settings.topic_prefix,
            source_id="web",
        ) as client:
            with tracer.start_as_current_span("checkout over asyncio") as span:
                context = span.get_span_context()
                sent["asyncio"] = (f"{context.trace_id:032x}", f"{context.span_id:016x}")
                client.track(user_id="u2", event="Checked Out", message_id="m-asyncio")
            assert await client.flush(timeout=15)

    asyncio.run(from_asyncio())

    wait_for(lambda: len(receiver.delivered()) == 3 and batched.delivered(), timeout=60)
    for name, (trace_id, app_span) in sent.items():
        wait_for(lambda t=trace_id: named(collector.of_trace(t), "POST"), timeout=30)
        spans = [s for s in collector.of_trace(trace_id) if not s.name.startswith("sent in")]
        print(f"\n{name}:\n" + tree(spans))
        (route,) = named(spans, "route track")
        if name == "http":
            (ingest,) = named(spans, "POST /v1/batch")
            assert ingest.parent_id == app_span and route.parent_id == ingest.span_id
        else:
            assert route.parent_id == app_span  # no ingestion: the record carried it
        (got,) = [r for r in receiver.requests if r.json["messageId"] == f"m-{name}"]
        assert got.headers["traceparent"].split("-")[1] == trace_id

    # The batching destination's one request for both: a trace of its own, linked to both
    # calls' routing spans, each of which has a step linked back to it.
    def batch_spans() -> list[ExportedSpan]:
        with collector.lock:
            return [s for s in collector.spans if s.name.startswith("send batch_")]

    # (which two calls share it depends on the order they reach the worker; the third waits
    # in a batch of its own for max_wait)
    (batch,) = wait_for(lambda: [s for s in batch_spans() if s.name.endswith(" of 2 calls")])
    assert batch.parent_id == ""
    (pair,) = [r for r in batched.requests if isinstance(r.json, list) and len(r.json) == 2]
    carried = [name for name in sent if f"m-{name}" in {body["messageId"] for body in pair.json}]
    assert len(carried) == 2
    assert {trace_id for trace_id, _ in batch.links} == {sent[name][0] for name in carried}
    batch_trace = collector.of_trace(batch.trace_id)
    print("\nbatch:\n" + tree(batch_trace))
    (request,) = named(batch_trace, "POST")
    assert request.parent_id == batch.span_id
    # (a new root's flags say sampled, and that its id is random: 03)
    assert pair.headers["traceparent"].startswith(f"00-{batch.trace_id}-{request.span_id}-")
    for trace_id in (sent[name][0] for name in carried):
        wait_for(
            lambda t=trace_id: named(collector.of_trace(t), batch.name.replace("send", "sent in"))
        )
        (step,) = named(collector.of_trace(trace_id), batch.name.replace("send", "sent in"))
        assert step.links == [(batch.trace_id, batch.span_id)]


@pytest.mark.parametrize("pass_through", [False, True], ids=["off", "passed-through"])
def test_with_tracing_off_a_senders_context_reaches_the_receiver_only_when_passed_through(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    process_factory: Callable[..., subprocess.Popen[bytes]],
    pass_through: bool,
) -> None:
    """No ``OTEL_*`` exporter: the pipeline passes no context on (tracing off costs nothing),
    unless ``PIPELINE_TRACE_PASS_THROUGH`` says to; then the receiver gets the sender's as it
    came."""
    receiver = receiver_factory()
    apply(settings, simple_config(receiver.url))
    env = {"PIPELINE_TRACE_PASS_THROUGH": "on"} if pass_through else {}
    port = free_port()
    process_factory(settings, "ingest", "--port", str(port), env=env)
    started(process_factory, settings, "worker", env)
    url = f"http://127.0.0.1:{port}"
    wait_until_ready(url)
    traceparent = f"00-{TRACE_ID}-{SENDER_SPAN}-01"
    answer = httpx.post(
        f"{url}/v1/track",
        json={"userId": "u1", "event": "Signed Up", "messageId": "m-off"},
        auth=("wk", ""),
        headers={"traceparent": traceparent, "tracestate": "vendor=1"},
    )
    assert answer.status_code == 200
    (got,) = wait_for(receiver.delivered, timeout=60) and receiver.requests
    if pass_through:
        assert got.headers["traceparent"] == traceparent
        assert got.headers["tracestate"] == "vendor=1"
    else:
        assert "traceparent" not in got.headers and "tracestate" not in got.headers
