"""Cutting the queue into batch requests of at most 500 KB, and the batch body itself.

>>> from pipeline.client._messages import build_message, prepare
>>> items = [prepare(build_message("track", user_id="u", event="e" * 100), event_time=0)] * 10
>>> [len(batch) for batch in split_batches(items, limit=1000)]
[3, 3, 3, 1]
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from pipeline.core.calls import MAX_BATCH_BYTES

from ._messages import Queued

__all__ = ["MAX_BATCH_BODY", "split_batches", "batch_body", "ENVELOPE_BYTES"]

#: Seed §8: 500 KB a batch. The API refuses a request over ``MAX_BATCH_BYTES`` (512,000 bytes);
#: 500,000 leaves room for the envelope.
MAX_BATCH_BODY = 500_000
assert MAX_BATCH_BODY < MAX_BATCH_BYTES
#: ``{"batch":[`` … ``],"sentAt":"2026-11-21T07:04:30.123Z","writeKey":""}`` without the key.
ENVELOPE_BYTES = 64


def split_batches(
    items: Sequence[Queued], limit: int = MAX_BATCH_BODY, overhead: int = ENVELOPE_BYTES
) -> list[list[Queued]]:
    """Consecutive runs of ``items`` whose batch body stays within ``limit`` bytes, in order."""
    batches: list[list[Queued]] = []
    current: list[Queued] = []
    size = overhead
    for item in items:
        grown = size + item.size + (1 if current else 0)
        if current and grown > limit:
            batches.append(current)
            current, grown = [], overhead + item.size
        current.append(item)
        size = grown
    if current:
        batches.append(current)
    return batches


def batch_body(items: Sequence[Queued], *, write_key: str, sent_at: str) -> bytes:
    """``{"batch":[...],"sentAt":...,"writeKey":...}`` from the messages' own bytes."""
    return b"".join(
        (
            b'{"batch":[',
            b",".join(item.encoded for item in items),
            b'],"sentAt":',
            orjson.dumps(sent_at),
            b',"writeKey":',
            orjson.dumps(write_key),
            b"}",
        )
    )
