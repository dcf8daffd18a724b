"""What an attempt's result means: delivered, retry later, or dead letter. Pure logic.

One attempt POSTs the body to every webhook of a destination at once; each URL gives a
``UrlResult``. ``decide`` combines them (seed §4.1 rule 2, §7):

- any 2xx → delivered; the other URLs are not tried again;
- else, if any failure is retryable → retry;
- else → dead letter, with the reason of the first URL's failure.

Retryable: 5xx, 408, 429, a timeout, a refused/reset connection, a DNS failure, a malformed
response. Permanent: other 4xx, 3xx (redirects are not followed), a TLS verification failure, an
invalid or blocked URL.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime

__all__ = [
    "Outcome",
    "Failure",
    "DeadLetterReason",
    "UrlResult",
    "Decision",
    "decide",
    "classify",
    "parse_retry_after",
]


class Outcome(enum.StrEnum):
    """The fate of one delivery attempt (a metric label)."""

    DELIVERED = "delivered"
    """A webhook answered 2xx."""
    RETRY = "retry"
    """Every webhook failed and at least one failure may pass later."""
    DEAD_LETTER = "dead_letter"
    """Every webhook failed for good, or the deadline passed."""


class Failure(enum.StrEnum):
    """Why one URL failed (recorded on each attempt)."""

    SERVER_ERROR = "server_error"
    """5xx."""
    RATE_LIMITED = "rate_limited"
    """429 or 408."""
    TIMEOUT = "timeout"
    """No full answer within the delivery timeout."""
    CONNECTION_ERROR = "connection_error"
    """Refused, reset, unreachable, or the host name did not resolve."""
    BAD_RESPONSE = "bad_response"
    """Something that is not HTTP came back."""
    CLIENT_ERROR = "client_error"
    """A 4xx other than 408 and 429."""
    REDIRECT = "redirect"
    """3xx: redirects are not followed."""
    TLS_ERROR = "tls_error"
    """The certificate did not verify (self-signed, expired, wrong host): no request was sent."""
    INVALID_URL = "invalid_url"
    """The URL cannot be requested."""
    BLOCKED_ADDRESS = "blocked_address"
    """The host resolves to an address deliveries may not reach."""
    AUTH_ERROR = "auth_error"
    """No OAuth2 token: its token endpoint failed or refused the client (retried)."""
    CIRCUIT_OPEN = "circuit_open"
    """Not tried: the endpoint's circuit breaker is open after a run of failures (or its
    destination was paused by a ``Retry-After`` while the request waited for its turn)."""


RETRYABLE = frozenset(
    {
        Failure.CIRCUIT_OPEN,
        Failure.SERVER_ERROR,
        Failure.RATE_LIMITED,
        Failure.TIMEOUT,
        Failure.CONNECTION_ERROR,
        Failure.BAD_RESPONSE,
        Failure.AUTH_ERROR,
    }
)


class DeadLetterReason(enum.StrEnum):
    """Why a record went to the dead-letter topic (a metric label)."""

    CLIENT_ERROR = "client_error"
    REDIRECT = "redirect"
    TLS_ERROR = "tls_error"
    INVALID_URL = "invalid_url"
    BLOCKED_ADDRESS = "blocked_address"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    """Retryable failures until the retry deadline (4 hours by default)."""
    DESTINATION_DELETED = "destination_deleted"
    """The destination is no longer in the config."""
    DESTINATION_DISABLED = "destination_disabled"
    """The destination was switched off after the call was routed."""
    INTERNAL_ERROR = "internal_error"
    """A bug in the pipeline; the record is kept so that nothing is lost."""
    UNDECODABLE = "undecodable"
    """The Kafka record is not one of our Avro records; kept raw."""


@dataclass(frozen=True, slots=True)
class UrlResult:
    """One URL's answer to one attempt."""

    url: str
    status: int | None = None
    failure: Failure | None = None
    detail: str = ""
    duration: float = 0.0
    #: Seconds the receiver asked us to wait (``Retry-After`` on 429 or 503).
    retry_after: float | None = None
    #: A failed answer's body, its first ``RESPONSE_SNIPPET_BYTES`` (the delivery log keeps it).
    response: str = ""

    @property
    def ok(self) -> bool:
        return self.failure is None and self.status is not None and 200 <= self.status < 300


def classify(status: int) -> Failure | None:
    """The failure an HTTP status means, or ``None`` for 2xx."""
    if 200 <= status < 300:
        return None
    if status in (408, 429):
        return Failure.RATE_LIMITED
    if 300 <= status < 400:
        return Failure.REDIRECT
    if 400 <= status < 500:
        return Failure.CLIENT_ERROR
    if 500 <= status < 600:
        return Failure.SERVER_ERROR
    return Failure.BAD_RESPONSE


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: Outcome
    reason: DeadLetterReason | None = None
    #: The longest ``Retry-After`` any URL asked for, in seconds.
    retry_after: float | None = None


def decide(results: Sequence[UrlResult]) -> Decision:
    """Combine the URLs' results of one attempt into one decision."""
    if any(result.ok for result in results):
        return Decision(Outcome.DELIVERED)
    retryable = [r for r in results if r.failure in RETRYABLE]
    if retryable:
        waits = [r.retry_after for r in retryable if r.retry_after is not None]
        return Decision(Outcome.RETRY, retry_after=max(waits) if waits else None)
    first = next((r.failure for r in results if r.failure is not None), Failure.INVALID_URL)
    return Decision(Outcome.DEAD_LETTER, DeadLetterReason(first.value))


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:  # "-0000": UTC, whatever the local zone is
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, moment.timestamp() - now)
