"""Unit tests for pipeline.core.outcomes: status classification and the per-attempt decision."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from pipeline.core.outcomes import (
    RETRYABLE,
    DeadLetterReason,
    Decision,
    Failure,
    Outcome,
    UrlResult,
    classify,
    decide,
    parse_retry_after,
)


@pytest.mark.parametrize("status", [200, 201, 202, 204, 226, 299])
def test_2xx_is_no_failure(status: int) -> None:
    assert classify(status) is None
    assert UrlResult("https://a", status=status).ok


@pytest.mark.parametrize("status", [300, 301, 302, 303, 304, 307, 308, 399])
def test_3xx_is_a_redirect(status: int) -> None:
    assert classify(status) is Failure.REDIRECT


@pytest.mark.parametrize("status", [408, 429])
def test_408_and_429_are_rate_limited(status: int) -> None:
    assert classify(status) is Failure.RATE_LIMITED


@pytest.mark.parametrize("status", [400, 401, 403, 404, 405, 409, 410, 413, 415, 422, 451, 499])
def test_other_4xx_are_client_errors(status: int) -> None:
    assert classify(status) is Failure.CLIENT_ERROR


@pytest.mark.parametrize("status", [500, 501, 502, 503, 504, 520, 599])
def test_5xx_are_server_errors(status: int) -> None:
    assert classify(status) is Failure.SERVER_ERROR


@pytest.mark.parametrize("status", [100, 101, 103, 199])
def test_1xx_is_a_bad_response(status: int) -> None:
    assert classify(status) is Failure.BAD_RESPONSE


@pytest.mark.parametrize("status", [600, 700, 999])
def test_statuses_past_599_are_bad_responses(status: int) -> None:
    assert classify(status) is Failure.BAD_RESPONSE


def test_retryable_failures() -> None:
    assert RETRYABLE == {
        Failure.CIRCUIT_OPEN,
        Failure.SERVER_ERROR,
        Failure.RATE_LIMITED,
        Failure.TIMEOUT,
        Failure.CONNECTION_ERROR,
        Failure.BAD_RESPONSE,
        Failure.AUTH_ERROR,  # no OAuth2 token: its endpoint may come back
    }
    for permanent in (
        Failure.CLIENT_ERROR,
        Failure.REDIRECT,
        Failure.TLS_ERROR,
        Failure.INVALID_URL,
        Failure.BLOCKED_ADDRESS,
    ):
        assert permanent not in RETRYABLE
        # every permanent failure has a dead-letter reason of the same name
        assert DeadLetterReason(permanent.value).value == permanent.value


def test_metric_labels() -> None:
    assert {o.value for o in Outcome} == {"delivered", "retry", "dead_letter"}
    assert DeadLetterReason.DEADLINE_EXCEEDED == "deadline_exceeded"


# ---- UrlResult.ok ----------------------------------------------------------------------------------


def test_ok_needs_a_2xx_status_and_no_failure() -> None:
    assert not UrlResult("u", status=None).ok
    assert not UrlResult("u", status=500, failure=Failure.SERVER_ERROR).ok
    assert not UrlResult("u", status=200, failure=Failure.BAD_RESPONSE).ok
    assert not UrlResult("u", status=300).ok
    assert not UrlResult("u", status=199).ok
    assert not UrlResult("u", failure=Failure.TIMEOUT).ok


# ---- decide ----------------------------------------------------------------------------------------


def http(status: int, retry_after: float | None = None, url: str = "https://a") -> UrlResult:
    return UrlResult(url, status=status, failure=classify(status), retry_after=retry_after)


def failed(failure: Failure, url: str = "https://a") -> UrlResult:
    return UrlResult(url, failure=failure)


@pytest.mark.parametrize(
    "results",
    [
        [http(200)],
        [http(204)],
        [http(500), http(200)],
        [failed(Failure.TIMEOUT), http(404), http(201)],
        [http(200), http(500)],
        [failed(Failure.TLS_ERROR), failed(Failure.CONNECTION_ERROR), http(202)],
    ],
)
def test_any_2xx_is_delivered(results: list[UrlResult]) -> None:
    assert decide(results) == Decision(Outcome.DELIVERED)


@pytest.mark.parametrize(
    "results",
    [
        [http(500)],
        [http(503)],
        [http(408)],
        [http(429)],
        [failed(Failure.TIMEOUT)],
        [failed(Failure.CONNECTION_ERROR)],
        [failed(Failure.BAD_RESPONSE)],
        [http(404), http(502)],  # one retryable failure is enough
        [failed(Failure.TLS_ERROR), failed(Failure.TIMEOUT)],
        [http(301), http(410), http(429)],
    ],
)
def test_any_retryable_failure_means_retry(results: list[UrlResult]) -> None:
    decision = decide(results)
    assert decision.outcome is Outcome.RETRY
    assert decision.reason is None
    assert decision.retry_after is None


def test_retry_carries_the_longest_retry_after() -> None:
    decision = decide([http(429, 5.0), http(503, 30.0), http(500), failed(Failure.TIMEOUT)])
    assert decision == Decision(Outcome.RETRY, retry_after=30.0)
    # a Retry-After on a permanent failure does not count
    decision = decide([http(404, 600.0), http(503, 2.0)])
    assert decision == Decision(Outcome.RETRY, retry_after=2.0)


@pytest.mark.parametrize(
    ("results", "reason"),
    [
        ([http(404)], DeadLetterReason.CLIENT_ERROR),
        ([http(410)], DeadLetterReason.CLIENT_ERROR),
        ([http(400)], DeadLetterReason.CLIENT_ERROR),
        ([http(302)], DeadLetterReason.REDIRECT),
        ([failed(Failure.TLS_ERROR)], DeadLetterReason.TLS_ERROR),
        ([failed(Failure.INVALID_URL)], DeadLetterReason.INVALID_URL),
        ([failed(Failure.BLOCKED_ADDRESS)], DeadLetterReason.BLOCKED_ADDRESS),
        # the first URL's failure is the reason
        ([http(301), http(404)], DeadLetterReason.REDIRECT),
        ([http(404), http(301)], DeadLetterReason.CLIENT_ERROR),
        ([failed(Failure.TLS_ERROR), http(410)], DeadLetterReason.TLS_ERROR),
    ],
)
def test_only_permanent_failures_mean_dead_letter(
    results: list[UrlResult], reason: DeadLetterReason
) -> None:
    assert decide(results) == Decision(Outcome.DEAD_LETTER, reason)


# ---- Retry-After -----------------------------------------------------------------------------------

NOW = datetime(2026, 11, 21, 7, 4, 30, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("120", 120.0), ("0", 0.0), (" 5 ", 5.0), ("3600", 3600.0)],
)
def test_retry_after_seconds(value: str, seconds: float) -> None:
    assert parse_retry_after(value, NOW) == seconds


def test_retry_after_http_date() -> None:
    assert parse_retry_after("Sat, 21 Nov 2026 07:06:30 GMT", NOW) == pytest.approx(120.0)
    later = datetime(2026, 11, 21, 8, 4, 30, tzinfo=UTC)
    assert parse_retry_after(format_datetime(later, usegmt=True), NOW) == pytest.approx(3600.0)
    # a date in the past means now
    assert parse_retry_after("Fri, 20 Nov 2026 07:04:30 GMT", NOW) == 0.0


@pytest.mark.parametrize("value", [None, "", "   ", "soon", "-5", "1.5", "12abc", "Sat, 99 Foo"])
def test_retry_after_garbage_is_ignored(value: str | None) -> None:
    assert parse_retry_after(value, NOW) is None
