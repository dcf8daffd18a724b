"""``trace``, ``log`` and ``stats`` over the delivery log of one run (``log_journeys``): every
state a trace reports (delivered, waiting, dead_lettered, dropped per call and per destination)
and every filter of ``log``. The run is the module's: these tests only read it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from pipeline.core.settings import Settings
from tests.integration.log_journeys import Store, cli_json, logged
from tests.integration.log_journeys import journeys as run_journeys
from tests.support import Receiver, run_cli

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def journeys(
    module_settings: Settings,
    module_receiver_factory: Callable[..., Receiver],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Settings, Store]]:
    settings = logged(module_settings, tmp_path_factory.mktemp("log"))
    with run_journeys(settings, module_receiver_factory) as run:
        yield run


def test_trace_shows_every_state_and_the_journey_in_time_order(
    journeys: tuple[Settings, Store],
) -> None:
    settings, _ = journeys
    [order] = cli_json(settings, "trace", "m-order")
    assert (order["source"], order["call_type"], order["user_id"], order["event"]) == (
        "a",
        "track",
        "u1",
        "Order",
    )
    kinds = [(e["kind"], e.get("destination", "")) for e in order["entries"]]
    assert kinds[:2] == [("received", ""), ("routed", "")]
    assert set(kinds[2:]) == {
        ("dropped", "off"),
        ("attempt", "ok"),
        ("delivered", "ok"),
        ("attempt", "bad"),
        ("dead_lettered", "bad"),
    }
    times = [e["at"] for e in order["entries"]]
    assert times == sorted(times)
    bad_attempt = next(
        e for e in order["entries"] if e["kind"] == "attempt" and e["destination"] == "bad"
    )
    assert (bad_attempt["status"], bad_attempt["error"], bad_attempt["response"]) == (
        404,
        "client_error",
        "nope",
    )
    states = {d["destination"]: d for d in order["destinations"]}
    assert states["ok"]["state"] == "delivered" and states["ok"]["last_status"] == 200
    assert (states["bad"]["state"], states["bad"]["reason"]) == ("dead_lettered", "client_error")
    assert (states["off"]["state"], states["off"]["reason"]) == ("dropped", "destination_disabled")

    [page] = cli_json(settings, "trace", "m-page")
    [slow] = page["destinations"]
    assert (slow["state"], slow["tier"], slow["anonymous_id"]) == ("waiting", 0, "anon-3")
    assert slow["not_before"] > page["entries"][0]["at"]

    [debug] = cli_json(settings, "trace", "m-debug")
    assert [(d["state"], d["reason"]) for d in debug["destinations"]] == [
        ("dropped", "blocked_event")
    ]
    [none] = cli_json(settings, "trace", "m-none")
    reasons = {d["destination"]: d["reason"] for d in none["destinations"]}
    assert reasons == {
        "": "no_destination",
        "ok": "integrations",
        "bad": "integrations",
        "off": "destination_disabled",
    }

    text = run_cli(settings, "trace", "m-page")
    assert text.returncode == 0 and "waiting" in text.stdout and "tier 0" in text.stdout
    missing = run_cli(settings, "trace", "no-such-message")
    assert missing.returncode == 1 and "no-such-message" in missing.stderr


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            (),
            {
                "m-order/ok",
                "m-order/bad",
                "m-order/off",
                "m-debug/",
                "m-none/",
                "m-page/slow",
                "m-none/ok",
                "m-none/bad",
                "m-none/off",
            },
        ),
        (("--destination", "ok"), {"m-order/ok", "m-none/ok"}),
        (("--source", "b"), {"m-page/slow"}),
        (("--user", "anon-3"), {"m-page/slow"}),
        (("--user", "u2"), {"m-none/", "m-none/ok", "m-none/bad", "m-none/off"}),
        (("--type", "page"), {"m-page/slow"}),
        (("--state", "delivered"), {"m-order/ok"}),
        (("--state", "waiting"), {"m-page/slow"}),
        (("--state", "dead_lettered"), {"m-order/bad"}),
        (("--state", "failed"), {"m-order/bad", "m-page/slow"}),
        (("--state", "dropped", "--source", "a", "--type", "track"), {"m-order/off", "m-debug/"}),
        (("--until", "1d"), set()),
        (("--since", "1h", "--destination", "slow"), {"m-page/slow"}),
    ],
)
def test_log_filters(
    journeys: tuple[Settings, Store], flags: tuple[str, ...], expected: set[str]
) -> None:
    settings, _ = journeys
    rows = cli_json(settings, "log", *flags)
    assert {f"{r['message_id']}/{r['destination']}" for r in rows} == expected
    updated = [r["last_updated"] for r in rows]
    assert updated == sorted(updated, reverse=True)  # newest first


def test_log_limit_and_text(journeys: tuple[Settings, Store]) -> None:
    settings, _ = journeys
    assert len(cli_json(settings, "log", "--limit", "2")) == 2
    text = run_cli(settings, "log", "--state", "waiting")
    assert text.returncode == 0 and "m-page" in text.stdout and "slow" in text.stdout
    bad = run_cli(settings, "log", "--since", "yesterday")
    assert bad.returncode == 2 and "--since" in bad.stderr and "yesterday" in bad.stderr


def test_stats_per_destination(journeys: tuple[Settings, Store]) -> None:
    settings, _ = journeys
    stats = {row["destination"]: row for row in cli_json(settings, "stats", "--since", "1h")}
    assert (stats["ok"]["attempts"], stats["ok"]["delivered"], stats["ok"]["success_ratio"]) == (
        1,
        1,
        1.0,
    )
    assert (stats["bad"]["failed"], stats["bad"]["dead_lettered"], stats["bad"]["last_error"]) == (
        1,
        1,
        "client_error",
    )
    assert stats["bad"]["last_error_status"] == 404 and stats["bad"]["last_error_at"]
    assert (stats["slow"]["waiting"], stats["slow"]["success_ratio"]) == (1, 0.0)
    assert stats["ok"]["p50_ms"] is not None and stats["ok"]["p95_ms"] >= stats["ok"]["p50_ms"]
    assert list(stats)[0] in {"bad", "slow"}  # problems first
    # A window without attempts: only what waits now (whatever the window) is left.
    [idle] = cli_json(settings, "stats", "--since", "2d", "--until", "1d")
    assert (idle["destination"], idle["attempts"], idle["waiting"]) == ("slow", 0, 1)
