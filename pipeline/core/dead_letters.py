"""Dead-letter records: what failed, why, and everything needed to replay it. Pure logic: the
caller names where the failed Kafka record was (topic, partition, offset) and hands its bytes.

A replay puts the delivery on the first retry tier, due now, with its deadline cleared (the next
attempt starts a new one) and ``replays`` counted up; the attempts of its earlier life are kept.

    >>> d = Delivery("m", "hooks", "web", "track", b"{}", 0, 5, 9, 7, 2, 0)
    >>> letter = dead_letter("client_error", topic="t", partition=0, offset=1, raw=None, delivery=d)
    >>> delivery, marker = replay(letter, now=100)
    >>> delivery.tier, delivery.not_before, delivery.deadline, delivery.replays, marker.replayed_at
    (0, 100, None, 1, 100)
"""

from __future__ import annotations

import uuid

from pipeline.core.records import DeadLetter, Delivery, Replay
from pipeline.core.timestamps import now_ms

__all__ = ["dead_letter", "replay"]


def dead_letter(
    reason: str,
    *,
    topic: str,
    partition: int,
    offset: int,
    raw: bytes | None,
    delivery: Delivery | None = None,
    detail: str = "",
    at: int | None = None,
) -> DeadLetter:
    """A ``DeadLetter`` for the Kafka record at ``topic``/``partition``/``offset``: the delivery
    when it decoded, else the raw bytes. ``at``: when (epoch ms), now by default."""
    return DeadLetter(
        id=str(uuid.uuid4()),
        reason=reason,
        detail=detail,
        dead_lettered_at=now_ms() if at is None else at,
        source_topic=topic,
        source_partition=partition,
        source_offset=offset,
        delivery=delivery,
        raw=None if delivery is not None else raw,
    )


def replay(letter: DeadLetter, now: int) -> tuple[Delivery, Replay]:
    """The delivery to put on the first retry tier for ``letter`` at ``now`` (epoch ms), and the
    marker that records the replay. ``ValueError`` for a letter without a delivery (undecodable)."""
    delivery = letter.delivery
    if delivery is None:
        raise ValueError(
            f"dead letter {letter.id} has no delivery to replay (reason {letter.reason})"
        )
    again = delivery._replace(
        first_attempt_at=None, deadline=None, not_before=now, tier=0, replays=delivery.replays + 1
    )
    return again, Replay(letter.id, now, delivery.message_id, delivery.destination_id)
