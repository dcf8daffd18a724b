"""The client's settings, their defaults in one place, checked once.

>>> ClientOptions.build("wk_1", size=1).flush_at
1
>>> ClientOptions.build("wk_1").transport
'http'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._backoff import Backoff

__all__ = ["ClientOptions", "DEFAULT_ENDPOINT"]

#: ``pipeline ingest`` on this machine.
DEFAULT_ENDPOINT = "http://127.0.0.1:8080"
DEFAULT_FLUSH_AT = 20
#: Room for a burst: a tight loop of 20,000 calls outruns one ingestion process and must not drop
#: (segment-analytics-python's 10,000 dropped up to a third of such a loop). About 50 MB at ~500
#: bytes a call; still bounded, so a dead endpoint never grows memory without limit.
DEFAULT_MAX_QUEUE_SIZE = 100_000


@dataclass(frozen=True, slots=True)
class ClientOptions:
    write_key: str
    endpoint: str = DEFAULT_ENDPOINT
    #: Seed §2.4: flush when this many calls are queued (``size`` is an alias); 1 sends at once.
    flush_at: int = DEFAULT_FLUSH_AT
    #: Seed §2.4: flush when this many seconds passed since the last flush (or since the first
    #: call queued after an idle time), whichever is later.
    flush_after: float = 5.0
    #: Calls waiting at most; when full a call is dropped, counted and reported to ``on_error``.
    max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE
    gzip: bool = True
    #: Retries of one batch after its first try (5xx, 408, 429, network errors, Kafka).
    max_retries: int = 10
    #: Seconds one try may take (HTTP request; Kafka acknowledgement).
    timeout: float = 10.0
    bootstrap_servers: str | None = None
    source_id: str | None = None
    topic_prefix: str = ""
    #: Kafka transport: write the Confluent wire format through this Schema Registry.
    schema_registry_url: str | None = None
    kafka_config: Mapping[str, Any] = field(default_factory=dict)
    backoff: Backoff = field(default_factory=Backoff)
    #: How long ``close()`` at interpreter exit waits for the queue to drain.
    exit_timeout: float = 10.0

    @property
    def transport(self) -> str:
        return "kafka" if self.bootstrap_servers else "http"

    @classmethod
    def build(cls, write_key: str, *, size: int | None = None, **values: Any) -> ClientOptions:
        """Check every value; ``ValueError`` naming the argument."""
        if size is not None:
            flush_at = values.get("flush_at", size)
            if flush_at not in (size, DEFAULT_FLUSH_AT):
                raise ValueError(f"size ({size}) and flush_at ({flush_at}) are the same setting")
            values["flush_at"] = size
        options = cls(write_key, **values)
        options.check()
        return options

    def check(self) -> None:
        if not isinstance(self.write_key, str):
            raise ValueError(f"write_key: must be a string, got {type(self.write_key).__name__}")
        if self.transport == "http":
            if not self.write_key:
                raise ValueError("write_key: is required (the source's write key)")
            if not self.endpoint.startswith(("http://", "https://")):
                raise ValueError(f"endpoint: {self.endpoint!r} is not an http or https URL")
        elif not self.source_id:
            raise ValueError(
                "source_id: is required with bootstrap_servers (the Kafka transport writes calls "
                "for one source and resolves no write key)"
            )
        for name in ("flush_at", "max_queue_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be at least 1, got {getattr(self, name)}")
        for name in ("flush_after", "timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be more than 0 seconds, got {getattr(self, name)}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries: must be 0 or more, got {self.max_retries}")
