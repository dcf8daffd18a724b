"""Errors of the client library, each mapping onto one decision of the caller.

    PipelineError                      (pipeline.core.exceptions)
    ├── InvalidCall                    raised by a call method: fix the call; nothing was queued
    │   └── CallTooLarge               a call over 32 KB; nothing was queued
    └── ClientError
        ├── QueueFull                  passed to ``on_error``: the queue was full, the call dropped
        ├── ClientClosed               passed to ``on_error``: the client was closed before the
        │                              call could be delivered (or the call came after close)
        └── DeliveryError              passed to ``on_error``: a batch was refused (``retryable``
                                       False: 4xx other than 408/429) or kept failing until
                                       ``max_retries`` ran out

A call method raises only ``InvalidCall``/``CallTooLarge``; everything that happens later reaches
``on_error(error, messages)`` in the background worker, and the client's counters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.core.exceptions import CallTooLarge, InvalidCall, PipelineError

__all__ = [
    "CallTooLarge",
    "ClientClosed",
    "ClientError",
    "DeliveryError",
    "InvalidCall",
    "QueueFull",
]


class ClientError(PipelineError):
    """Something went wrong after a call was accepted; reported through ``on_error``."""


class QueueFull(ClientError):
    """The queue held ``max_queue_size`` calls; this call was dropped (``client.dropped``)."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the queue is full ({limit:,} calls waiting, max_queue_size); the call was dropped"
        )
        self.limit = limit


class ClientClosed(ClientError):
    """The client was closed before these calls were delivered, or the call came after close."""


class DeliveryError(ClientError):
    """A batch was not delivered.

    ``retryable`` tells whether trying again may help (5xx, 408, 429, network errors, Kafka not
    acknowledging); ``retry_after`` is the server's ``Retry-After`` in seconds; ``pending``, when
    set, is the part of the batch still undelivered (the Kafka transport knows it per call).
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        status: int | None = None,
        code: str | None = None,
        retry_after: float | None = None,
        pending: Sequence[Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status
        self.code = code
        self.retry_after = retry_after
        self.pending = pending
