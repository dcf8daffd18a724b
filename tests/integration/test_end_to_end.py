"""A call produced with ``pipeline send`` comes out at a receiver as the exact seed §2.2 request."""

from __future__ import annotations

import hashlib
import hmac
import re

import orjson
import pytest

from tests.support import apply, run_cli, wait_for

SECRET = "s3cret-for-tests"
TS = "2026-11-21T07:04:30.123Z"

CALLS = [
    {
        "type": "identify",
        "userId": "u1",
        "messageId": "m-identify",
        "timestamp": TS,
        "traits": {"name": "Ada", "logins": 12},
    },
    {
        "type": "track",
        "userId": "u1",
        "messageId": "m-track",
        "timestamp": TS,
        "event": "Order Completed",
        "properties": {"revenue": "42.50", "city": "Zürich"},
    },
    {
        "type": "page",
        "userId": "u1",
        "messageId": "m-page",
        "timestamp": TS,
        "properties": {
            "path": "/p",
            "referrer": "https://r.example/",
            "title": "P",
            "url": "https://x.example/p",
        },
    },
    {
        "type": "screen",
        "userId": "u1",
        "messageId": "m-screen",
        "timestamp": TS,
        "name": "Home",
        "context": {
            "device": {"model": "Pixel", "type": "android"},
            "os": {"name": "Android", "version": "16"},
            "app": {"build": "4", "name": "Shop", "version": "4.1"},
        },
    },
    {
        "type": "group",
        "userId": "u1",
        "messageId": "m-group",
        "timestamp": TS,
        "groupId": "acme",
        "traits": {"name": "Acme", "employee count": 250},
    },
    {
        "type": "alias",
        "userId": "u1",
        "messageId": "m-alias",
        "timestamp": TS,
        "previousId": "anon-1",
    },
    {"type": "delete", "userId": "u1", "messageId": "m-delete", "timestamp": TS},
]

EXPECTED = {
    "identify": b'{"version":1,"type":"identify","userId":"u1","messageId":"m-identify",'
    b'"timestamp":"2026-11-21T07:04:30.123Z","traits":{"name":"Ada","logins":12}}',
    "track": '{"version":1,"type":"track","userId":"u1","messageId":"m-track",'
    '"timestamp":"2026-11-21T07:04:30.123Z","event":"Order Completed",'
    '"properties":{"revenue":"42.50","city":"Zürich"}}'.encode(),
    "page": b'{"version":1,"type":"page","userId":"u1","messageId":"m-page",'
    b'"timestamp":"2026-11-21T07:04:30.123Z","properties":{"path":"/p",'
    b'"referrer":"https://r.example/","title":"P","url":"https://x.example/p"}}',
    "screen": b'{"version":1,"type":"screen","userId":"u1","messageId":"m-screen",'
    b'"timestamp":"2026-11-21T07:04:30.123Z","name":"Home","context":{"device":{"model":"Pixel",'
    b'"type":"android"},"os":{"name":"Android","version":"16"},"app":{"build":"4","name":"Shop",'
    b'"version":"4.1"}}}',
    "group": b'{"version":1,"type":"group","userId":"u1","messageId":"m-group",'
    b'"timestamp":"2026-11-21T07:04:30.123Z","groupId":"acme",'
    b'"traits":{"name":"Acme","employee count":250}}',
    "alias": b'{"version":1,"type":"alias","userId":"u1","messageId":"m-alias",'
    b'"timestamp":"2026-11-21T07:04:30.123Z","Previous ID":"anon-1","User ID":"u1"}',
    "delete": b'{"type":"delete","userId":"u1","timestamp":"2026-11-21T07:04:30.123Z"}',
}


def _config(url: str, secret: str | None) -> dict:
    destination = {
        "id": "hooks",
        "name": "Webhooks",
        "sources": ["web"],
        "webhooks": [{"url": url, "headers": {"Authorization": "Bearer abc", "X-Team": "growth"}}],
    }
    if secret is not None:
        destination["shared_secret"] = secret
    return {
        "sources": [{"id": "web", "name": "Web", "write_keys": ["wk_1"]}],
        "destinations": [destination],
    }


@pytest.mark.parametrize("secret", [SECRET, None], ids=["signed", "unsigned"])
def test_every_call_type_arrives_as_the_seed_request(
    settings, receiver_factory, worker_factory, tmp_path, secret
):
    receiver = receiver_factory()
    apply(settings, _config(receiver.url, secret))
    worker_factory(settings)
    calls = tmp_path / "calls.jsonl"
    calls.write_bytes(b"\n".join(orjson.dumps(c) for c in CALLS) + b"\n")

    result = run_cli(settings, "send", str(calls), "--write-key", "wk_1")
    assert result.returncode == 0, result.stderr
    assert "sent 7 calls, rejected 0 lines" in result.stderr

    wait_for(lambda: receiver.count() >= 7)
    by_type = {r.json["type"]: r for r in receiver.requests}
    assert sorted(by_type) == sorted(EXPECTED)
    for kind, request in by_type.items():
        assert request.body == EXPECTED[kind], kind
        headers = {k.lower(): v for k, v in request.headers.items()}
        assert headers["content-type"] == "application/json"
        assert re.fullmatch(r"[A-Za-z0-9._-]+/1\.0", headers["user-agent"])
        assert headers["authorization"] == "Bearer abc"
        assert headers["x-team"] == "growth"
        if secret is None:
            assert "x-signature" not in headers
        else:
            expected = hmac.new(secret.encode(), request.body, hashlib.sha1).hexdigest()
            assert headers["x-signature"] == expected
    assert receiver.count() == 7
