"""Metrics of real worker processes after a scripted run, read from ``/metrics`` and through a real
Prometheus.

The script (3 calls, 4 destinations, each with its own receiver):

- ``ok``: answers 200: 3 delivered at the first attempt;
- ``flaky``: answers 500 to each call's first two requests (its first attempt and its tier-0
  retry), then 200: 3 x (retry to tier 0, retry to tier 1, delivered);
- ``gone``: answers 400: 3 dead letters (``client_error``) at the first attempt;
- ``broken``: answers 503 to each call's first request, then 404: 3 x (retry to tier 0, dead
  letter);
- plus one blocked track event that the router drops.

Each endpoint's circuit breaker is set to open only after more failures in a row than the script
makes, so every attempt is really sent.

With the test settings (retry delays 1 s, 2 s) the whole run takes about 4 s.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.settings import Settings
from pipeline.runtime.net import free_port
from tests.support import (
    ROOT,
    Receiver,
    apply,
    by_attempt,
    require_system_tools,
    scrape,
    send_calls,
    simple_config,
    stays,
    try_scrape,
    wait_for,
)

DESTINATIONS = ("ok", "flaky", "gone", "broken")
CALLS: list[dict[str, Any]] = [
    {"type": "track", "userId": "u1", "event": "Order Completed", "messageId": "m1"},
    {"type": "track", "userId": "u2", "event": "Signed Up", "messageId": "m2"},
    {"type": "identify", "userId": "u3", "traits": {"plan": "pro"}, "messageId": "m3"},
    {"type": "track", "userId": "u4", "event": "Debug Event", "messageId": "m4"},  # blocked
]
ROUTED = len(CALLS) - 1  # calls that reach the destinations

# What one process running router, deliver and retry counts (exact).
WORKER_EXPECTED: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {
    ("pipeline_calls_routed_total", (("type", "track"),)): 3,
    ("pipeline_calls_routed_total", (("type", "identify"),)): 1,
    ("pipeline_calls_routed_total", (("type", "page"),)): 0,
    ("pipeline_calls_dropped_total", (("reason", "blocked_event"),)): 1,
    ("pipeline_deliveries_routed_total", ()): ROUTED * len(DESTINATIONS),
    ("pipeline_deliveries_total", (("outcome", "delivered"),)): 2 * ROUTED,
    ("pipeline_deliveries_total", (("outcome", "retry"),)): 3 * ROUTED,
    ("pipeline_deliveries_total", (("outcome", "dead_letter"),)): 2 * ROUTED,
    ("pipeline_retries_total", (("tier", "0"),)): 2 * ROUTED,
    ("pipeline_retries_total", (("tier", "1"),)): ROUTED,
    ("pipeline_dead_letters_total", (("reason", "client_error"),)): 2 * ROUTED,
    ("pipeline_delivery_attempt_seconds_count", ()): 7 * ROUTED,
    ("pipeline_end_to_end_seconds_count", ()): 2 * ROUTED,
    ("pipeline_in_flight", (("role", "router"),)): 0,
    ("pipeline_in_flight", (("role", "deliver"),)): 0,
    ("pipeline_in_flight", (("role", "retry"),)): 0,
}

# The same run split over one process per role: each counts its own part.
ROLE_EXPECTED: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {
    "router": {
        ("pipeline_calls_routed_total", (("type", "track"),)): 3,
        ("pipeline_calls_routed_total", (("type", "identify"),)): 1,
        ("pipeline_calls_dropped_total", (("reason", "blocked_event"),)): 1,
        ("pipeline_deliveries_routed_total", ()): ROUTED * len(DESTINATIONS),
        ("pipeline_in_flight", (("role", "router"),)): 0,
    },
    "deliver": {  # first attempts: ok delivered, flaky + broken to tier 0, gone dead-lettered
        ("pipeline_deliveries_total", (("outcome", "delivered"),)): ROUTED,
        ("pipeline_deliveries_total", (("outcome", "retry"),)): 2 * ROUTED,
        ("pipeline_deliveries_total", (("outcome", "dead_letter"),)): ROUTED,
        ("pipeline_retries_total", (("tier", "0"),)): 2 * ROUTED,
        ("pipeline_dead_letters_total", (("reason", "client_error"),)): ROUTED,
        ("pipeline_delivery_attempt_seconds_count", ()): 4 * ROUTED,
        ("pipeline_end_to_end_seconds_count", ()): ROUTED,
        ("pipeline_in_flight", (("role", "deliver"),)): 0,
    },
    "retry": {  # tier 0: flaky to tier 1, broken dead-lettered; tier 1: flaky delivered
        ("pipeline_deliveries_total", (("outcome", "delivered"),)): ROUTED,
        ("pipeline_deliveries_total", (("outcome", "retry"),)): ROUTED,
        ("pipeline_deliveries_total", (("outcome", "dead_letter"),)): ROUTED,
        ("pipeline_retries_total", (("tier", "1"),)): ROUTED,
        ("pipeline_dead_letters_total", (("reason", "client_error"),)): ROUTED,
        ("pipeline_delivery_attempt_seconds_count", ()): 3 * ROUTED,
        ("pipeline_end_to_end_seconds_count", ()): ROUTED,
        ("pipeline_in_flight", (("role", "retry"),)): 0,
    },
}
#: Another role's work: absent from (or zero in) a role's process.
ROLE_NOTHING = {
    "router": ("pipeline_deliveries_total", "pipeline_retries_total"),
    "deliver": ("pipeline_calls_routed_total", "pipeline_deliveries_routed_total"),
    "retry": ("pipeline_calls_routed_total", "pipeline_deliveries_routed_total"),
}


# ---- helpers -----------------------------------------------------------------------------------


def scripted_settings(settings: Settings) -> Settings:
    """The test settings, with each endpoint's circuit breaker set above the script's longest run
    of failures (``flaky`` fails 2 x ROUTED times in a row): an open circuit would turn attempts
    into "not tried" retries, and this test is about counting known paths."""
    return settings.replace(circuit_failures=2 * ROUTED + 1)


def script(settings: Settings, receiver_factory: Callable[..., Receiver]) -> dict[str, Receiver]:
    receivers = {
        "ok": receiver_factory(200),
        "flaky": receiver_factory(by_attempt(500, 500, then=200)),
        "gone": receiver_factory(400),
        "broken": receiver_factory(by_attempt(503, then=404)),
    }
    apply(
        settings,
        {
            "sources": [{"id": "web", "write_keys": ["wk"], "blocked_events": ["Debug Event"]}],
            "destinations": [
                {
                    "id": name,
                    "name": f"Webhooks {name}",
                    "sources": ["web"],
                    "webhooks": [{"url": receivers[name].url}],
                }
                for name in DESTINATIONS
            ],
        },
    )
    return receivers


def run_finished(receivers: dict[str, Receiver]) -> bool:
    """Every request the script expects has reached its receiver."""
    return (
        receivers["ok"].count() == ROUTED
        and receivers["flaky"].count() == 3 * ROUTED
        and receivers["gone"].count() == ROUTED
        and receivers["broken"].count() == 2 * ROUTED
    )


def settled(
    port: int, expected: dict[tuple[str, tuple[tuple[str, str], ...]], float]
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
    """The scrape once it shows ``expected`` (hand-offs are counted before Kafka acknowledges
    them, deliveries when the answer arrives: give the process a moment after the receivers)."""
    samples = try_scrape(port)
    if samples is None:
        return None
    return samples if all(samples.get(k) == v for k, v in expected.items()) else None


def wait_until_settled(
    port: int, expected: dict[tuple[str, tuple[tuple[str, str], ...]], float], timeout: float = 10
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``settled``, or fail showing what differs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        samples = settled(port, expected)
        if samples is not None:
            return samples
        time.sleep(0.2)
    samples = scrape(port)
    assert_exact(samples, expected)
    return samples


def assert_exact(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float],
    expected: dict[tuple[str, tuple[tuple[str, str], ...]], float],
) -> None:
    wrong = {k: (samples.get(k), v) for k, v in expected.items() if samples.get(k) != v}
    assert not wrong, f"metric: (got, expected): {wrong}"


def labelled(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str
) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value for (n, labels), value in samples.items() if n == name and value}


# ---- one worker process ----------------------------------------------------------------------


def test_worker_metrics_show_the_exact_counts_of_a_scripted_run(
    settings, receiver_factory, process_factory
):
    settings = scripted_settings(settings)
    receivers = script(settings, receiver_factory)
    port = free_port()
    process_factory(settings, "worker", "--metrics-port", str(port))
    wait_for(lambda: try_scrape(port), timeout=30)
    send_calls(settings, CALLS, "wk")

    wait_for(lambda: run_finished(receivers), timeout=30)
    wait_until_settled(port, WORKER_EXPECTED)
    time.sleep(1.0)  # nothing more comes: no late retry, no duplicate
    samples = scrape(port)
    assert_exact(samples, WORKER_EXPECTED)
    # Nothing but the scripted outcomes was counted (no other label got a non-zero value).
    assert labelled(samples, "pipeline_deliveries_total") == {
        (("outcome", "delivered"),): 2 * ROUTED,
        (("outcome", "retry"),): 3 * ROUTED,
        (("outcome", "dead_letter"),): 2 * ROUTED,
    }
    assert labelled(samples, "pipeline_dead_letters_total") == {
        (("reason", "client_error"),): 2 * ROUTED
    }
    assert labelled(samples, "pipeline_retries_total") == {
        (("tier", "0"),): 2 * ROUTED,
        (("tier", "1"),): ROUTED,
    }
    # The only worker of the group holds every partition of each role's topics.
    assert labelled(samples, "pipeline_partitions_held") == {
        (("role", "router"),): settings.partitions,
        (("role", "deliver"),): settings.partitions,
        (("role", "retry"),): settings.retry_partitions * len(settings.retry_delays),
    }
    # Histograms: every attempt observed once, the +Inf bucket agrees with the count.
    inf = ("le", "+Inf")
    assert samples[("pipeline_delivery_attempt_seconds_bucket", (inf,))] == 7 * ROUTED
    assert samples[("pipeline_end_to_end_seconds_bucket", (inf,))] == 2 * ROUTED
    assert 0 < samples[("pipeline_delivery_attempt_seconds_sum", ())] < 7 * ROUTED * 1.0
    # The same per destination: each one's own script.
    per = scrape(port, by_destination=True)
    assert labelled(per, "pipeline_deliveries_total") == {
        (("destination", "ok"), ("outcome", "delivered")): ROUTED,
        (("destination", "flaky"), ("outcome", "retry")): 2 * ROUTED,
        (("destination", "flaky"), ("outcome", "delivered")): ROUTED,
        (("destination", "gone"), ("outcome", "dead_letter")): ROUTED,
        (("destination", "broken"), ("outcome", "retry")): ROUTED,
        (("destination", "broken"), ("outcome", "dead_letter")): ROUTED,
    }
    assert labelled(per, "pipeline_retries_total") == {
        (("destination", "flaky"), ("tier", "0")): ROUTED,
        (("destination", "flaky"), ("tier", "1")): ROUTED,
        (("destination", "broken"), ("tier", "0")): ROUTED,
    }
    assert labelled(per, "pipeline_dead_letters_total") == {
        (("destination", "gone"), ("reason", "client_error")): ROUTED,
        (("destination", "broken"), ("reason", "client_error")): ROUTED,
    }
    assert labelled(per, "pipeline_delivery_attempt_seconds_count") == {
        (("destination", "ok"),): ROUTED,
        (("destination", "flaky"),): 3 * ROUTED,
        (("destination", "gone"),): ROUTED,
        (("destination", "broken"),): 2 * ROUTED,
    }
    assert {
        name: per[("pipeline_circuits_open", (("destination", name),))] for name in DESTINATIONS
    } == dict.fromkeys(DESTINATIONS, 0)
    # Consumer lag comes from librdkafka statistics (every 5 s) for the worker's own topics only.
    lag_topics = {dict(labels)["topic"] for (n, labels) in samples if n == "pipeline_consumer_lag"}
    assert all(topic.startswith(settings.topic_prefix) for topic in lag_topics), lag_topics


def test_an_open_circuit_parks_records_without_attempts_or_retries(
    settings, receiver_factory, process_factory
):
    """Records for a destination whose circuits are all open are parked (set aside in a retry
    tier, undecoded, as they are): counted as parked, not as retries, and
    ``pipeline_delivery_attempt_seconds`` (one sample per real attempt) skips them."""
    # Two failures open the circuit for a minute. The first attempts that meet it open, and the
    # tier-0 retries (1 s) of those that failed, are parked until it half-opens (a minute:
    # longer than the test).
    settings = settings.replace(
        circuit_failures=2,
        circuit_cool_down=60.0,
        retry_delays=(1.0, 600.0),
        retry_deadline=3600.0,
    )
    receiver = receiver_factory(500)
    apply(settings, simple_config(receiver.url))
    port = free_port()
    process_factory(settings, "worker", "--metrics-port", str(port))
    wait_for(lambda: try_scrape(port), timeout=30)
    calls = [
        {"type": "track", "userId": f"u{n}", "event": "E", "messageId": f"c{n}"} for n in range(6)
    ]
    send_calls(settings, calls, "wk")

    parked = ("pipeline_parked_total", (("reason", "circuit_open"),))
    samples = wait_until_settled(port, {parked: 6}, timeout=30)
    requests = receiver.count()
    assert 2 <= requests <= 6  # first attempts only, until the circuit opened
    assert samples[("pipeline_deliveries_total", (("outcome", "retry"),))] == requests
    assert samples[("pipeline_retries_total", (("tier", "0"),))] == requests
    assert samples[("pipeline_delivery_attempt_seconds_count", ())] == requests
    assert stays(lambda: receiver.count() == requests, 0.5)
    # The destination's one webhook has its circuit open, as the gauge says.
    per = scrape(port, by_destination=True)
    assert per[("pipeline_circuits_open", (("destination", "hooks"),))] == 1
    assert (
        per[("pipeline_parked_total", (("destination", "hooks"), ("reason", "circuit_open")))] == 6
    )


# ---- one process per role, added up by a real Prometheus ---------------------------------------


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[dict[str, int]], str]]:
    """Start Debian's ``prometheus`` on 127.0.0.1 scraping {job: metrics port} every second, with
    the shipped alert rules loaded; yields the starter, which returns the base URL."""
    require_system_tools("prometheus")
    processes: list[subprocess.Popen[bytes]] = []

    def start(jobs: dict[str, int]) -> str:
        config = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "rule_files": [str(ROOT / "deploy" / "prometheus" / "alerts.yml")],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
                for job, port in jobs.items()
            ],
        }
        config_file = tmp_path / "prometheus.yml"
        config_file.write_text(json.dumps(config))  # JSON is YAML
        port = free_port()
        log = (tmp_path / "prometheus.log").open("wb")
        process = subprocess.Popen(
            [
                shutil.which("prometheus") or "prometheus",
                f"--config.file={config_file}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
        log.close()
        processes.append(process)
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            if process.poll() is not None:
                log_text = (tmp_path / "prometheus.log").read_text(errors="replace")
                raise AssertionError(f"prometheus exited with {process.returncode}:\n{log_text}")
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
                    return response.status == 200
            except OSError:
                return False

        wait_for(ready, timeout=30, interval=0.2)
        return url

    yield start
    for process in processes:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def query(url: str, promql: str) -> list[dict[str, Any]]:
    """Prometheus' instant query API: the result vector."""
    address = f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    with urllib.request.urlopen(address, timeout=5) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def scalar(url: str, promql: str) -> float | None:
    result = query(url, promql)
    return float(result[0]["value"][1]) if result else None


