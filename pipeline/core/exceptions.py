"""Our exceptions, each mapping onto one decision a caller has to make.

    PipelineError
    ├── InvalidCall            a call breaks the call specification; fix the call (HTTP 400)
    │   └── CallTooLarge       a call over 32 KB, or a batch over 500 KB (HTTP 413)
    ├── ConfigError            a config file breaks a rule; nothing was written
    ├── BrokerUnavailable      Kafka did not acknowledge in time; nothing is known to be written,
    │                          the sender retries (HTTP 503); ``pipeline.kafka.cluster`` raises
    │                          two kinds that waiting does not mend: a failed TLS handshake and
    │                          a refused login
    ├── StoreError             the delivery log's store cannot be used as it is (a newer schema,
    │   │                      not a database, psycopg missing): ``pipeline.store``
    │   └── StoreUnavailable   the store cannot be reached or opened now; fix the URL or server
    └── UndecodableRecord      a Kafka record is not one of our Avro records (dead letter
                               ``undecodable``)

Settings that cannot work are a ``ValueError`` (``pipeline.core.settings.SettingsError``), found
before anything connects.

Delivery outcomes are values, not exceptions: see ``pipeline.core.outcomes``.
"""

from __future__ import annotations

__all__ = [
    "PipelineError",
    "InvalidCall",
    "CallTooLarge",
    "ConfigError",
    "BrokerUnavailable",
    "StoreError",
    "StoreUnavailable",
    "UndecodableRecord",
]


class PipelineError(Exception):
    """Base class of every error this package raises on purpose."""


class InvalidCall(PipelineError):
    """A call that breaks the call specification. ``field`` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class CallTooLarge(InvalidCall):
    """A call over the 32 KB call limit, or a batch over the 500 KB batch limit."""

    def __init__(self, field: str, size: int, limit: int) -> None:
        super().__init__(field, f"is {size:,} bytes, over the limit of {limit:,} bytes")
        self.size = size
        self.limit = limit


class ConfigError(PipelineError):
    """A config file breaks a rule. Every problem is listed; nothing was written."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid config:\n" + "\n".join(f"  - {p}" for p in problems))
        self.problems = problems


class BrokerUnavailable(PipelineError):
    """Kafka did not acknowledge in time. Nothing is known to be written; retry."""


class StoreError(PipelineError):
    """The delivery log's store cannot be used as it is (``pipeline.store``)."""


class StoreUnavailable(StoreError):
    """The delivery log's store cannot be reached or opened (``pipeline.store``); ``url`` has
    its password masked. Here, beside ``BrokerUnavailable``, so the CLI maps it to exit code 3
    without importing the store."""

    def __init__(self, url: str, problem: str) -> None:
        super().__init__(f"log store {url} is unavailable: {problem}")
        self.url = url


class UndecodableRecord(PipelineError):
    """A Kafka record that is not one of our Avro records."""
