"""Settings: every knob in one place, with its default, read from the environment.

Command-line flags override the environment; the environment overrides the defaults here.

    >>> Settings.from_env({"PIPELINE_RETRY_DELAYS": "1s,2s"}).retry_delays
    (1.0, 2.0)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

from pipeline.core.durations import parse_duration, parse_duration_list

__all__ = ["Settings", "default_log_store_url"]

#: The environment variable of each range-checked setting, for error messages.
_ENV_NAMES = {
    "partitions": "PIPELINE_PARTITIONS",
    "retry_partitions": "PIPELINE_RETRY_PARTITIONS",
    "replication_factor": "PIPELINE_REPLICATION_FACTOR",
    "max_in_flight": "PIPELINE_MAX_IN_FLIGHT",
    "max_connections_per_host": "PIPELINE_MAX_CONNECTIONS_PER_HOST",
    "circuit_failures": "PIPELINE_CIRCUIT_FAILURES",
    "commit_interval": "PIPELINE_COMMIT_INTERVAL",
    "log_retention": "PIPELINE_LOG_RETENTION",
    "calls_retention": "PIPELINE_CALLS_RETENTION",
    "metrics_max_destinations": "PIPELINE_METRICS_MAX_DESTINATIONS",
}

#: The words an on/off setting accepts.
_FLAGS = {
    **dict.fromkeys(("on", "true", "yes", "1"), True),
    **dict.fromkeys(("off", "false", "no", "0"), False),
}


@dataclass(frozen=True, slots=True)
class Settings:
    bootstrap_servers: str = "127.0.0.1:9092"
    topic_prefix: str = ""
    #: Partitions of ``calls`` and ``deliveries.webhooks``: the unit of parallelism.
    partitions: int = 6
    #: Partitions of each retry tier topic.
    retry_partitions: int = 3
    replication_factor: int = 1
    #: Delay of each retry tier in seconds; the last one repeats until the deadline.
    retry_delays: tuple[float, ...] = (10.0, 60.0, 300.0, 1800.0, 3600.0)
    #: Deadline of a delivery, counted from its first attempt.
    retry_deadline: float = 4 * 3600.0
    #: How long a receiver has to answer (seed §4.1: 5 seconds).
    delivery_timeout: float = 5.0
    #: Consumer ``session.timeout.ms``; ``None`` keeps the client default (45 s).
    #: The embedded broker's JoinGroup waits half of it, so dev and tests use 6 s.
    session_timeout: float | None = None
    #: Records a delivery worker works on at once, over all destinations.
    max_in_flight: int = 1000
    #: Connections a delivery worker opens to one host at most.
    max_connections_per_host: int = 100
    #: Park records whose destination cannot take them (circuits open, ``max_in_flight``
    #: taken) in a retry tier, undecoded, instead of attempting them (off: the old behaviour).
    parking: bool = True
    #: Destinations that get their own ``destination`` label in metrics; the rest are ``other``.
    metrics_max_destinations: int = 1000
    schema_registry_url: str | None = None
    #: CIDRs deliveries may reach although the SSRF guard blocks them (e.g. ``127.0.0.0/8``).
    allowed_networks: tuple[str, ...] = ()
    #: Retryable failures in a row that open an endpoint's circuit breaker.
    circuit_failures: int = 5
    #: Seconds an open circuit waits before letting one probe through.
    circuit_cool_down: float = 30.0
    #: Each failed probe in a row doubles that wait, up to this (at most ``circuit_cool_down``:
    #: it never grows): a long-dead endpoint is probed, and its parked records moved, that much
    #: less often.
    circuit_cool_down_max: float = 300.0
    #: The router hands off in Kafka transactions (consume, produce and commit at once). Off
    #: only for Kafka-compatible brokers without transactions; a crashed router then routes
    #: again what it routed since its last commit.
    transactions: bool = True
    #: How often the deliver and retry roles commit their finished position: a crash delivers
    #: again what was in flight plus at most what finished within one interval.
    commit_interval: float = 0.1
    #: Record every decision about a call on ``deliveries.log`` (the delivery log).
    log: bool = True
    #: Also record each call's JSON in its ``received`` entry (it holds personal data).
    log_bodies: bool = False
    #: Where ``pipeline log-store`` keeps the log and ``trace``/``log``/``stats`` read it:
    #: ``sqlite:///PATH`` (the embedded default, ``default_log_store_url``) or
    #: ``postgresql://...``.
    log_store_url: str = ""
    #: How long the delivery log is kept, in the store and on ``deliveries.log``.
    log_retention: float = 7 * 86400.0
    #: How long ``calls`` keeps what was sent: the window ``pipeline replay`` can send again.
    calls_retention: float = 7 * 86400.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}

        def text(name: str, field: str) -> None:
            if env.get(name):
                values[field] = env[name]

        def integer(name: str, field: str) -> None:
            if env.get(name):
                try:
                    values[field] = int(env[name])
                except ValueError:
                    raise ValueError(f"{name}: {env[name]!r} is not a whole number") from None

        def flag(name: str, field: str) -> None:
            if env.get(name):
                word = env[name].strip().lower()
                if word not in _FLAGS:
                    raise ValueError(f"{name}: {env[name]!r} is not on or off")
                values[field] = _FLAGS[word]

        def seconds(name: str, field: str) -> None:
            if env.get(name):
                values[field] = parse_duration(env[name], name=name)

        text("PIPELINE_BOOTSTRAP_SERVERS", "bootstrap_servers")
        text("PIPELINE_TOPIC_PREFIX", "topic_prefix")
        text("PIPELINE_SCHEMA_REGISTRY_URL", "schema_registry_url")
        integer("PIPELINE_PARTITIONS", "partitions")
        integer("PIPELINE_RETRY_PARTITIONS", "retry_partitions")
        integer("PIPELINE_REPLICATION_FACTOR", "replication_factor")
        integer("PIPELINE_MAX_IN_FLIGHT", "max_in_flight")
        integer("PIPELINE_MAX_CONNECTIONS_PER_HOST", "max_connections_per_host")
        integer("PIPELINE_METRICS_MAX_DESTINATIONS", "metrics_max_destinations")
        seconds("PIPELINE_RETRY_DEADLINE", "retry_deadline")
        seconds("PIPELINE_DELIVERY_TIMEOUT", "delivery_timeout")
        seconds("PIPELINE_SESSION_TIMEOUT", "session_timeout")
        integer("PIPELINE_CIRCUIT_FAILURES", "circuit_failures")
        seconds("PIPELINE_CIRCUIT_COOL_DOWN", "circuit_cool_down")
        seconds("PIPELINE_CIRCUIT_COOL_DOWN_MAX", "circuit_cool_down_max")
        flag("PIPELINE_TRANSACTIONS", "transactions")
        seconds("PIPELINE_COMMIT_INTERVAL", "commit_interval")
        flag("PIPELINE_PARKING", "parking")
        flag("PIPELINE_LOG", "log")
        flag("PIPELINE_LOG_BODIES", "log_bodies")
        text("PIPELINE_LOG_STORE_URL", "log_store_url")
        seconds("PIPELINE_LOG_RETENTION", "log_retention")
        seconds("PIPELINE_CALLS_RETENTION", "calls_retention")
        if env.get("PIPELINE_ALLOWED_NETWORKS"):
            values["allowed_networks"] = tuple(
                part.strip() for part in env["PIPELINE_ALLOWED_NETWORKS"].split(",") if part.strip()
            )
        if env.get("PIPELINE_RETRY_DELAYS"):
            values["retry_delays"] = parse_duration_list(
                env["PIPELINE_RETRY_DELAYS"], name="PIPELINE_RETRY_DELAYS"
            )
        try:
            return cls(**values).validated()  # type: ignore[arg-type]
        except ValueError as exc:
            field = str(exc).split(":", 1)[0]
            raise ValueError(f"{_ENV_NAMES.get(field, field)}{str(exc)[len(field) :]}") from None

    def replace(self, **changes: object) -> Settings:
        return dataclasses.replace(self, **changes).validated()  # type: ignore[arg-type]

    def validated(self) -> Settings:
        for field in (
            "partitions",
            "retry_partitions",
            "replication_factor",
            "max_in_flight",
            "max_connections_per_host",
            "circuit_failures",
            "metrics_max_destinations",
        ):
            if getattr(self, field) < 1:
                raise ValueError(f"{field}: must be at least 1, got {getattr(self, field)}")
        for field in ("log_retention", "calls_retention"):
            if getattr(self, field) < 60:
                raise ValueError(f"{field}: must be at least 1m, got {getattr(self, field):g} s")
        if self.commit_interval <= 0:
            raise ValueError(f"commit_interval: must be above 0, got {self.commit_interval:g} s")
        if not self.retry_delays:
            raise ValueError("retry_delays: give at least one delay")
        from pipeline.core.address_policy import AddressPolicy

        AddressPolicy.parse(self.allowed_networks)  # raises ValueError naming a bad entry
        return self


def default_log_store_url(settings: Settings, home: Mapping[str, str] | None = None) -> str:
    """The embedded log store of these settings: a SQLite file per cluster and topic prefix,
    under ``$XDG_DATA_HOME/pipeline`` (``~/.local/share/pipeline``), unless
    ``PIPELINE_LOG_STORE_URL`` names another.

    >>> default_log_store_url(Settings(topic_prefix="acme."), {"XDG_DATA_HOME": "/d"})
    'sqlite:////d/pipeline/log-127.0.0.1_9092-acme.sqlite3'
    """
    if settings.log_store_url:
        return settings.log_store_url
    env = os.environ if home is None else home
    base = env.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    name = "-".join(
        part
        for part in (settings.bootstrap_servers.split(",")[0], settings.topic_prefix.rstrip("."))
        if part
    )
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
    return f"sqlite:///{os.path.join(base, 'pipeline', f'log-{safe}.sqlite3')}"
