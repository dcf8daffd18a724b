"""The HTTP ingestion API, for real: aiohttp on 127.0.0.1, the embedded broker, real clients.

Helpers here (``IngestThread``, ``CallsTopic`` and their fixtures) are shared with
``test_client.py``.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import gzip
import re
import time
import uuid
from datetime import UTC, datetime
from typing import Any, NamedTuple

import httpx
import orjson
import pytest

from pipeline.core.settings import Settings
from pipeline.core.timestamps import parse_timestamp
from pipeline.http.ingest import IngestOptions
from pipeline.kafka.broker import EmbeddedBroker
from pipeline.kafka.clients import create_topics
from tests.support import (
    SOURCE_ID,
    WRITE_KEY,
    CallsTopic,
    IngestThread,
    apply,
    ingest_config,
    wait_for,
    wait_until_ready,
)


def basic(username: str, colon: bool = True) -> dict[str, str]:
    credentials = f"{username}:" if colon else username
    return {"Authorization": "Basic " + base64.b64encode(credentials.encode()).decode()}


# ---- real Segment library → our API → worker → receiver -------------------------------------------


def test_segment_library_calls_arrive_as_webhooks(
    settings, receiver_factory, worker_factory, ingest_factory
):
    from segment.analytics import Client as SegmentClient
    from segment.analytics.version import VERSION

    receiver = receiver_factory()
    apply(settings, ingest_config(receiver.url))
    api = ingest_factory(settings)
    worker_factory(settings)
    errors: list[Any] = []
    segment = SegmentClient(
        WRITE_KEY,
        host=api.url,
        gzip=True,
        on_error=lambda error, batch: errors.append(error),
        upload_interval=0.1,
        max_retries=3,
    )
    when = datetime(2026, 11, 21, 7, 4, 30, 123000, tzinfo=UTC)
    stamp = "2026-11-21T07:04:30.123Z"
    segment.identify(
        "u1",
        {"name": "Ada", "logins": 12},
        context={"ip": "10.0.0.1"},
        timestamp=when,
        message_id="m-identify",
    )
    segment.track(
        "u1", "Order Completed", {"revenue": "42.50"}, timestamp=when, message_id="m-track"
    )
    page = {
        "path": "/pricing",
        "referrer": "https://example.com/",
        "title": "Pricing",
        "url": "https://shop.example/pricing",
    }
    segment.page("u1", name="Pricing", properties=page, timestamp=when, message_id="m-page")
    screen_context = {
        "device": {"model": "Pixel 9", "type": "android"},
        "os": {"name": "Android", "version": "16"},
        "app": {"build": "412", "name": "Shop", "version": "4.1.2"},
    }
    segment.screen("u1", name="Home", context=screen_context, timestamp=when, message_id="m-screen")
    segment.group(
        "u1",
        "acme",
        {"name": "Acme Inc", "employee count": 250},
        timestamp=when,
        message_id="m-group",
    )
    segment.alias("anon-7f3a", "u1", timestamp=when, message_id="m-alias")
    segment.flush()
    segment.join()
    assert errors == []

    wait_for(lambda: receiver.count() >= 6, timeout=30)
    library = {"name": "analytics-python", "version": VERSION}
    common = {"version": 1, "userId": "u1", "timestamp": stamp}
    expected = {
        "identify": {
            **common,
            "type": "identify",
            "messageId": "m-identify",
            "traits": {"name": "Ada", "logins": 12},
            "context": {"ip": "10.0.0.1", "library": library},
        },
        "track": {
            **common,
            "type": "track",
            "messageId": "m-track",
            "event": "Order Completed",
            "properties": {"revenue": "42.50"},
            "context": {"library": library},
        },
        "page": {
            **common,
            "type": "page",
            "messageId": "m-page",
            "properties": page,
            "name": "Pricing",
            "context": {"library": library},
        },
        "screen": {
            **common,
            "type": "screen",
            "messageId": "m-screen",
            "name": "Home",
            "properties": {},
            "context": {**screen_context, "library": library},
        },
        "group": {
            **common,
            "type": "group",
            "messageId": "m-group",
            "groupId": "acme",
            "traits": {"name": "Acme Inc", "employee count": 250},
            "context": {"library": library},
        },
        "alias": {
            **common,
            "type": "alias",
            "messageId": "m-alias",
            "Previous ID": "anon-7f3a",
            "User ID": "u1",
            "context": {"library": library},
        },
    }
    bodies = {body["type"]: body for body in receiver.bodies()}
    assert bodies == expected
    assert receiver.count() == 6
    # Field order is the seed's: version, type, userId, messageId, timestamp, then the type's.
    alias_body = next(r.body for r in receiver.requests if b'"alias"' in r.body)
    assert alias_body.startswith(b'{"version":1,"type":"alias","userId":"u1","messageId":"m-alias"')


# ---- the endpoints ---------------------------------------------------------------------------------


def test_every_endpoint_write_key_form_and_batch_merge(ingest, tagged_calls, tag):
    url = ingest.url
    ok = {"success": True}
    sent_ms = int(time.time() * 1000)
    singles = {
        "identify": {"userId": f"{tag}1", "traits": {"plan": "pro"}},
        "track": {"userId": f"{tag}1", "event": "Clicked", "properties": {"n": 1}},
        "page": {"anonymousId": f"{tag}a1", "name": "Home", "category": "Docs"},
        "screen": {"userId": f"{tag}1", "name": "Settings"},
        "group": {"userId": f"{tag}1", "groupId": "g1", "traits": {"name": "G"}},
        "alias": {"userId": f"{tag}1", "previousId": f"{tag}a1"},
    }
    with httpx.Client(timeout=10) as http:
        for kind, call in singles.items():
            response = http.post(
                f"{url}/v1/{kind}",
                json={**call, "messageId": f"m-{kind}"},
                headers=basic(WRITE_KEY),
            )
            assert (response.status_code, response.json()) == (200, ok), kind
        # The write key: Basic without a colon, or writeKey in the body; the short paths.
        response = http.post(
            f"{url}/v1/t",
            json={"userId": f"{tag}2", "event": "NoColon", "messageId": "m-nocolon"},
            headers=basic(WRITE_KEY, colon=False),
        )
        assert response.status_code == 200
        response = http.post(
            f"{url}/v1/track",
            json={
                "userId": f"{tag}2",
                "event": "InBody",
                "writeKey": WRITE_KEY,
                "timestamp": "2020-01-02T03:04:05.678Z",
                "messageId": "m-inbody",
            },
        )
        assert response.status_code == 200
        batch = {
            "writeKey": WRITE_KEY,
            "sentAt": "2026-11-21T07:00:00.000Z",
            "context": {"ip": "10.0.0.9", "locale": "de-DE"},
            "integrations": {"All": False, "Webhooks": True},
            "batch": [
                {
                    "type": "track",
                    "userId": f"{tag}3",
                    "event": "One",
                    "messageId": "m-b1",
                    "context": {"locale": "fr-FR"},
                },
                {"type": "identify", "userId": f"{tag}3", "integrations": {"Webhooks": False}},
            ],
        }
        response = http.post(
            f"{url}/v1/import",
            content=gzip.compress(orjson.dumps(batch)),
            headers={"Content-Encoding": "gzip"},
        )
        assert (response.status_code, response.json()) == (200, ok)
        empty = http.post(f"{url}/v1/batch", json={"batch": []}, headers=basic(WRITE_KEY))
        assert (empty.status_code, empty.json()) == (200, ok)

    records = tagged_calls.wait(10)
    assert len(tagged_calls.settle(0.3)) == 10
    by_id = tagged_calls.by_message_id()
    for kind in singles:
        record = by_id[f"m-{kind}"]
        assert record["type"] == kind and record["sourceId"] == SOURCE_ID
        assert sent_ms - 1000 <= record["receivedAt"] <= int(time.time() * 1000)
        assert record["timestamp"] == record["receivedAt"]  # no timestamp sent: server time
    assert by_id["m-page"]["category"] == "Docs" and by_id["m-page"]["anonymousId"] == f"{tag}a1"
    assert by_id["m-alias"]["previousId"] == f"{tag}a1"
    assert by_id["m-nocolon"]["event"] == "NoColon"
    # A timestamp sent by the client is kept (historical import).
    assert by_id["m-inbody"]["timestamp"] == parse_timestamp("2020-01-02T03:04:05.678Z")
    first = by_id["m-b1"]
    assert orjson.loads(first["context"]) == {"ip": "10.0.0.9", "locale": "fr-FR"}
    assert orjson.loads(first["integrations"]) == {"All": False, "Webhooks": True}
    assert first["sentAt"] == parse_timestamp("2026-11-21T07:00:00.000Z")
    second = next(r for r in records if r["type"] == "identify" and r["userId"] == f"{tag}3")
    uuid.UUID(second["messageId"])  # generated by the server
    assert orjson.loads(second["integrations"]) == {"All": False, "Webhooks": False}
    assert orjson.loads(second["context"]) == {"ip": "10.0.0.9", "locale": "de-DE"}


@functools.cache
def _bomb() -> bytes:
    """20 MB of spaces inside a JSON object: about 20 KB gzipped."""
    return gzip.compress(b"{" + b" " * 20_000_000 + b"}", compresslevel=9)


BIG = "x" * 33_000


class BadRequest(NamedTuple):
    """A request the API must refuse, and the exact answer it must get."""

    path: str
    headers: dict[str, str]
    body: bytes
    status: int
    error: dict[str, Any]


def _bad_requests(user: str) -> dict[str, BadRequest]:
    """The requests the API must refuse, by name; their calls are ``user``'s."""
    auth = basic(WRITE_KEY)
    gz = {**auth, "Content-Encoding": "gzip"}
    track = {"userId": user, "event": "E"}
    big_call = {**track, "properties": {"p": BIG}}
    big_item = {"type": "track", **big_call}

    def call(code: str, message: str, field: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {"success": False, "code": code, "message": message}
        if field is not None:
            body["field"] = field
        return body

    oversized_batch = {
        "batch": [{"type": "track", **track, "properties": {"p": "y" * 30_000}}] * 18
    }
    return {
        "empty body": BadRequest(
            "/v1/track",
            auth,
            b"",
            400,
            call("empty_body", "body: is empty; send a JSON object", "body"),
        ),
        "malformed JSON": BadRequest(
            "/v1/track",
            auth,
            b'{"userId": "u", ',
            400,
            call(
                "invalid_json",
                "body: not valid JSON: unexpected end of data: line 1 column 17 (char 16)",
                "body",
            ),
        ),
        "body not an object": BadRequest(
            "/v1/track",
            auth,
            b"[1, 2]",
            400,
            call("invalid_call", "body: must be a JSON object, got an array", "body"),
        ),
        "missing event": BadRequest(
            "/v1/track",
            auth,
            orjson.dumps({"userId": "u"}),
            400,
            call("invalid_call", "event: is required for a track call", "event"),
        ),
        "missing user": BadRequest(
            "/v1/identify",
            auth,
            orjson.dumps({"traits": {}}),
            400,
            call(
                "invalid_call",
                "userId: a identify call needs a userId or an anonymousId; neither was given",
                "userId",
            ),
        ),
        "wrong type of properties": BadRequest(
            "/v1/track",
            auth,
            orjson.dumps({**track, "properties": "cheap"}),
            400,
            call("invalid_call", "properties: must be a JSON object, got a string", "properties"),
        ),
        "wrong type of userId": BadRequest(
            "/v1/track",
            auth,
            orjson.dumps({**track, "userId": True}),
            400,
            call("invalid_call", "userId: must be a string, got a boolean", "userId"),
        ),
        "bad timestamp": BadRequest(
            "/v1/track",
            auth,
            orjson.dumps({**track, "timestamp": "noon"}),
            400,
            call(
                "invalid_call",
                "timestamp: 'noon' is not an ISO 8601 date-time, e.g. 2026-11-21T07:04:30.123Z",
                "timestamp",
            ),
        ),
        "batch not an array": BadRequest(
            "/v1/batch",
            auth,
            orjson.dumps({"batch": {"type": "track"}}),
            400,
            call("invalid_call", "batch: must be an array, got an object", "batch"),
        ),
        "batch missing": BadRequest(
            "/v1/batch",
            auth,
            orjson.dumps({"calls": []}),
            400,
            call("invalid_call", "batch: is required: an array of calls", "batch"),
        ),
        "batch item without type": BadRequest(
            "/v1/batch",
            auth,
            orjson.dumps({"batch": [{"type": "track", **track}, track]}),
            400,
            call(
                "invalid_call",
                "batch[1].type: is required in a batch: one of identify, track, "
                "page, screen, group, alias",
                "batch[1].type",
            ),
        ),
        "batch item invalid": BadRequest(
            "/v1/batch",
            auth,
            orjson.dumps({"batch": [{"type": "track", **track}, {"type": "group", "userId": "u"}]}),
            400,
            call(
                "invalid_call", "batch[1].groupId: is required for a group call", "batch[1].groupId"
            ),
        ),
        "delete is not accepted": BadRequest(
            "/v1/batch",
            auth,
            orjson.dumps({"batch": [{"type": "delete", "userId": "u"}]}),
            400,
            call(
                "invalid_call",
                "batch[0].type: 'delete' is not accepted by the tracking API: "
                "deletions come from deletion requests (pipeline delete-user)",
                "batch[0].type",
            ),
        ),
        "top-level context of the wrong type": BadRequest(
            "/v1/batch",
            auth,
            orjson.dumps({"batch": [], "context": [1]}),
            400,
            call("invalid_call", "context: must be a JSON object, got an array", "context"),
        ),
        "no write key": BadRequest(
            "/v1/track",
            {},
            orjson.dumps(track),
            401,
            call(
                "missing_write_key",
                "writeKey: no write key; send it as the HTTP Basic username "
                "(empty password) or as writeKey in the body",
                "writeKey",
            ),
        ),
        "unknown write key (Basic)": BadRequest(
            "/v1/track",
            basic("wk_nope"),
            orjson.dumps(track),
            401,
            call(
                "invalid_write_key", "writeKey: no source has the write key 'wk_nope'", "writeKey"
            ),
        ),
        "unknown write key (body)": BadRequest(
            "/v1/track",
            {},
            orjson.dumps({**track, "writeKey": "wk_unknown_key"}),
            401,
            call("invalid_write_key", "writeKey: no source has the write key 'wk_u…'", "writeKey"),
        ),
        "not Basic auth": BadRequest(
            "/v1/track",
            {"Authorization": "Bearer abc"},
            orjson.dumps(track),
            401,
            call(
                "invalid_write_key",
                "Authorization: not an HTTP Basic credential; send the write "
                "key as the username with an empty password",
                "Authorization",
            ),
        ),
        "oversized call": BadRequest(
            "/v1/track",
            auth,
            orjson.dumps(big_call),
            413,
            call(
                "too_large",
                f"call: is {len(orjson.dumps(big_call)):,} bytes, over the limit of 32,768 bytes",
                "call",
            ),
        ),
        "oversized call in a batch": BadRequest(
            "/v1/batch",
            auth,
            orjson.dumps({"batch": [{"type": "track", **track}, big_item]}),
            413,
            call(
                "too_large",
                f"batch[1]: is {len(orjson.dumps(big_item)):,} bytes, over the limit "
                "of 32,768 bytes",
                "batch[1]",
            ),
        ),
        "oversized batch": BadRequest(
            "/v1/batch",
            auth,
            orjson.dumps(oversized_batch),
            413,
            call("too_large", "body: is over the limit of 512,000 bytes a request", "body"),
        ),
        "gzip bomb": BadRequest(
            "/v1/batch",
            gz,
            _bomb(),
            413,
            call(
                "too_large",
                "body: is over the limit of 512,000 bytes a request (counted after decompression)",
                "body",
            ),
        ),
        "not gzip": BadRequest(
            "/v1/batch",
            gz,
            b'{"batch": []}',
            400,
            call(
                "invalid_gzip",
                "body: not a valid gzip stream: Error -3 while decompressing data: "
                "incorrect header check",
                "body",
            ),
        ),
        "truncated gzip": BadRequest(
            "/v1/track",
            gz,
            gzip.compress(orjson.dumps(track))[:-12],
            400,
            call("invalid_gzip", "body: the gzip stream is truncated", "body"),
        ),
        "unsupported encoding": BadRequest(
            "/v1/track",
            {**auth, "Content-Encoding": "br"},
            orjson.dumps(track),
            415,
            call(
                "unsupported_encoding",
                "Content-Encoding: 'br' is not supported; send gzip or no encoding",
                "Content-Encoding",
            ),
        ),
        "unknown endpoint": BadRequest(
            "/v1/delete",
            auth,
            orjson.dumps(track),
            404,
            call(
                "not_found",
                "/v1/delete: no such endpoint; use identify, track, page, screen, "
                "group, alias, batch or import",
                None,
            ),
        ),
    }


#: One test per bad request (the user only changes the bodies, not the names).
BAD_REQUESTS = list(_bad_requests("u"))


def _rejected_total(metrics: str, code: str) -> float:
    """``pipeline_calls_rejected_total{reason=code}`` in a /metrics text."""
    prefix = f'pipeline_calls_rejected_total{{reason="{code}"}} '
    line = next(line for line in metrics.splitlines() if line.startswith(prefix))
    return float(line.removeprefix(prefix))


@pytest.mark.parametrize(
    "name", [pytest.param(name, id=re.sub(r"\W+", "-", name).strip("-")) for name in BAD_REQUESTS]
)
def test_bad_input_gets_the_exact_error_and_loses_nothing(ingest, tagged_calls, tag, name):
    bad = _bad_requests(tag + "x")[name]
    good: list[str] = []

    def send_good(http: httpx.Client) -> None:
        message_id = f"good-{len(good)}"
        response = http.post(
            f"{ingest.url}/v1/track",
            headers=basic(WRITE_KEY),
            json={"userId": tag, "event": "Good", "messageId": message_id},
        )
        assert response.status_code == 200
        good.append(message_id)

    with httpx.Client(timeout=10) as http:
        send_good(http)
        rejected_before = _rejected_total(http.get(ingest.url + "/metrics").text, bad.error["code"])
        started = time.monotonic()
        response = http.post(ingest.url + bad.path, content=bad.body, headers=bad.headers)
        assert (response.status_code, response.json()) == (bad.status, bad.error)
        assert response.headers["Content-Type"] == "application/json"
        # Answered at once, not after a stall (the gzip bomb is not inflated): seconds, not 30.
        assert time.monotonic() - started < 10.0
        send_good(http)
        assert http.get(ingest.url + "/health").json() == {"status": "ok"}
        assert http.get(ingest.url + "/ready").json() == {"ready": True}
        metrics = http.get(ingest.url + "/metrics").text
    assert 'pipeline_calls_rejected_total{reason="too_large"}' in metrics
    assert 'pipeline_calls_ingested_total{type="track"}' in metrics
    if bad.error["code"] != "not_found":  # an unknown path is not a refused call
        assert _rejected_total(metrics, bad.error["code"]) > rejected_before

    tagged_calls.wait(len(good))
    records = tagged_calls.settle(0.5)
    # Every acknowledged call is there once, and nothing of the refused request was written.
    assert sorted(r["messageId"] for r in records) == sorted(good)


def test_concurrent_requests_are_all_acknowledged_and_written(ingest, tagged_calls, tag):
    async def main() -> list[int]:
        async with httpx.AsyncClient(timeout=30, auth=(WRITE_KEY, "")) as http:

            async def one(n: int) -> int:
                batch = [
                    {
                        "type": "track",
                        "userId": f"{tag}{n % 7}",
                        "event": "Burst",
                        "messageId": f"{tag}{n}-{i}",
                    }
                    for i in range(10)
                ]
                response = await http.post(f"{ingest.url}/v1/batch", json={"batch": batch})
                return response.status_code

            return await asyncio.gather(*(one(n) for n in range(60)))

    statuses = asyncio.run(main())
    assert statuses == [200] * 60
    records = tagged_calls.wait(600)
    assert len({r["messageId"] for r in records}) == 600


# ---- clock skew: the API and `pipeline send` agree -------------------------------------------------


def test_send_and_the_api_correct_clock_skew_alike(ingest, shared_settings, tagged_calls, tag):
    """A call without ``timestamp`` but with ``originalTimestamp`` gets Segment's skew-corrected
    time (``receivedAt - (sentAt - originalTimestamp)``, or ``originalTimestamp`` without
    ``sentAt``), whether it comes through the API or through ``pipeline send``."""
    from pipeline.ops.send import send_lines

    original, sent_at = "2020-01-01T00:00:00.000Z", "2020-01-01T00:01:30.250Z"
    skewed = {"type": "track", "event": "Skewed", "originalTimestamp": original, "sentAt": sent_at}
    unsent = {"type": "track", "event": "Unsent", "originalTimestamp": original}
    bad = {"type": "track", "event": "Bad", "originalTimestamp": "soon"}
    refusal = "originalTimestamp: 'soon' is not an ISO 8601 date-time"
    with httpx.Client(timeout=10, headers=basic(WRITE_KEY)) as http:
        for path, call in (("skewed", skewed), ("unsent", unsent)):
            body = {**call, "userId": f"{tag}api", "messageId": f"api-{path}"}
            response = http.post(f"{ingest.url}/v1/track", json=body)
            assert (response.status_code, response.json()) == (200, {"success": True})
        response = http.post(f"{ingest.url}/v1/track", json={**bad, "userId": f"{tag}api"})
        assert response.status_code == 400
        assert response.json()["message"] == refusal
    lines = [
        orjson.dumps({**skewed, "userId": f"{tag}send", "messageId": "send-skewed"}),
        orjson.dumps({**unsent, "userId": f"{tag}send", "messageId": "send-unsent"}),
        orjson.dumps({**bad, "userId": f"{tag}send"}),
    ]
    summary = send_lines(shared_settings, lines, write_key=WRITE_KEY, progress=False)
    assert (summary.sent, summary.rejected) == (2, [(3, refusal)])

    tagged_calls.wait(4)
    by_id = tagged_calls.by_message_id()
    assert len(tagged_calls.settle(0.3)) == 4
    lag = parse_timestamp(sent_at) - parse_timestamp(original)
    for via in ("api", "send"):
        corrected = by_id[f"{via}-skewed"]
        assert corrected["timestamp"] == corrected["receivedAt"] - lag, via
        assert corrected["sentAt"] == parse_timestamp(sent_at), via
        # No sentAt: originalTimestamp as it is (never later than receivedAt).
        assert by_id[f"{via}-unsent"]["timestamp"] == parse_timestamp(original), via


# ---- Kafka trouble ---------------------------------------------------------------------------------


def test_paused_broker_gets_503_never_200_and_the_api_recovers(ingest_factory):
    broker = EmbeddedBroker(port=0).start()  # never pause the session broker: others share it
    server: IngestThread | None = None
    try:
        settings = Settings(
            bootstrap_servers=broker.bootstrap_servers,
            topic_prefix="paused.",
            partitions=1,
            retry_partitions=1,
            retry_delays=(1.0,),
        )
        create_topics(settings)
        apply(settings, ingest_config())
        server = ingest_factory(settings, IngestOptions(ack_timeout=1.5, ready_timeout=0.5))
        acked: list[str] = []

        def post(http: httpx.Client, message_id: str) -> httpx.Response:
            response = http.post(
                f"{server.url}/v1/track",
                headers=basic(WRITE_KEY),
                json={"userId": "u", "event": "E", "messageId": message_id},
            )
            if response.status_code == 200:
                acked.append(message_id)
            return response

        with httpx.Client(timeout=20) as http:
            assert post(http, "before").status_code == 200
            broker.pause()
            started = time.monotonic()
            refused = post(http, "while-paused")
            assert refused.status_code == 503
            assert refused.headers["Retry-After"] == "1"
            body = refused.json()
            assert body["success"] is False and body["code"] == "kafka_unavailable"
            assert body["message"].startswith("Kafka did not acknowledge 1 of 1 calls")
            assert time.monotonic() - started < 8
            assert http.get(server.url + "/health").status_code == 200
            not_ready = http.get(server.url + "/ready")
            assert not_ready.status_code == 503 and not_ready.json()["ready"] is False
            broker.resume()
            attempts = iter(range(100))
            wait_for(lambda: post(http, f"after-{next(attempts)}").status_code == 200, timeout=30)
            # /ready asks the broker for metadata itself: it may need another moment.
            wait_for(lambda: http.get(server.url + "/ready").status_code == 200, timeout=10)
        reader = CallsTopic(settings)
        try:
            written = {r["messageId"] for r in reader.wait(len(acked))}
        finally:
            reader.close()
        assert set(acked) <= written  # every 200 is on the topic
        server.stop()
    finally:
        if server is not None:
            server.stop()
        broker.stop()


def test_pipeline_ingest_command_serves_and_stops_on_sigterm(
    settings, process_factory, calls_topic
):
    from pipeline.runtime.net import free_port

    apply(settings, ingest_config())
    port = free_port()
    process = process_factory(settings, "ingest", "--port", str(port), "--ack-timeout", "5s")
    url = f"http://127.0.0.1:{port}"
    wait_until_ready(url)
    response = httpx.post(
        url + "/v1/track",
        auth=(WRITE_KEY, ""),
        json={"userId": "u", "event": "Via CLI", "messageId": "m-cli"},
    )
    assert (response.status_code, response.json()) == (200, {"success": True})
    assert calls_topic.wait(1)[0]["messageId"] == "m-cli"
    process.terminate()
    assert process.wait(15) == 0
