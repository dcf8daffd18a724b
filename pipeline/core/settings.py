"""Settings: every ``PIPELINE_*`` knob in one typed model, with its default.

``Settings(...)`` is exactly what it is given, over the defaults here (code and tests build it
so). ``load_settings()`` reads the environment and the optional settings file
(``PIPELINE_SETTINGS_FILE``, the same ``PIPELINE_NAME=value`` lines), and says where each value
came from; command-line flags override the environment, the environment overrides the file,
the file the defaults. The names: ``PIPELINE_`` and the field's name in capitals.

    >>> Settings.from_env({"PIPELINE_RETRY_DELAYS": "1s,2s"}).retry_delays
    (1.0, 2.0)
    >>> Settings(admin_token="s3cret").admin_token
    SecretStr('**********')
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, PrivateAttr, SecretStr, ValidationError
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from pipeline.core.durations import DURATION_HINT, duration_seconds
from pipeline.core.kafka_properties import (
    OVERRIDES,
    REGISTRY_KEYS,
    ClientProperties,
    KafkaPropertiesError,
    Sourced,
    read_properties,
)

__all__ = [
    "Settings",
    "parse_cpus",
    "SettingsError",
    "default_log_store_url",
    "default_state_dir",
    "env_name",
    "SECRET_FIELDS",
]

PREFIX = "PIPELINE_"


class SettingsError(ValueError):
    """Settings that cannot work; each problem names the variable (and the file or flag it came
    from), the bad value and what is allowed."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems) if len(problems) > 1 else problems[0])
        self.problems = problems


def env_name(field: str) -> str:
    """The environment variable of a setting: ``retry_delays`` → ``PIPELINE_RETRY_DELAYS``."""
    return PREFIX + field.upper()


def _seconds(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration; {DURATION_HINT}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        parsed = duration_seconds(str(value))
        if parsed is None:
            raise ValueError(f"{value!r} is not a duration; {DURATION_HINT}")
        seconds = parsed
    if seconds <= 0:
        raise ValueError(f"{value!r} must be greater than zero")
    return seconds


def _optional_seconds(value: Any) -> float | None:
    return None if value is None or value == "" else _seconds(value)


def _seconds_or_off(value: Any) -> float | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("off", "no")):
        return None
    return _seconds(value)


def _seconds_list(value: Any) -> tuple[float, ...]:
    parts = [p for p in value.split(",") if p.strip()] if isinstance(value, str) else list(value)
    if not parts:
        raise ValueError("is empty; give at least one duration, e.g. 10s,1m,5m")
    return tuple(_seconds(part) for part in parts)


def _words(value: Any) -> tuple[str, ...]:
    parts = value.split(",") if isinstance(value, str) else list(value)
    return tuple(str(part).strip() for part in parts if str(part).strip())


def _networks(value: Any) -> tuple[str, ...]:
    from pipeline.core.address_policy import AddressPolicy

    words = _words(value)
    AddressPolicy.parse(words)  # ValueError naming a bad entry
    return words


def _proxy(value: Any) -> Any:
    """A proxy URL, checked (``check_proxy_url``); empty: none."""
    if value is None or value == "":
        return None
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    from pipeline.core.destination_security import check_proxy_url

    return SecretStr(check_proxy_url(str(value)))


def _trace_url(value: Any) -> Any:
    """A trace URL template: http(s), with ``{trace_id}`` in it; empty: none."""
    if value is None or value == "":
        return None
    text = str(value).strip()
    if not text.startswith(("http://", "https://")):
        raise ValueError(f"must be an http:// or https:// URL, got {text!r}")
    if "{trace_id}" not in text:
        raise ValueError(
            f"must hold {{trace_id}} where the trace id goes, got {text!r} (e.g. "
            "http://localhost:16686/trace/{trace_id})"
        )
    return text


def _whole(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise ValueError(f"{value!r} is not a whole number")


def parse_cpus(text: str) -> list[int]:
    """The CPUs of a list such as ``0,2-3`` (in its order, without repeats); ``ValueError``
    naming what is wrong."""
    cpus: list[int] = []
    for part in text.split(","):
        part = part.strip()
        first, dash, last = part.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"{part!r} is not a CPU number or a range such as 2-3")
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            raise ValueError(f"{part!r} is a range that ends before it starts")
        cpus += [cpu for cpu in range(low, high + 1) if cpu not in cpus]
    return cpus


def _cpu_affinity(value: Any) -> Any:
    """``off``, ``auto`` or a list of CPUs such as ``0,2-3`` (``pipeline.runtime.cpu_affinity``)."""
    if not isinstance(value, str):
        return value
    value = value.strip().lower()
    if value in ("off", "auto"):
        return value
    try:
        parse_cpus(value)
    except ValueError as exc:
        raise ValueError(f"off, auto or a list of CPUs such as 0,2-3: {exc}") from None
    return value


