"""Lean spans (``pipeline.runtime.lean_spans``): made from a record's sampled context and encoded
without the SDK, they must reach a collector exactly as the SDK's spans of the same content do."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pipeline.core.outcomes import Failure, UrlResult
from pipeline.http.request_tracing import traced_post
from pipeline.runtime import tracing
from pipeline.runtime.lean_spans import (
    EncodedSpan,
    Encoder,
    LeanSpan,
    Limits,
    Sink,
    parse_traceparent,
)
from tests.otlp_collector import start_collector
from tests.support import ServerThread, wait_for

SAMPLED = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
UNSAMPLED = SAMPLED[:-2] + b"00"
LINKED = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
PARENT = [(tracing.TRACEPARENT, SAMPLED), (tracing.TRACESTATE, b"v=1,w=2")]
ATTRIBUTES: dict[str, Any] = {
    "pipeline.call.type": "track",
    "pipeline.destinations": ["d1", "d-2"],
    "server.port": 8080,
    "big": 2**62,
    "negative": -3,
    "ratio": 0.25,
    "flag": True,
    "unset": None,
    "long text": "é" * 9000,  # 18 KB: a three-byte length
}
RESOURCE = {"service.name": "pipeline-worker", "telemetry.sdk.language": "python"}


@pytest.fixture(autouse=True)
def off_afterwards() -> Iterator[None]:
    yield
    tracing.configure("test", {})


class Kept:
    """A span processor that keeps what ends (the encoding is what is tested here)."""

    def __init__(self) -> None:
        self.spans: list[Any] = []

    def on_end(self, span: Any) -> None:
        self.spans.append(span)


def _lean(processor: Kept, encoder: Encoder) -> LeanSpan:
    span = LeanSpan(
        Sink(processor, encoder),
        "POST",
        SAMPLED[3:35],
        SAMPLED[36:52],
        "v=1,w=2",
        tracing.SpanKind.CLIENT,
        ATTRIBUTES,
        None,
        [(LINKED[3:35], LINKED[36:52], "")],
    )
    span.set_attribute("http.response.status_code", 500)
    span.add_event("destination left out", {"reason": "disabled", "n": 2})
    span.set_status(tracing.StatusCode.ERROR)
    span.end()
    return span


def _sdk_request() -> dict[str, Any]:
    """The same span made by the SDK and encoded by the library, as a dict."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource(RESOURCE))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing._state.tracer = provider.get_tracer("pipeline")  # the SDK path, whatever is set up
    tracing._state.lean = None
    span = tracing.start_span(
        "POST",
        PARENT,
        tracing.SpanKind.CLIENT,
        ATTRIBUTES,
        links=[[(tracing.TRACEPARENT, LINKED)]],
    )
    span.set_attribute("http.response.status_code", 500)
    span.add_event("destination left out", {"reason": "disabled", "n": 2})
    span.set_status(tracing.StatusCode.ERROR)
    span.end()
    (finished,) = exporter.get_finished_spans()
    return _comparable(encode_spans([finished]).SerializeToString())


def _comparable(data: bytes) -> dict[str, Any]:
    """A request as a dict, without what differs between two makings of one span (its id and
    times)."""
    request = ExportTraceServiceRequest.FromString(data)
    as_dict = MessageToDict(request)
    for resource_spans in as_dict["resourceSpans"]:
        for scope_spans in resource_spans["scopeSpans"]:
            for span in scope_spans["spans"]:
                for key in ("spanId", "startTimeUnixNano", "endTimeUnixNano"):
                    span.pop(key)
                for event in span.get("events", []):
                    event.pop("timeUnixNano")
    return as_dict


def test_a_lean_span_reaches_a_collector_as_the_sdks_span_of_the_same_content() -> None:
    processor = Kept()
    encoder = Encoder(RESOURCE, "pipeline", Limits())
    _lean(processor, encoder)
    assert [type(span) for span in processor.spans] == [EncodedSpan]
    assert _comparable(encoder.request(processor.spans)) == _sdk_request()


