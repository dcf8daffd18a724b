"""Tracing's switch (the standard OTEL_* variables) and the trace context on Kafka headers."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

import pytest

from pipeline.runtime import tracing
from pipeline.runtime.lean_spans import parse_traceparent

SAMPLED = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
UNSAMPLED = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"


@pytest.fixture(autouse=True)
def off_afterwards() -> Iterator[None]:
    yield
    tracing.configure("test", {})


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"OTEL_SERVICE_NAME": "x"},
        {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"},
        {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"},
    ],
)
def test_tracing_is_off_unless_an_exporter_is_configured(environ: dict[str, str]) -> None:
    assert tracing.configure("worker", environ) is False
    assert not tracing.enabled()
    assert not tracing.recording([(tracing.TRACEPARENT, SAMPLED)])


@pytest.mark.parametrize(
    "environ",
    [
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"},
        {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"},
        {"OTEL_TRACES_EXPORTER": "console"},
    ],
)
def test_an_exporter_turns_it_on(environ: dict[str, str]) -> None:
    assert tracing.configure("worker", environ) is True
    assert tracing.enabled()


def test_grpc_and_unknown_exporters_are_refused_naming_the_variable() -> None:
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_PROTOCOL=grpc: only http/protobuf"):
        tracing.configure(
            "worker",
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
        )
    with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER=zipkin"):
        tracing.configure("worker", {"OTEL_TRACES_EXPORTER": "zipkin"})


def test_a_parent_based_sampler_records_only_a_sampled_context() -> None:
    tracing.configure("worker", {"OTEL_TRACES_EXPORTER": "console"})
    assert tracing.recording([(tracing.TRACEPARENT, SAMPLED)])
    assert not tracing.recording([(tracing.TRACEPARENT, UNSAMPLED)])
    assert not tracing.recording([])  # no context: no trace starts after ingestion
    tracing.configure(
        "worker", {"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "always_on"}
    )
    assert tracing.recording([(tracing.TRACEPARENT, UNSAMPLED)])


def test_a_span_of_a_records_context_is_its_child_and_carries_the_trace_on() -> None:
    tracing.configure("worker", {"OTEL_TRACES_EXPORTER": "console"})
    span = tracing.start_span(
        "route track", [(tracing.TRACEPARENT, SAMPLED), (tracing.TRACESTATE, b"v=1")]
    )
    headers = dict(tracing.headers_of(span))
    span.end()
    trace_id, span_id = headers[tracing.TRACEPARENT].split(b"-")[1:3]
    assert trace_id == SAMPLED.split(b"-")[1] and span_id != SAMPLED.split(b"-")[2]
    assert headers[tracing.TRACESTATE] == b"v=1"
    named = tracing.cleaned_trace_id(tracing.cleaned(tracing.headers_of(span)))
    assert named == trace_id.decode()


def test_only_the_trace_headers_of_a_record_are_kept_and_bad_ones_are_no_context() -> None:
    headers = [("pipeline-schedule", b"0 1 2 3 hooks"), ("traceparent", SAMPLED), ("x", b"y")]
    assert tracing.trace_headers(headers) == [("traceparent", SAMPLED)]
    assert tracing.trace_headers(None) == []
    assert tracing.parent_context({"traceparent": "00-nonsense"}) is None
    assert tracing.parent_context({}) is None


@pytest.mark.parametrize(
    "trace",
    [
        [("traceparent", b"00-\xff-00")],  # not text
        [("traceparent", SAMPLED + b"\n")],  # a control character (no header takes it)
        [("traceparent", SAMPLED.replace(b"-01", b"-01 x"))],  # a space (a parked batch's list)
        [("traceparent", b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more")],
        [("traceparent", b"00-" + b"0" * 32 + b"-00f067aa0ba902b7-01")],  # the invalid trace id
        [("traceparent", SAMPLED.upper())],
        [("traceparent", SAMPLED), ("traceparent", UNSAMPLED)],
        [("tracestate", b"v=1")],  # no traceparent
    ],
)
def test_a_context_from_outside_that_is_not_w3c_is_dropped(trace: list[tuple[str, bytes]]):
    assert tracing.cleaned(trace) == []


#: The ``traceparent`` the pipeline passes on, as W3C Trace Context writes it: version 00,
#: exactly, its trace and parent ids (not all zeros) and its flags in lower-case hex.
W3C_FORM = re.compile(rb"00-((?!0{32})[0-9a-f]{32})-((?!0{16})[0-9a-f]{16})-[0-9a-f]{2}")


def test_a_traceparent_is_read_when_it_has_the_w3c_form_and_only_then() -> None:
    """``parse_traceparent`` checks the form without a regex: it must agree with one, on valid
    values and on every kind of damage (a changed, added or missing character, upper case,
    zero ids, another version)."""
    rng = random.Random(35)
    damage = b"0123456789abcdefABCDEF-xg \n\xff"
    valid = 0
    for _ in range(20_000):
        value = bytearray(SAMPLED)
        for _ in range(rng.randint(0, 3)):
            where, roll = rng.randrange(len(value)), rng.random()
            if roll < 0.6:
                value[where] = rng.choice(damage)
            elif roll < 0.8:
                value.insert(where, rng.choice(damage))
            else:
                del value[where]
        if rng.random() < 0.05:
            value[3:35] = b"0" * 32
        if rng.random() < 0.05:
            value[36:52] = b"0" * 16
        text = bytes(value)
        match = W3C_FORM.fullmatch(text)
        assert parse_traceparent(text) == (match and (match[1], match[2])), text
        valid += match is not None
    assert 1_000 < valid < 19_000  # both kinds were tried


def test_a_valid_context_passes_and_a_bad_tracestate_alone_is_dropped() -> None:
    assert tracing.cleaned([("traceparent", SAMPLED), ("tracestate", b"v=1,w=2")]) == [
        ("traceparent", SAMPLED),
        ("tracestate", b"v=1,w=2"),
    ]
    assert tracing.cleaned([("traceparent", SAMPLED), ("tracestate", b"a=\xff")]) == [
        ("traceparent", SAMPLED)
    ]


@pytest.mark.parametrize(
    "trace",
    [
        [(tracing.TRACEPARENT, b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")],
        [
            (tracing.TRACESTATE, b"a=b"),
            (tracing.TRACEPARENT, b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"),
        ],
        [(tracing.TRACEPARENT, b"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00")],
        [(tracing.TRACEPARENT, b"garbage")],
        [],
    ],
)
def test_the_trace_id_of_a_cleaned_context_is_its_traceparents(
    trace: tracing.TraceHeaders,
) -> None:
    """The router reads it off the cleaned context without parsing it again."""
    clean = tracing.cleaned(trace)
    ids = parse_traceparent(dict(trace).get(tracing.TRACEPARENT, b""))
    assert tracing.cleaned_trace_id(clean) == (ids[0].decode() if clean and ids else "")
