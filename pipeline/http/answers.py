"""What an answer to a webhook POST means, whichever client made it: its status's failure (if
any), its ``Retry-After`` on a 429 or 503, and the first bytes of its body; or why there was no
answer."""

from __future__ import annotations

import time
from collections.abc import Mapping

from pipeline.core.log_entries import RESPONSE_SNIPPET_BYTES
from pipeline.core.outcomes import Failure, UrlResult, classify, parse_retry_after

__all__ = ["DETAIL_CHARS", "answered", "unanswered"]

#: The longest a result's detail (the failure in words) may be.
DETAIL_CHARS = 200


def answered(
    url: str, status: int, headers: Mapping[str, str], body: bytes, started: float
) -> UrlResult:
    """What an answer to a POST made at ``started`` (monotonic seconds) means: its status, its
    ``Retry-After`` on a 429 or 503, and the first bytes of its ``body``."""
    failure = classify(status)
    if failure is None:
        return UrlResult(url, status, None, "", time.monotonic() - started)
    retry_after = None
    if status in (429, 503):
        retry_after = parse_retry_after(headers.get("Retry-After"), time.time())
    snippet = body[:RESPONSE_SNIPPET_BYTES].decode("utf-8", "replace")
    took = time.monotonic() - started
    return UrlResult(url, status, failure, snippet[:DETAIL_CHARS], took, retry_after, snippet)


def unanswered(url: str, failure: Failure, detail: str, started: float) -> UrlResult:
    """A POST made at ``started`` that got no answer (``failure``, in ``detail``'s words)."""
    return UrlResult(url, None, failure, detail[:DETAIL_CHARS], time.monotonic() - started)
