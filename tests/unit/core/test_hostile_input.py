"""Hostile input, property-based: a clear validation error or a correct result, never a crash.

Arbitrary JSON, deep nesting, huge numbers, lone surrogates, NUL bytes, header injection in config,
absurd URLs. Whatever is accepted renders to a body that is valid compact JSON whose signature
matches the bytes.
"""

from __future__ import annotations

import hashlib
import hmac

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pipeline import CallTooLarge, ConfigError, InvalidCall, parse_call, render_body, sign, verify
from pipeline.core.config import check_url, validate_config

TYPES = ["identify", "track", "page", "screen", "group", "alias", "delete", "fly", "", None, 3]
nasty_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["\x00", "\ud800", "\udfff", "a\r\nb", "\u2028", "</script>", "💥" * 5, " "]),
)
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    nasty_text,
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.one_of(nasty_text, st.integers()), children, max_size=4)
    ),
    max_leaves=30,
)
ids = st.one_of(
    st.none(), nasty_text, st.integers(), st.booleans(), st.floats(), st.lists(st.text())
)
calls = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(TYPES),
        "userId": ids,
        "anonymousId": ids,
        "messageId": ids,
        "event": ids,
        "name": ids,
        "groupId": ids,
        "previousId": ids,
        "timestamp": st.one_of(nasty_text, st.just("2026-11-21T07:04:30.123-0800"), st.integers()),
        "properties": json_values,
        "traits": json_values,
        "context": json_values,
        "integrations": json_values,
        "extra": json_values,
    },
)


def _deep(depth: int) -> dict:
    node: dict = {}
    for _ in range(depth):
        node = {"n": node}
    return node


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=calls)
@example(raw={"type": "track", "userId": "u", "event": "e", "properties": {"n": 2**70}})
@example(raw={"type": "track", "userId": "u", "event": "e", "properties": {"s": "\ud800"}})
@example(raw={"type": "track", "userId": "u\x00", "event": "e\x00", "properties": {"\x00": "\x00"}})
@example(raw={"type": "identify", "userId": "u", "traits": {1: "non-string key"}})
def test_any_call_is_either_rejected_clearly_or_rendered_and_signed_correctly(raw: dict) -> None:
    try:
        call = parse_call(raw, source_id="web", received_at=1_795_244_670_123)
    except CallTooLarge as exc:
        assert exc.size > exc.limit
        return
    except InvalidCall as exc:
        assert exc.field and exc.message  # names the field and the problem
        return
    body = render_body(call)
    decoded = orjson.loads(body)  # valid JSON...
    assert orjson.dumps(decoded) == body  # ...in compact form, byte for byte
    assert decoded["type"] == call.type.value
    signature = sign(body, "k")
    assert signature == hmac.new(b"k", body, hashlib.sha1).hexdigest()
    assert verify(body, "k", signature)


@pytest.mark.parametrize("depth", [100, 300, 5000])
def test_deep_nesting_is_rendered_or_refused_naming_the_field(depth: int) -> None:
    raw = {"type": "track", "userId": "u", "event": "e", "properties": _deep(depth)}
    try:
        call = parse_call(raw, source_id="web", received_at=0)
    except InvalidCall as exc:
        assert depth > 200  # orjson's nesting limit
        assert exc.field == "properties"
        assert "Recursion limit" in exc.message
        return
    assert orjson.loads(render_body(call))["properties"]["n"]["n"] is not None


@settings(max_examples=200, deadline=None)
@given(data=json_values)
def test_parse_call_never_raises_anything_but_invalid_call(data: object) -> None:
    try:
        parse_call(data, source_id="web", received_at=0)
    except InvalidCall:
        pass


header_names = st.one_of(
    st.text(max_size=20), st.sampled_from(["X-Ok", "Host", "X-Signature", "Bad Name", ""])
)
header_values = st.one_of(
    st.text(max_size=30), st.sampled_from(["a\r\nX-Injected: 1", "a\nb", "\x00", "ok", "\t tab"])
)


@settings(max_examples=300, deadline=None)
@given(headers=st.dictionaries(header_names, header_values, max_size=4), url=st.text(max_size=60))
@example(headers={"X-A": "v\r\nX-B: injected"}, url="https://example.com/")
@example(headers={}, url="javascript:alert(1)")
@example(headers={}, url="http://[::1")
@example(headers={}, url="https://" + "a" * 3000 + ".example/")
@example(headers={}, url="http://user:pw@example.com/")
@example(headers={}, url="http://example.com:99999/")
def test_config_is_accepted_only_when_safe(headers: dict, url: str) -> None:
    config = {
        "sources": [{"id": "web"}],
        "destinations": [
            {"id": "d", "sources": ["web"], "webhooks": [{"url": url, "headers": headers}]}
        ],
    }
    try:
        accepted = validate_config(config)
    except ConfigError as exc:
        assert exc.problems and all(p.startswith("destinations[0] (d).") for p in exc.problems)
        return
    hook = accepted.destinations[0].webhooks[0]
    assert hook.url.startswith(("http://", "https://"))
    for name, value in hook.headers.items():
        assert not any(ch in name + value for ch in "\r\n\x00")
        assert name.lower() not in ("host", "x-signature", "content-length")


@settings(max_examples=300, deadline=None)
@given(url=st.text(max_size=80))
def test_check_url_raises_only_value_error(url: str) -> None:
    try:
        check_url(url)
    except ValueError:
        pass


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com",
        "https://example.com:8443/p?q=1",
        "http://127.0.0.1:8090/hook",
        "http://[::1]:80/",
    ],
)
def test_reasonable_urls_pass(url: str) -> None:
    assert check_url(url) == url
