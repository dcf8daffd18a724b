"""Audience syncs and computed traits end to end: real broker, real worker, real receiver (seed §6)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

import pipeline.ops.audience_sync as audience_sync_module
from pipeline.core.audience import TraitKind, TraitSpec, read_members
from pipeline.core.settings import Settings
from pipeline.kafka.clients import topics_for
from pipeline.ops.audience_sync import load_state, sync
from tests.support import (
    ROOT,
    Receiver,
    apply,
    delivery_log_entries,
    run_cli,
    settings_env,
    wait_for,
)

pytestmark = pytest.mark.integration

QUIET_SECONDS = 1.5
AUDIENCE = "Order Completed Last 30days"
PROPERTY = "order_completed_last_30days"


def one_source(settings: Settings, receiver: Receiver | None = None) -> None:
    destinations = []
    if receiver is not None:
        destinations = [{"id": "hooks", "sources": ["web"], "webhooks": [{"url": receiver.url}]}]
    apply(settings, {"sources": [{"id": "web"}], "destinations": destinations})


def audience_sync(settings: Settings, members: Path, *extra: str) -> dict[str, Any]:
    result = run_cli(
        settings, "audience", "sync", "--source", "web", "--name", AUDIENCE,
        "--members", str(members), "--json", *extra,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout.splitlines()[-1]))


def traits_sync(settings: Settings, values: Path) -> dict[str, Any]:
    result = run_cli(
        settings, "traits", "sync", "--source", "web", "--name", "Total Orders",
        "--values", str(values), "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout.splitlines()[-1]))


def traits_by_user(receiver: Receiver, start: int = 0) -> dict[str, Any]:
    bodies = receiver.bodies()[start:]
    assert all(b["type"] == "identify" and b["version"] == 1 for b in bodies), bodies
    return {b["userId"]: b["traits"] for b in bodies}


def expect_exactly(receiver: Receiver, count: int) -> None:
    wait_for(lambda: receiver.count() >= count, timeout=20)
    time.sleep(QUIET_SECONDS)
    assert receiver.count() == count


def test_audience_sync_sends_only_membership_changes(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    worker_factory: Callable[..., Any],
    tmp_path: Path,
) -> None:
    receiver = receiver_factory()
    one_source(settings, receiver)
    worker_factory(settings)
    members = tmp_path / "members.txt"

    members.write_text("u1\nu2\nu3\n")
    first = audience_sync(settings, members)
    assert first["first_sync"] is True and first["property"] == PROPERTY
    assert (first["added"], first["removed"], first["unchanged"], first["sent"]) == (3, 0, 0, 3)
    wait_for(lambda: receiver.count() >= 3, timeout=20)
    assert traits_by_user(receiver) == {u: {PROPERTY: True} for u in ("u1", "u2", "u3")}
    body = receiver.bodies()[0]
    assert body["context"]["personas"] == {
        "computation_class": "audience",
        "computation_key": PROPERTY,
        "computation_name": AUDIENCE,
    }

    # u1 leaves, u4 joins (CSV this time, with a duplicate and a blank line).
    members.write_text("email,user_id\nb@x,u2\n\nc@x,u3\nd@x,u4\nd@x,u4\n")
    second = audience_sync(settings, members)
    assert (second["added"], second["removed"], second["unchanged"], second["sent"]) == (1, 1, 2, 2)
    assert (second["duplicates"], second["blank_lines"]) == (1, 1)
    expect_exactly(receiver, 5)
    assert traits_by_user(receiver, 3) == {"u1": {PROPERTY: False}, "u4": {PROPERTY: True}}

    third = audience_sync(settings, members)
    assert (third["unchanged"], third["sent"]) == (3, 0)
    time.sleep(QUIET_SECONDS)
    assert receiver.count() == 5


def test_computed_trait_sync_keeps_json_types_and_sends_only_changes(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    worker_factory: Callable[..., Any],
    tmp_path: Path,
) -> None:
    receiver = receiver_factory()
    one_source(settings, receiver)
    worker_factory(settings)
    values = tmp_path / "values.csv"

    values.write_text("user_id,value\nu1,12\nu2,3.5\nu3,true\nu4,gold\nu5,007\n")
    first = traits_sync(settings, values)
    assert (first["added"], first["sent"]) == (5, 5)
    wait_for(lambda: receiver.count() >= 5, timeout=20)
    got = traits_by_user(receiver)
    assert got == {
        "u1": {"total_orders": 12},
        "u2": {"total_orders": 3.5},
        "u3": {"total_orders": True},
        "u4": {"total_orders": "gold"},
        "u5": {"total_orders": "007"},
    }
    raw = {orjson.loads(r.body)["userId"]: r.body for r in receiver.requests}
    assert b'"traits":{"total_orders":12}' in raw["u1"]
    assert b'"traits":{"total_orders":true}' in raw["u3"]

    values.write_text("user_id,value\nu1,12\nu2,4.5\nu3,true\nu4,gold\nu5,007\n")
    second = traits_sync(settings, values)
    assert (second["changed"], second["unchanged"], second["sent"]) == (1, 4, 1)
    expect_exactly(receiver, 6)
    assert traits_by_user(receiver, 5) == {"u2": {"total_orders": 4.5}}


def test_rerun_after_a_crash_never_leaves_a_wrong_value(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    worker_factory: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    receiver = receiver_factory()
    one_source(settings, receiver)
    worker_factory(settings)
    spec = TraitSpec.of(TraitKind.AUDIENCE, "web", AUDIENCE)
    state_topic = topics_for(settings).audience_state

    class CrashBeforeConfirming(audience_sync_module.AckedProducer):
        """Dies at the first state record written after the identify calls."""

        calls_sent = False

        def produce(self, topic: str, key: Any, value: Any, **kwargs: Any) -> None:
            if topic != state_topic:
                type(self).calls_sent = True
            elif type(self).calls_sent:
                raise KeyboardInterrupt("crash between sending and confirming")
            super().produce(topic, key, value, **kwargs)

    monkeypatch.setattr(audience_sync_module, "AckedProducer", CrashBeforeConfirming)
    with pytest.raises(KeyboardInterrupt):
        sync(settings, spec, read_members([b"a\n", b"b\n"]), progress=False)
    monkeypatch.undo()
    wait_for(lambda: receiver.count() >= 2, timeout=20)  # the calls were out before the crash
    state, _ = load_state(settings, spec)
    assert {u: (e.value, e.pending) for u, e in state.items()} == {
        "a": (None, "true"),
        "b": (None, "true"),
    }
    first_ids = {b["userId"]: b["messageId"] for b in receiver.bodies()}

    # Re-run with a different file: "a" left. It may hold true, so it must get false;
    # "b" is uncertain and is sent true again with the same messageId: the router drops it as
    # the resend it is (PIPELINE_DEDUPE_WINDOW; a receiver would dedupe it by messageId).
    summary = sync(settings, spec, read_members([b"b\n"]), progress=False)
    assert (summary.counts.added, summary.counts.resent, summary.sent) == (1, 1, 2)

    def resends() -> list[str]:
        dropped = delivery_log_entries(settings, "dropped")
        return [message_id for message_id, e in dropped if e["reason"] == "duplicate"]

    wait_for(lambda: resends() == [first_ids["b"]], timeout=20)
    expect_exactly(receiver, 3)
    again = {b["userId"]: b for b in receiver.bodies()[2:]}
    assert list(again) == ["a"]
    assert again["a"]["traits"] == {PROPERTY: False}
    assert again["a"]["messageId"] != first_ids["a"]

    state, _ = load_state(settings, spec)
    assert {u: (e.value, e.pending) for u, e in state.items()} == {"b": ("true", None)}
    assert sync(settings, spec, read_members([b"b\n"]), progress=False).sent == 0


def test_bad_input_is_rejected_before_anything_is_sent(settings: Settings, tmp_path: Path) -> None:
    one_source(settings)
    good = tmp_path / "good.txt"
    good.write_text("u1\n")

    def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
        return run_cli(settings, "audience", "sync", *args, input=stdin)

    unknown = run("--source", "nope", "--name", AUDIENCE, "--members", str(good))
    assert unknown.returncode == 2
    assert "--source: no source has the id 'nope'; known: web" in unknown.stderr

    empty_name = run("--source", "web", "--name", "?!", "--members", str(good))
    assert empty_name.returncode == 2
    assert "--name: '?!' has no letter or digit" in empty_name.stderr

    missing = run("--source", "web", "--name", AUDIENCE, "--members", str(tmp_path / "nope.txt"))
    assert missing.returncode == 2
    assert "nope.txt: cannot be read: No such file or directory" in missing.stderr

    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"u1\n" + b"x" * 1025 + b"\n\xff\nu2\n")
    rejected = run("--source", "web", "--name", AUDIENCE, "--members", str(bad))
    assert rejected.returncode == 2
    assert "bad.txt: 2 problem(s), nothing was sent" in rejected.stderr
    assert "line 2: user_id is 1,025 characters, over the limit of 1,024" in rejected.stderr
    assert "line 3: is not UTF-8 text" in rejected.stderr

    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n")
    empty = run("--source", "web", "--name", AUDIENCE, "--members", str(blank))
    assert empty.returncode == 2
    assert "blank.txt: lists no users; syncing it would remove everyone" in empty.stderr

    values = tmp_path / "values.csv"
    values.write_text("u1,1\nu1,2\n")
    conflicting = run_cli(
        settings, "traits", "sync", "--source", "web", "--name", "Total Orders",
        "--values", str(values),
    )  # fmt: skip
    assert conflicting.returncode == 2
    assert "line 2: user 'u1' is listed again with a different value (2 after 1)" in (
        conflicting.stderr
    )

    # Nothing was half-applied: the next good sync (from stdin) is still the first one.
    ok = run("--source", "web", "--name", AUDIENCE, "--members", "-", "--json", stdin=b"u1\nu2\n")
    assert ok.returncode == 0, ok.stderr
    summary = json.loads(ok.stdout.splitlines()[-1])
    assert (summary["first_sync"], summary["added"], summary["sent"]) == (True, 2, 2)
    assert "warning: source 'web' has no enabled destination" in ok.stderr


# ---- 100,000 members -----------------------------------------------------------------------------

MEASURE = """
import json, resource, sys, time
from pipeline.commands.cli import main
started = time.monotonic()
code = main(sys.argv[1:])
seconds = time.monotonic() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print("MEASURE " + json.dumps({"code": code, "seconds": seconds, "peak_rss": peak}))
"""
MEMBERS = 100_000


def measured_sync(settings: Settings, members: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run ``audience sync`` in a fresh interpreter; its summary, time and peak RSS."""
    args = ["--source", "web", "--name", "Big Audience", "--members", str(members), "--json"]
    result = subprocess.run(
        [sys.executable, "-c", MEASURE, "audience", "sync", *args, "--no-progress"],
        capture_output=True,
        text=True,
        env=settings_env(settings),
        timeout=60,
        cwd=ROOT,
    )
    lines = result.stdout.splitlines()
    measure = json.loads(next(x for x in lines if x.startswith("MEASURE "))[8:])
    assert measure["code"] == 0, result.stderr
    return json.loads(next(x for x in lines if x.startswith("{"))), measure


def test_100k_member_audience_sync_is_fast_and_bounded(settings: Settings, tmp_path: Path) -> None:
    one_source(settings)
    members = tmp_path / "members.txt"
    ids = [f"user-{n:07d}" for n in range(MEMBERS)]
    members.write_text("\n".join(ids) + "\n")

    first, first_cost = measured_sync(settings, members)
    assert (first["first_sync"], first["added"], first["sent"]) == (True, MEMBERS, MEMBERS)

    # 1 % changed: 500 leave, 500 join.
    changed = ids[500:] + [f"new-{n:05d}" for n in range(500)]
    members.write_text("\n".join(changed) + "\n")
    second, second_cost = measured_sync(settings, members)
    assert (second["added"], second["removed"], second["sent"]) == (500, 500, 1000)
    assert second["unchanged"] == MEMBERS - 500

    for label, cost in (("first sync", first_cost), ("1% re-sync", second_cost)):
        print(
            f"\n100k audience {label}: {cost['seconds']:.1f} s, "
            f"peak RSS {cost['peak_rss'] / 2**20:.0f} MiB"
        )
        assert cost["peak_rss"] < 500 * 2**20
    assert first_cost["seconds"] + second_cost["seconds"] < 50