def _upper(value: Any) -> Any:
    return value.strip().upper() if isinstance(value, str) else value


Seconds = Annotated[float, BeforeValidator(_seconds)]
OptionalSeconds = Annotated[float | None, BeforeValidator(_optional_seconds)]
SecondsOrOff = Annotated[float | None, BeforeValidator(_seconds_or_off)]
SecondsList = Annotated[tuple[float, ...], NoDecode, BeforeValidator(_seconds_list)]
Networks = Annotated[tuple[str, ...], NoDecode, BeforeValidator(_networks)]
AtLeastOne = Annotated[int, BeforeValidator(_whole), Field(ge=1)]
AtLeastAMinute = Annotated[float, BeforeValidator(_seconds), Field(ge=60)]
Upper = Annotated[str | None, BeforeValidator(_upper)]

#: Settings whose values are secrets: masked wherever they are shown.
SECRET_FIELDS = frozenset(
    {
        "kafka_sasl_password",
        "kafka_ssl_key_password",
        "kafka_sasl_oauthbearer_client_secret",
        "schema_registry_basic_auth",
        "admin_token",
        "console_password",
        "http_proxy",
    }
)


class Settings(BaseSettings):
    """The pipeline's settings. Frozen; ``replace(**changes)`` makes a checked copy."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX, frozen=True, extra="forbid", validate_default=False
    )

    # ---- Kafka ----
    bootstrap_servers: str = "127.0.0.1:9092"
    topic_prefix: str = ""
    #: A Kafka client properties file (``client.properties``): security, SASL, TLS, tuning.
    kafka_config: str | None = None
    #: Overrides of single properties of that file (``PIPELINE_KAFKA_<PROPERTY>``).
    kafka_security_protocol: Upper = None
    kafka_sasl_mechanism: Upper = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_ca_location: str | None = None
    kafka_ssl_certificate_location: str | None = None
    kafka_ssl_key_location: str | None = None
    kafka_ssl_key_password: SecretStr | None = None
    kafka_ssl_endpoint_identification_algorithm: str | None = None
    kafka_sasl_oauthbearer_method: str | None = None
    kafka_sasl_oauthbearer_client_id: str | None = None
    kafka_sasl_oauthbearer_client_secret: SecretStr | None = None
    kafka_sasl_oauthbearer_token_endpoint_url: str | None = None
    kafka_sasl_oauthbearer_scope: str | None = None
    kafka_sasl_oauthbearer_extensions: str | None = None
    #: Partitions of ``calls`` and ``deliveries.webhooks``: the unit of parallelism.
    partitions: AtLeastOne = 6
    #: Partitions of each retry tier topic.
    retry_partitions: AtLeastOne = 3
    replication_factor: AtLeastOne = 1
    #: Consumer ``session.timeout.ms``; ``None`` keeps the client default (45 s), or 6 s on the
    #: embedded broker, whose JoinGroup waits half of it.
    session_timeout: OptionalSeconds = None
    #: The router hands off in Kafka transactions (consume, produce and commit at once). Off
    #: by itself on the embedded broker, whose transactions stall; a crashed router then routes
    #: again what it routed since its last commit.
    transactions: bool = True
    #: How often the deliver and retry roles commit their finished position: a crash delivers
    #: again what was in flight plus at most what finished within one interval.
    commit_interval: Seconds = 0.1
    #: How long the router remembers a call it routed, by source and ``messageId``, to drop a
    #: resend of it (``off``: never). Its memory is partition state (``state_dir``).
    dedupe_window: SecondsOrOff = 24 * 3600.0
    #: Where partition state keeps its local stores (RocksDB); empty: a directory per cluster
    #: and topic prefix under ``$XDG_DATA_HOME/pipeline`` (``default_state_dir``).
    state_dir: str = ""
    # ---- Schema Registry ----
    schema_registry_url: str | None = None
    #: ``user:password`` (Confluent's ``basic.auth.user.info``).
    schema_registry_basic_auth: SecretStr | None = None
    schema_registry_ssl_ca_location: str | None = None
    schema_registry_ssl_certificate_location: str | None = None
    schema_registry_ssl_key_location: str | None = None
    # ---- Delivery ----
    #: Delay of each retry tier in seconds; the last one repeats until the deadline.
    retry_delays: SecondsList = (10.0, 60.0, 300.0, 1800.0, 3600.0)
    #: Deadline of a delivery, counted from its first attempt.
    retry_deadline: Seconds = 4 * 3600.0
    #: How long a receiver has to answer (seed §4.1: 5 seconds).
    delivery_timeout: Seconds = 5.0
    #: Records a delivery worker works on at once, over all destinations.
    max_in_flight: AtLeastOne = 1000
    #: Connections a delivery worker opens to one host at most.
    max_connections_per_host: AtLeastOne = 100
    #: Park records whose destination cannot take them (circuits open, ``max_in_flight``
    #: taken) in a retry tier, undecoded, instead of attempting them.
    parking: bool = True
    #: CIDRs deliveries may reach although the SSRF guard blocks them (e.g. ``127.0.0.0/8``).
    allowed_networks: Networks = ()
    #: A forward proxy every webhook request goes through (``http://proxy.internal:3128``; it may
    #: carry a login, hence a secret), unless a destination names its own ``proxy``.
    http_proxy: Annotated[SecretStr | None, BeforeValidator(_proxy)] = None
    #: Retryable failures in a row that open an endpoint's circuit breaker.
    circuit_failures: AtLeastOne = 5
    #: Seconds an open circuit waits before letting one probe through.
    circuit_cool_down: Seconds = 30.0
    #: Each failed probe in a row doubles that wait, up to this.
    circuit_cool_down_max: Seconds = 300.0
    #: Processes of ``pipeline worker``, each a member of every group, under one supervisor
    #: (``None``: one a core, or 1 on the embedded broker); ``--processes`` overrides it.
    worker_processes: AtLeastOne | None = None
    #: The event loop of long-running commands: ``auto`` (uvloop if installed, else asyncio's),
    #: ``uvloop`` or ``asyncio`` (``pipeline.runtime.event_loop``).
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"
    #: The HTTP client of webhook requests: ``httptools`` (HTTP/1.1 on the event loop's own
    #: connections, ``pipeline.http.h1_post``) or ``reqwest`` (pyreqwest,
    #: ``pipeline.http.reqwest_post``) for every destination without TLS settings or a proxy of
    #: its own, aiohttp for the rest; or ``aiohttp`` for every request.
    http_client: Literal["httptools", "reqwest", "aiohttp"] = "httptools"
    #: Threads of the ``reqwest`` client's runtime. An answer waits on its thread for the GIL
    #: while the event loop runs; on one thread every other socket waits with it (1: pyreqwest's
    #: own single-threaded runtime).
    http_threads: Annotated[int, BeforeValidator(_whole), Field(ge=1, le=64)] = 4
    #: Keep each delivery process's threads on one CPU: ``off``, ``auto`` (worker ``k`` of
    #: ``--processes`` the ``k``-th CPU it may use; alone, the least busy) or CPUs such as
    #: ``0,2-3`` (``pipeline.runtime.cpu_affinity``).
    cpu_affinity: Annotated[str, BeforeValidator(_cpu_affinity)] = "off"
    # ---- Observability ----
    #: Destinations that get their own ``destination`` label in metrics; the rest are ``other``.
    metrics_max_destinations: AtLeastOne = 1000
    #: Record every decision about a call on ``deliveries.log`` (the delivery log).
    log: bool = True
    #: Also record each call's JSON in its ``received`` entry (it holds personal data).
    log_bodies: bool = False
    #: Where a trace is seen, ``{trace_id}`` standing for its id (Jaeger:
    #: ``http://localhost:16686/trace/{trace_id}``): ``pipeline trace`` and the console link it.
    trace_url_template: Annotated[str | None, BeforeValidator(_trace_url)] = None
    #: With tracing off, still pass a call's trace context on to its receivers, as it came (a
    #: header on each of its records and requests: it costs a worker some CPU a call).
    trace_pass_through: bool = False
    #: Where ``pipeline log-store`` keeps the log: ``sqlite:///PATH`` (the embedded default,
    #: ``default_log_store_url``) or ``postgresql://...``.
    log_store_url: str = ""
    #: How long the delivery log is kept, in the store and on ``deliveries.log``.
    log_retention: AtLeastAMinute = 7 * 86400.0
    #: How long ``calls`` keeps what was sent: the window ``pipeline replay`` can send again.
    calls_retention: AtLeastAMinute = 7 * 86400.0
    # ---- Ingestion API and console ----
    #: How long an ingestion request waits for Kafka's acknowledgement before it is answered 503.
    ingest_ack_timeout: Seconds = 10.0
    #: Bearer token of the ingestion API's admin endpoints (``/admin/...``); unset: they are off.
    admin_token: SecretStr | None = None
    #: The web console's password; unset: loopback only, with a password made up at start.
    console_password: SecretStr | None = None

    _client: ClientProperties = PrivateAttr(default_factory=ClientProperties)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # What it is given, nothing else: the environment and the file are read by
        # ``load_settings``, which also knows where each value came from.
        return (init_settings,)

    def __init__(self, **values: Any) -> None:
        # A properties file may name the cluster and the Schema Registry too (Confluent's
        # does): those fill the settings not given otherwise.
        file: dict[str, Sourced] = {}
        if values.get("kafka_config"):
            try:
                file = read_properties(values["kafka_config"])
            except KafkaPropertiesError as exc:
                raise SettingsError(exc.problems) from None
            for key, item in file.items():
                if key in REGISTRY_KEYS:
                    values.setdefault(REGISTRY_KEYS[key], item.value)
                elif key in ("bootstrap.servers", "metadata.broker.list"):
                    values.setdefault("bootstrap_servers", item.value)
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise SettingsError(describe_errors(exc, {})) from None
        overrides = {}
        for name, prop in OVERRIDES.items():
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            if value:
                overrides[prop] = value
        try:
            self._client = ClientProperties.build(file, overrides)
        except KafkaPropertiesError as exc:
            raise SettingsError(exc.problems) from None

    @property
    def kafka_client(self) -> ClientProperties:
        """The user's librdkafka properties (file and overrides), checked, by client kind."""
        return self._client

    def replace(self, **changes: Any) -> Settings:
        """A checked copy with ``changes``; what was given stays given (``model_fields_set``)."""
        given = {name: getattr(self, name) for name in self.model_fields_set}
        return type(self)(**{**given, **changes})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings of ``environ`` (default ``os.environ``) and its settings file."""
        from pipeline.core.settings_sources import load_settings

        return load_settings(environ).settings

    def secret(self, name: str) -> str | None:
        """The plain value of secret setting ``name`` (``None`` when unset)."""
        value = getattr(self, name)
        return None if value is None else str(value.get_secret_value())


def describe_errors(exc: ValidationError, origins: Mapping[str, str]) -> list[str]:
    """One line per problem: the variable, where it came from, the bad value, what is allowed."""
    lines = []
    for error in exc.errors(include_url=False):
        field = str(error["loc"][0]) if error["loc"] else ""
        name = env_name(field)
        where = name
        if origins.get(field, "environment") not in ("environment", "default"):
            where += f" (from {origins[field]})"
        value = error.get("input")
        kind = error["type"]
        context = error.get("ctx") or {}
        if kind == "value_error":
            message = str(context.get("error", error["msg"])).removeprefix(f"{name}: ")
            if isinstance(value, str) and "'" not in message:
                message = f"{value!r} {message}"
        elif kind in ("int_parsing", "int_type", "int_from_float"):
            message = f"{value!r} is not a whole number"
        elif kind in ("bool_parsing", "bool_type"):
            message = f"{value!r} is not on or off (on, off, true, false, yes, no, 1, 0)"
        elif kind == "greater_than_equal":
            least = "1m" if field in ("log_retention", "calls_retention") else context.get("ge")
            message = f"must be at least {least}, got {value!r}"
        elif kind == "extra_forbidden":
            message = "is not a setting"
        else:
            message = f"{value!r}: {error['msg']}"
        lines.append(f"{where}: {message}")
    return lines


def _local_name(settings: Settings) -> str:
    """The cluster and topic prefix of these settings, as a file name."""
    name = "-".join(
        part
        for part in (settings.bootstrap_servers.split(",")[0], settings.topic_prefix.rstrip("."))
        if part
    )
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def _data_home(home: Mapping[str, str] | None) -> str:
    env = os.environ if home is None else home
    base = env.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "pipeline")


def default_state_dir(settings: Settings, home: Mapping[str, str] | None = None) -> str:
    """Where partition state lives: ``PIPELINE_STATE_DIR``, else a directory per cluster and
    topic prefix under ``$XDG_DATA_HOME/pipeline``.

    >>> default_state_dir(Settings(topic_prefix="acme."), {"XDG_DATA_HOME": "/d"})
    '/d/pipeline/state-127.0.0.1_9092-acme'
    """
    if settings.state_dir:
        return settings.state_dir
    return os.path.join(_data_home(home), f"state-{_local_name(settings)}")


def default_log_store_url(settings: Settings, home: Mapping[str, str] | None = None) -> str:
    """The embedded log store of these settings: a SQLite file per cluster and topic prefix,
    under ``$XDG_DATA_HOME/pipeline`` (``~/.local/share/pipeline``), unless
    ``PIPELINE_LOG_STORE_URL`` names another.

    >>> default_log_store_url(Settings(topic_prefix="acme."), {"XDG_DATA_HOME": "/d"})
    'sqlite:////d/pipeline/log-127.0.0.1_9092-acme.sqlite3'
    """
    if settings.log_store_url:
        return settings.log_store_url
    return f"sqlite:///{os.path.join(_data_home(home), f'log-{_local_name(settings)}.sqlite3')}"