def test_counters_of_separate_role_processes_add_up_in_a_real_prometheus(
    settings, receiver_factory, process_factory, prometheus
):
    settings = scripted_settings(settings)
    receivers = script(settings, receiver_factory)
    ports = {role: free_port() for role in ("router", "deliver", "retry")}
    for role, port in ports.items():
        process_factory(settings, role, "--metrics-port", str(port))
    url = prometheus(ports)
    for port in ports.values():
        wait_for(lambda port=port: try_scrape(port), timeout=30)
    send_calls(settings, CALLS, "wk")

    wait_for(lambda: run_finished(receivers), timeout=30)
    for role, port in ports.items():
        samples = wait_until_settled(port, ROLE_EXPECTED[role])
        others = {k: v for k, v in samples.items() if k[0] in ROLE_NOTHING[role] and v}
        assert not others, f"{role} counted another role's work: {others}"

    # Prometheus adds the processes up: the query API returns the delivered count.
    delivered = 'sum(pipeline_deliveries_total{outcome="delivered"})'
    wait_for(lambda: scalar(url, delivered) == 2 * ROUTED, timeout=20, interval=0.5)

    def totals() -> dict[str, Any]:
        return {
            "by outcome": {
                r["metric"]["outcome"]: float(r["value"][1])
                for r in query(url, "sum by (outcome) (pipeline_deliveries_total)")
            },
            "delivered by job": {
                r["metric"]["job"]: float(r["value"][1])
                for r in query(url, 'sum by (job) (pipeline_deliveries_total{outcome="delivered"})')
            },
            "dead letters": scalar(url, "sum(pipeline_dead_letters_total)"),
            "routed": scalar(url, "sum(pipeline_deliveries_routed_total)"),
            "up": scalar(url, 'count(up{job=~"router|deliver|retry"} == 1)'),
        }

    expected = {
        "by outcome": {"delivered": 2 * ROUTED, "retry": 3 * ROUTED, "dead_letter": 2 * ROUTED},
        "delivered by job": {"deliver": ROUTED, "retry": ROUTED},
        "dead letters": 2 * ROUTED,
        "routed": ROUTED * len(DESTINATIONS),
        "up": 3,
    }
    # Each is one instant query; a slow scrape (up = 0 for a second) must not fail the test.
    deadline = time.monotonic() + 20
    while (got := totals()) != expected and time.monotonic() < deadline:
        time.sleep(0.5)
    assert got == expected

    # The shipped alert rules evaluate against the real series without errors.
    def rules_evaluated() -> list[dict[str, Any]] | None:
        with urllib.request.urlopen(f"{url}/api/v1/rules", timeout=5) as response:
            groups = json.loads(response.read())["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        return (
            rules
            if rules and all(r.get("lastEvaluation", "").startswith("2") for r in rules)
            else None
        )

    rules = wait_for(rules_evaluated, timeout=10, interval=0.5)
    assert {r["name"] for r in rules} >= {
        "PipelineDeadLettersGrowing",
        "PipelineConsumerLagHigh",
        "PipelineDeliverySuccessRatioLow",
        "PipelineRetryTierBacklog",
    }
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
