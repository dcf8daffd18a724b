"""Kafka's refusals as our own values, keeping librdkafka's error code.

A refusal is what librdkafka reports for one record it did not take. Its code decides what the
caller does, in one place for every producer of the pipeline and of the client library:

- **fatal**: the idempotent (or transactional) producer is broken for good (fenced, out of
  sequence): throw it away and make a new one, then send again;
- **permanent**: sending the same record again cannot help (too large, not authorised, invalid);
- otherwise **retryable**: a timeout, a broker that is down or moving leadership.

    >>> refusal = Refusal.of(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    >>> refusal.retryable, refusal.fatal
    (False, False)
    >>> Refusal.of(KafkaError(KafkaError._MSG_TIMED_OUT)).retryable
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from confluent_kafka import KafkaError

__all__ = [
    "FENCED_CODES",
    "FATAL_PRODUCER_CODES",
    "PERMANENT_PRODUCE_CODES",
    "Refusal",
    "Outgoing",
    "Headers",
    "Headed",
    "Placed",
    "Produced",
    "Failed",
]

#: (topic, key, value): one record to produce.
Outgoing = tuple[str, bytes | None, bytes | None]
#: Kafka headers to produce: (name, value) pairs.
Headers = Sequence[tuple[str, str | bytes | None]]
#: (topic, key, value, headers): one record to produce with Kafka headers.
Headed = tuple[str, bytes | None, bytes | None, Headers]
#: (topic, key, value, headers, partition): one record to produce to a partition of its own
#: choosing (a state changelog's partition is its input partition's, whatever its key).
Placed = tuple[str, bytes | None, bytes | None, Headers, int]
#: Any record the pipeline produces.
Produced = Outgoing | Headed | Placed

#: Another producer took over this one's transactional id: it must stop, not be replaced (a new
#: producer with the same id would fence the rightful owner in turn).
FENCED_CODES = frozenset(
    {KafkaError.PRODUCER_FENCED, KafkaError._FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)

#: After these an idempotent producer never recovers: it must be replaced by a new one.
FATAL_PRODUCER_CODES = frozenset(
    {
        KafkaError.PRODUCER_FENCED,
        KafkaError._FATAL,
        KafkaError._FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
        KafkaError.UNKNOWN_PRODUCER_ID,
        KafkaError.INVALID_PRODUCER_ID_MAPPING,
    }
)

#: Refusals that the same record sent again cannot overcome.
PERMANENT_PRODUCE_CODES = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.INVALID_RECORD,
    }
)


class Refusal(NamedTuple):
    """librdkafka's error code and its text for one record."""

    code: int
    text: str

    @classmethod
    def of(cls, error: KafkaError) -> Refusal:
        return cls(error.code(), error.str())

    @property
    def fatal(self) -> bool:
        """The producer that got this must be replaced."""
        return self.code in FATAL_PRODUCER_CODES

    @property
    def fenced(self) -> bool:
        """A newer producer holds this one's transactional id."""
        return self.code in FENCED_CODES

    @property
    def retryable(self) -> bool:
        """Sending the record again (with a new producer when ``fatal``) may succeed."""
        return self.code not in PERMANENT_PRODUCE_CODES

    def __str__(self) -> str:
        return self.text


class Failed(NamedTuple):
    """A record Kafka did not take, and why."""

    record: Produced
    refusal: Refusal

    def __str__(self) -> str:
        return self.refusal.text
