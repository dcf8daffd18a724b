"""Bad input gets an error naming the problem, and nothing valid is lost."""

from __future__ import annotations

import orjson
import yaml

from tests.support import apply, run_cli, simple_config, wait_for


def test_send_reports_bad_lines_by_number_and_sends_the_good_ones(
    settings, receiver_factory, worker_factory, tmp_path
):
    receiver = receiver_factory()
    apply(settings, simple_config(receiver.url))
    worker_factory(settings)
    huge = {"type": "track", "userId": "u1", "event": "Huge", "properties": {"x": "y" * 40_000}}
    lines = [
        orjson.dumps({"type": "track", "userId": "u1", "event": "Good 1"}),
        b'{"type": "track", "userId": ',  # malformed JSON
        orjson.dumps({"type": "track", "userId": "u1"}),  # no event
        orjson.dumps(huge),
        b"",
        orjson.dumps({"type": "identify", "userId": 7, "traits": {"n": 1}}),  # int id is accepted
        orjson.dumps({"type": "track", "userId": "u1", "event": "Bad key", "writeKey": "nope"}),
        orjson.dumps({"type": "fly", "userId": "u1"}),
        orjson.dumps(
            {"type": "track", "userId": "u1", "event": "Good 2", "timestamp": "yesterday"}
        ),
        orjson.dumps({"type": "track", "userId": "u1", "event": "Good 3", "properties": [1]}),
        orjson.dumps({"type": "track", "userId": "u1", "event": "Good 4"}),
    ]
    path = tmp_path / "calls.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")

    result = run_cli(settings, "send", str(path), "--write-key", "wk")

    assert result.returncode == 1
    errors = result.stderr
    assert "line 2: invalid JSON" in errors
    assert "line 3: event: is required for a track call" in errors
    assert "line 4: call: is 40,0" in errors and "over the limit of 32,768 bytes" in errors
    assert "line 7: writeKey: no source has the write key 'nope'" in errors
    assert "line 8: type: 'fly' is not a call type" in errors
    assert "line 9: timestamp: 'yesterday' is not an ISO 8601 date-time" in errors
    assert "line 10: properties: must be a JSON object, got an array" in errors
    assert "sent 3 calls, rejected 7 lines" in errors

    wait_for(lambda: receiver.count() == 3)
    bodies = receiver.bodies()
    assert sorted(b.get("event", b["type"]) for b in bodies) == ["Good 1", "Good 4", "identify"]
    assert [b["userId"] for b in bodies if b["type"] == "identify"] == ["7"]


def test_send_stdin_and_missing_write_key(settings):
    apply(settings, simple_config("http://127.0.0.1:9/hook"))
    result = run_cli(settings, "send", "-", input=b'{"type":"track","userId":"u","event":"E"}\n')
    assert result.returncode == 1
    assert "line 1: writeKey: no write key" in result.stderr
    missing = run_cli(settings, "send", "/nonexistent/calls.jsonl", "--write-key", "wk")
    assert missing.returncode == 2
    assert "No such file" in missing.stderr


def _bad(config_changes: dict) -> dict:
    config = simple_config("https://example.com/hook")
    config["destinations"][0].update(config_changes)
    return config


def test_bad_config_is_refused_with_the_field_named_and_nothing_written(settings, tmp_path):
    good = simple_config("https://example.com/good")
    apply(settings, good)
    cases = {
        "six webhooks": (
            _bad({"webhooks": [{"url": f"https://example.com/{i}"} for i in range(6)]}),
            "destinations[0] (hooks).webhooks: at most 5 webhooks per destination, got 6",
        ),
        "ftp url": (
            _bad({"webhooks": [{"url": "ftp://example.com/hook"}]}),
            "destinations[0] (hooks).webhooks[0].url: 'ftp://example.com/hook' must use http:// or https://",
        ),
        "header newline": (
            _bad(
                {"webhooks": [{"url": "https://example.com/h", "headers": {"X-A": "a\r\nX-B: b"}}]}
            ),
            "destinations[0] (hooks).webhooks[0].headers: header 'X-A' has a line break or NUL",
        ),
        "unknown source": (
            _bad({"sources": ["web", "mobile"]}),
            "destinations[0] (hooks).sources: unknown source 'mobile'",
        ),
        "not yaml": ("sources: [unclosed", "not valid YAML"),
    }
    for name, (config, message) in cases.items():
        path = tmp_path / f"{name.replace(' ', '_')}.yaml"
        path.write_text(config if isinstance(config, str) else yaml.safe_dump(config))
        result = run_cli(settings, "config", "apply", str(path))
        assert result.returncode == 2, name
        assert message in result.stderr, (name, result.stderr)

    shown = run_cli(settings, "config", "show", "--json")
    assert shown.returncode == 0, shown.stderr
    [destination] = orjson.loads(shown.stdout)["destinations"]
    assert [w["url"] for w in destination["webhooks"]] == ["https://example.com/good"]