def test_the_standard_span_limits_apply_as_the_sdk_applies_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "4")
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "3")
    monkeypatch.setenv("OTEL_SPAN_LINK_COUNT_LIMIT", "0")
    processor = Kept()
    encoder = Encoder(RESOURCE, "pipeline", Limits())
    _lean(processor, encoder)
    lean = _comparable(encoder.request(processor.spans))
    span = lean["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    # the SDK keeps the newest attributes
    assert [a["key"] for a in span["attributes"]] == [
        "unset",
        "long text",
        "http.response.status_code",
    ]
    assert span["attributes"][1]["value"] == {"stringValue": "éééé"}
    assert span["droppedAttributesCount"] == 7
    assert "links" not in span and span["droppedLinksCount"] == 1
    assert lean == _sdk_request()


def test_spans_of_a_sampled_record_are_lean_and_reach_a_real_collector_with_the_sdks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = ServerThread()
    try:
        collector = start_collector(server)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)  # the exporter reads it
        tracing.configure("worker", {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url})
        root = tracing.start_span("POST /v1/track", None, tracing.SpanKind.SERVER)  # a new trace
        root.end()
        assert not isinstance(root, LeanSpan)
        routed = tracing.step(tracing.headers_of(root), "route track", {"n": 1})
        attempt = tracing.child_span("POST", routed, tracing.SpanKind.CLIENT, ATTRIBUTES)
        assert isinstance(attempt, LeanSpan)
        attempt.end()
        unsampled = tracing.start_span("POST", [(tracing.TRACEPARENT, UNSAMPLED)])
        assert not isinstance(unsampled, LeanSpan)  # the SDK's sampler decides: not recorded
        assert not unsampled.is_recording()
        assert tracing._state.provider.force_flush()
        trace_id = tracing.cleaned_trace_id(tracing.cleaned(tracing.headers_of(root)))
        assert trace_id
        spans = wait_for(lambda: (s := collector.of_trace(trace_id)) and len(s) == 3 and s)
        by_name = {span.name: span for span in spans}
        assert by_name["route track"].parent_id == by_name["POST /v1/track"].span_id
        assert by_name["POST"].parent_id == by_name["route track"].span_id
        assert dict(routed)[tracing.TRACEPARENT].split(b"-")[2].decode() == (
            by_name["route track"].span_id
        )
        assert {span.service for span in spans} == {"pipeline-worker"}
        assert by_name["POST"].attributes["big"] == 2**62
        assert by_name["POST"].attributes["negative"] == -3
        assert by_name["POST"].kind == "client"
    finally:
        server.close()


def test_the_console_exporter_or_another_sampler_keeps_the_sdks_spans() -> None:
    for environ in (
        {"OTEL_TRACES_EXPORTER": "console"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_TRACES_SAMPLER": "always_on"},
    ):
        tracing.configure("worker", environ)
        span = tracing.child_span("POST", PARENT)
        assert span is not None and not isinstance(span, LeanSpan)
        assert tracing.headers_of(span)[0][1].split(b"-")[1] == SAMPLED.split(b"-")[1]


def test_a_request_carries_2048_spans_unless_the_standard_variables_say_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The SDK's spans in requests of 2,048, and lean spans too: 64 bundles of 32; the standard
    variables' sizes hold for both (a lean request never carries more spans than they say)."""

    def spans_a_request() -> tuple[int, int]:
        sdk, lean = tracing._state.provider._active_span_processor._span_processors
        assert lean is tracing._state.lean
        lean_batch = lean._processor._batch_processor._max_export_batch_size
        return sdk._batch_processor._max_export_batch_size, lean_batch * lean._bundle

    tracing.configure("worker", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert spans_a_request() == (2048, 2048)
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "100")
    tracing.configure(
        "worker",
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "100",
        },
    )
    assert spans_a_request() == (100, 96)
    tracing.configure(  # as the SDK: a value that is no number leaves the default
        "worker",
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_BSP_MAX_QUEUE_SIZE": "many"},
    )
    assert tracing._state.lean._processor._batch_processor._max_queue_size == 2048 // 32


def _step(sink: Sink, n: int) -> None:
    ids = parse_traceparent(SAMPLED)
    assert ids is not None
    sink.step("route track", *ids, "", {"n": n}, [], [])


def test_lean_spans_reach_the_processor_in_bundles_and_none_waits_long() -> None:
    """Spans go in bundles of the size given, a bundle's bytes those of its spans one after
    another (a request of them is the request of the spans); a bundle not full is handed over
    within its wait, and at shutdown."""
    processor = Kept()
    encoder = Encoder(RESOURCE, "pipeline", Limits())
    one_by_one = Kept()
    alone = Sink(one_by_one, encoder)
    bundled = Sink(processor, encoder, bundle=4, wait=0.2)
    for n in range(3):
        _step(alone, n)
        _step(bundled, n)
    assert len(one_by_one.spans) == 3
    assert processor.spans == []
    _step(alone, 3)
    _step(bundled, 3)
    (bundle,) = processor.spans
    assert type(bundle) is EncodedSpan
    sent = ExportTraceServiceRequest.FromString(encoder.request([bundle]))
    (scope,) = sent.resource_spans[0].scope_spans
    assert [span.attributes[0].value.int_value for span in scope.spans] == [0, 1, 2, 3]
    assert _comparable(encoder.request([bundle])) == _comparable(encoder.request(one_by_one.spans))
    _step(bundled, 4)
    wait_for(lambda: len(processor.spans) == 2, timeout=5)  # handed over within its wait
    ended = Sink(Kept(), encoder, bundle=4, wait=60)
    ended._processor.shutdown = lambda: None
    _step(ended, 5)
    ended.shutdown()
    assert len(ended._processor.spans) == 1


