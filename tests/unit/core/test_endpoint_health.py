"""``pipeline.core.endpoint_health``: silence, circuits' settings and the rate share, without
HTTP (the clock is an argument). The sender's requests drive it for real in
``tests/unit/http/test_sender_circuits.py``."""

from __future__ import annotations

from fractions import Fraction

import pytest

from pipeline.core.config import Destination
from pipeline.core.endpoint_health import EndpointHealth
from pipeline.core.settings import Settings

SETTINGS = Settings(allowed_networks=("127.0.0.0/8",), circuit_failures=1, circuit_cool_down=60.0)
A = "http://127.0.0.1:9001/hook"


def destination(*urls: str) -> Destination:
    return Destination(id="d", sources=["web"], webhooks=[{"url": url} for url in urls])


def test_an_endpoint_is_silent_after_ten_times_its_usual_answer_time() -> None:
    target = EndpointHealth(SETTINGS.replace(delivery_timeout=5.0)).endpoint(A)
    target.in_flight, target.quiet_since = 1, 100.0
    assert target.silent(100.3, 2.5)  # no answer yet: QUIET_MIN
    target.latency = 0.1  # answers in 100 ms: silent after 1 s without one
    assert not target.silent(100.9, 2.5) and target.silent(101.1, 2.5)
    target.latency = 2.0  # a slow receiver: at most half the delivery timeout
    assert not target.silent(102.4, 2.5) and target.silent(102.6, 2.5)
    target.in_flight = 0
    assert not target.silent(200.0, 2.5)  # nothing out: nothing to wait for


def test_a_silent_endpoint_waits_until_its_oldest_request_out_times_out() -> None:
    health = EndpointHealth(SETTINGS.replace(delivery_timeout=5.0), clock=lambda: 1000.0)
    hanging = destination(A)
    assert health.snapshot(hanging).silence_ends_in is None  # never tried
    target = health.endpoint(A)
    target.in_flight, target.quiet_since = 3, 999.0  # silent for a second
    assert health.snapshot(hanging).silence_ends_in == 4.5  # 4 s to the timeout, 0.5 to hear it
    target.quiet_since = 999.9  # it answered 100 ms ago: not silent
    assert health.snapshot(hanging).silence_ends_in is None


def test_the_circuits_cool_down_grows_to_the_settings_max() -> None:
    """``PIPELINE_CIRCUIT_COOL_DOWN_MAX`` reaches every breaker: the endpoint's and its host's."""
    settings = Settings.from_env(
        {
            "PIPELINE_ALLOWED_NETWORKS": "127.0.0.0/8",
            "PIPELINE_CIRCUIT_COOL_DOWN": "30s",
            "PIPELINE_CIRCUIT_COOL_DOWN_MAX": "2m",
        }
    )
    target = EndpointHealth(settings).endpoint(A)
    assert target.host is not None
    for breaker in (target.breaker, target.host.breaker):
        assert (breaker.cool_down, breaker.cool_down_max) == (30.0, 120.0)
    assert Settings().circuit_cool_down_max == 300.0


# ---- the rate share: a destination's ``rate_limit`` is the group's; each process sends at the
# mean of its shares of the two delivery roles, so the group never sends more than the limit
# however the roles' partitions are spread.

LIMIT = 40.0


def rate_of(shares: dict[str, float]) -> float:
    health = EndpointHealth(Settings())
    for role, share in shares.items():
        health.set_share(role, share)
    dest = Destination(
        id="d", sources=["web"], rate_limit=LIMIT, webhooks=[{"url": "http://h.example/x"}]
    )
    rate = health.rate_of(dest)
    assert rate is not None
    return rate


@pytest.mark.parametrize(
    "split",
    [
        # 3 deliver partitions split 2+1, 4 retry partitions 2+2 (the larger share summed to 1.17)
        [(Fraction(2, 3), Fraction(1, 2)), (Fraction(1, 3), Fraction(1, 2))],
        [(Fraction(1), Fraction(0)), (Fraction(0), Fraction(1))],
        [(Fraction(1, 2), Fraction(1, 4)), (Fraction(1, 2), Fraction(3, 4))],
    ],
)
def test_the_group_sends_at_most_the_limit(split: list[tuple[Fraction, Fraction]]) -> None:
    total = sum(rate_of({"deliver": float(d), "retry": float(r)}) for d, r in split)
    assert total == pytest.approx(LIMIT)


def test_one_process_with_every_partition_sends_the_whole_limit() -> None:
    assert rate_of({"deliver": 1.0, "retry": 1.0}) == LIMIT


def test_processes_running_one_role_each_share_the_limit() -> None:
    # A deliver-only and a retry-only process: half each, not the limit each.
    assert rate_of({"deliver": 1.0}) + rate_of({"retry": 1.0}) == LIMIT
