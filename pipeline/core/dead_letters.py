"""Dead-letter records: what failed, why, and everything needed to replay it."""

from __future__ import annotations

import uuid
from typing import Any

from confluent_kafka import Message

from pipeline.core.timestamps import now_ms

__all__ = ["dead_letter"]


def dead_letter(
    reason: str,
    message: Message,
    *,
    delivery: dict[str, Any] | None = None,
    detail: str = "",
) -> dict[str, Any]:
    """A ``DeadLetter`` record for ``message``: the delivery when it decoded, else the raw bytes."""
    return {
        "id": str(uuid.uuid4()),
        "reason": reason,
        "detail": detail,
        "deadLetteredAt": now_ms(),
        "sourceTopic": message.topic(),
        "sourcePartition": message.partition(),
        "sourceOffset": message.offset(),
        "delivery": delivery,
        "raw": None if delivery is not None else message.value(),
    }