@pytest.mark.parametrize(
    "traceparent",
    [
        b"00-" + b"z" * 32 + b"-00f067aa0ba902b7-01",  # not hex: the encoder could not write it
        b"00-" + b"0" * 32 + b"-00f067aa0ba902b7-01",  # the invalid trace id
        SAMPLED.upper(),
        SAMPLED[:-1],
    ],
)
def test_a_record_whose_context_is_not_w3c_makes_no_lean_span(traceparent: bytes) -> None:
    tracing.configure("worker", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert tracing.child_span("POST", [(tracing.TRACEPARENT, traceparent)]) is None
    processor = Kept()
    tracing._state.lean = Sink(processor, Encoder(RESOURCE, "pipeline", Limits()))
    tracing.step([(tracing.TRACEPARENT, traceparent)], "route track", {"n": 1})
    assert processor.spans == []


def _step_attributes() -> dict[str, Any]:
    return {"pipeline.message_id": "m-1", "pipeline.destinations": ["d1"], "n": 2}


STEP_EVENTS = [("destination left out", {"reason": "disabled"})]


def test_a_step_is_encoded_as_it_ends_as_the_sdks_step_of_the_same_content() -> None:
    """A step (a span that ends as it starts: routing, a replay) is encoded without a span
    object; it reaches a collector as the SDK's span of the same content, and the context it
    returns is its own."""
    processor = Kept()
    encoder = Encoder(RESOURCE, "pipeline", Limits())
    tracing.configure("worker", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    tracing._state.lean = Sink(processor, encoder)
    links = [[(tracing.TRACEPARENT, LINKED)]]
    for _ in range(2):  # the second time from what the encoder keeps
        processor.spans.clear()
        context = tracing.step(
            PARENT, "route track", _step_attributes(), events=STEP_EVENTS, links=links
        )
        request = encoder.request(processor.spans)
        lean = _comparable(request)
        span = ExportTraceServiceRequest.FromString(request).resource_spans[0]
        span_id = span.scope_spans[0].spans[0].span_id.hex().encode()
        assert (
            dict(context)[tracing.TRACEPARENT] == b"00-" + SAMPLED[3:35] + b"-" + span_id + b"-01"
        )
        assert dict(context)[tracing.TRACESTATE] == b"v=1,w=2"

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource(RESOURCE))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing._state.tracer = provider.get_tracer("pipeline")
    tracing._state.lean = None
    tracing.step(PARENT, "route track", _step_attributes(), events=STEP_EVENTS, links=links)
    (finished,) = exporter.get_finished_spans()
    assert lean == _comparable(encode_spans([finished]).SerializeToString())


def _sdk_tracer() -> InMemorySpanExporter:
    """The SDK's spans from now on, kept (what lean spans are compared with)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource(RESOURCE))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing._state.tracer = provider.get_tracer("pipeline")
    tracing._state.lean = None
    return exporter


@pytest.mark.parametrize("count_limit", [None, "3"])
def test_a_steps_shared_attributes_are_encoded_once_and_sent_as_the_sdks(
    monkeypatch: pytest.MonkeyPatch, count_limit: str | None
) -> None:
    """Attributes many spans share (``shared``) are made and encoded once a key, and the span
    reaches a collector as the SDK's span with them and its own; over the count limit, the
    oldest are dropped, as the SDK drops them."""
    if count_limit is not None:
        monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", count_limit)
    made: list[int] = []

    def shared(key: tuple[str, str]) -> dict[str, Any]:
        made.append(1)
        return {"pipeline.call.type": key[0], "pipeline.source": key[1]}

    processor = Kept()
    encoder = Encoder(RESOURCE, "pipeline", Limits())
    tracing.configure("worker", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    tracing._state.lean = Sink(processor, encoder)
    for _ in range(2):
        processor.spans.clear()
        tracing.step(
            PARENT,
            "route track",
            _step_attributes(),
            shared=(("track", "s"), shared),
        )
        lean = _comparable(encoder.request(processor.spans))
    assert made == [1]
    span = lean["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    kept = [a["key"] for a in span["attributes"]]
    if count_limit is None:
        assert kept[:2] == ["pipeline.call.type", "pipeline.source"] and len(kept) == 5
    else:
        assert kept == ["pipeline.message_id", "pipeline.destinations", "n"]
        assert span["droppedAttributesCount"] == 2

    exporter = _sdk_tracer()
    tracing.step(PARENT, "route track", _step_attributes(), shared=(("track", "s"), shared))
    (finished,) = exporter.get_finished_spans()
    assert lean == _comparable(encode_spans([finished]).SerializeToString())


URL = "http://127.0.0.1:8080/hook?token=never-in-a-span"


@pytest.mark.parametrize(
    "answer",
    [UrlResult(URL, 200), UrlResult(URL, 500, Failure.SERVER_ERROR), ConnectionError("refused")],
    ids=["200", "500", "raised"],
)
def test_an_attempts_lean_span_is_sent_as_the_sdks_span_of_the_same_content(
    answer: UrlResult | Exception,
) -> None:
    """An attempt's span is made without a span object where spans are lean: the request
    carries its context, and it reaches a collector as the SDK's span of the same content."""
    got: list[dict[str, str]] = []

    async def post(headers: dict[str, str]) -> UrlResult:
        got.append(headers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def attempt() -> None:
        with contextlib.suppress(ConnectionError):
            await traced_post(post, URL, {"X-Signature": "s"}, PARENT, 2, "d1", "m-1")

    processor = Kept()
    encoder = Encoder(RESOURCE, "pipeline", Limits())
    tracing.configure("worker", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    tracing._state.lean = Sink(processor, encoder)
    asyncio.run(attempt())
    request = encoder.request(processor.spans)
    (span,) = ExportTraceServiceRequest.FromString(request).resource_spans[0].scope_spans[0].spans
    own = b"00-" + SAMPLED[3:35] + b"-" + span.span_id.hex().encode() + b"-01"
    assert got[0] == {"X-Signature": "s", "traceparent": own.decode(), "tracestate": "v=1,w=2"}
    lean = _comparable(request)

    exporter = _sdk_tracer()
    asyncio.run(attempt())
    (finished,) = exporter.get_finished_spans()
    assert lean == _comparable(encode_spans([finished]).SerializeToString())
    keys = {a["key"] for a in lean["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"]}
    assert {"url.full", "pipeline.destination", "http.request.resend_count"} <= keys
    assert ("error.type" in keys) is (answer != UrlResult(URL, 200))


def test_a_span_that_cannot_be_encoded_is_left_out_and_its_bundle_goes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    processor = Kept()
    encoder = Encoder(RESOURCE, "pipeline", Limits())
    sink = Sink(processor, encoder, bundle=3, wait=60)
    _step(sink, 1)
    sink.step("broken", b"zz" * 16, b"00f067aa0ba902b7", "", {}, [], [])  # not hex
    _step(sink, 2)
    (bundle,) = processor.spans
    sent = ExportTraceServiceRequest.FromString(encoder.request([bundle]))
    (scope,) = sent.resource_spans[0].scope_spans
    assert [span.name for span in scope.spans] == ["route track", "route track"]
    assert "span 'broken' could not be encoded" in caplog.text
    sink._stopped.set()


def test_a_flush_waits_for_the_bundle_the_other_thread_is_handing_over() -> None:
    """The thread that hands a waiting bundle over may be encoding it when the provider
    flushes or shuts down: the flush waits for it, so no span is left behind."""
    entered, release = threading.Event(), threading.Event()

    class Slow(Kept):
        def on_end(self, span: Any) -> None:
            entered.set()
            release.wait(10)
            super().on_end(span)

        def force_flush(self, timeout_millis: int = 0) -> bool:
            return True

    processor = Slow()
    sink = Sink(processor, Encoder(RESOURCE, "pipeline", Limits()), bundle=4, wait=0.05)
    try:
        _step(sink, 1)
        assert entered.wait(10)  # the sink's thread is handing it over
        flushing = threading.Thread(target=sink.force_flush)
        flushing.start()
        flushing.join(0.3)
        assert flushing.is_alive() and processor.spans == []  # waiting for that bundle
        release.set()
        flushing.join(10)
        assert not flushing.is_alive() and len(processor.spans) == 1
    finally:
        release.set()
        sink._stopped.set()
