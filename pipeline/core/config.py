"""Sources and destinations: the config file's model, its rules, and the live table workers use.

A config file (``pipeline config apply FILE.yaml``)::

    sources:
      - id: web
        name: Website
        write_keys: [wk_live_1]
        blocked_events: [Debug Event]   # track events with these names stop at the router
    destinations:
      - id: hooks-1
        name: Webhooks                  # the key in a call's integrations map (case-sensitive)
        enabled: true
        sources: [web]
        shared_secret: s3cret           # optional; every request then carries X-Signature
        previous_secrets:               # optional; a rotation's old secret, until its window ends
          - {secret: old-s3cret, until: "2026-12-01T00:00:00Z"}
        signing: ed25519                # optional; Standard Webhooks v1a signatures too
        mtls: {certificate: /etc/pipeline/client.pem, key: /etc/pipeline/client.key, ca: /etc/pipeline/ca.pem}
        proxy: http://proxy.internal:3128   # optional; else PIPELINE_HTTP_PROXY, if set
        oauth2: {token_url: https://auth.example.com/token, client_id: id, client_secret: s, scope: hooks}
        trace_context: false            # optional; its requests then carry no traceparent
        webhooks:                       # 1..5 entries
          - url: https://example.com/hook
            headers: {Authorization: "Bearer abc"}
        retry: {delays: [10s, 1m, 5m], deadline: 4h}   # optional; a missing key: the global setting
        max_in_flight: 200              # optional; its share of a worker's PIPELINE_MAX_IN_FLIGHT
        rate_limit: 50                  # optional; requests/s over the whole delivery group
        disable_after: 24h              # optional; auto-disable after failing every attempt this long
        ordering: per_user              # optional; none (the default) or per_user (see Ordering)
        batch: {max_events: 100, max_bytes: 500KB, max_wait: 1s}   # optional; see Batch

Durations are ``500ms``, ``10s``, ``5m``, ``4h``, ``7d`` or a number of seconds, and are kept as
float seconds.

``validate_config`` checks every rule and reports every problem at once, each naming its field;
``ConfigTable`` is an immutable snapshot with the lookups the router and delivery workers need;
``pipeline.core.config_export.config_data`` turns a table back into the file.
"""

from __future__ import annotations

import enum
import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import (
    BeforeValidator,
    ByteSize,
    Field,
    StrictBool,
    ValidationError,
    field_validator,
    model_validator,
)

from pipeline.core.destination_security import (
    ClientTls,
    ConfigModel,
    OAuth2,
    PreviousSecret,
    ProxyUrl,
    Secret,
    Signing,
    SigningKey,
    is_pem,
)
from pipeline.core.durations import DURATION_HINT, duration_seconds, format_duration
from pipeline.core.exceptions import ConfigError

__all__ = [
    "shown_write_key",
    "Source",
    "Batch",
    "ClientTls",
    "OAuth2",
    "is_pem",
    "Destination",
    "Ordering",
    "PreviousSecret",
    "Signing",
    "Webhook",
    "RetryPolicy",
    "DurationRange",
    "PipelineConfig",
    "ConfigTable",
    "validate_config",
    "iso_text",
    "MAX_WEBHOOKS",
    "MAX_RETRY_DELAYS",
]


def shown_write_key(key: str) -> str:
    """A write key as an error message may show it: a long one cut to its first four characters
    (it is a secret of its source).

    >>> shown_write_key("wk_live_0123456789abcdef"), shown_write_key("short")
    ('wk_l…', 'short')
    """
    return key if len(key) <= 8 else key[:4] + "…"


#: Seed §2.1 and §8: at most five webhooks per destination.
MAX_WEBHOOKS = 5
MAX_HEADERS = 50
MAX_URL_CHARS = 2048
MAX_HEADER_VALUE_CHARS = 8192
MAX_RETRY_DELAYS = 20
MAX_IN_FLIGHT = 100_000
#: A rotated secret signs on for at most this long (seconds), and at most this many at once.
MAX_ROTATION_WINDOW = 7 * 86_400.0
MAX_PREVIOUS_SECRETS = 5
#: A batch's limits: at most this many calls, and this many bytes (a receiver's request limit).
MAX_BATCH_EVENTS = 1000
MIN_BATCH_BYTES = 1024
MAX_BATCH_BYTES = 5_000_000
_MINUTE = 60.0
_DAY = 86_400.0
_ID = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
#: RFC 9110 token characters: what a header name may contain.
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
#: Headers we set ourselves or that frame the message: a static header may not replace them.
RESERVED_HEADERS = frozenset(
    {
        "content-length",
        "content-type",
        "host",
        "user-agent",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
        "x-signature",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
    }
)


_Model = ConfigModel


def check_url(url: str) -> str:
    """A full http or https URL with a host; raises ``ValueError`` naming the problem."""
    if len(url) > MAX_URL_CHARS:
        raise ValueError(f"is {len(url)} characters, over the limit of {MAX_URL_CHARS}")
    if any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in url):
        raise ValueError("contains whitespace or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"{url!r} is not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        shown = f"{parts.scheme}://" if parts.scheme else "none"
        raise ValueError(f"{url!r} must use http:// or https:// (scheme is {shown})")
    if not parts.hostname:
        raise ValueError(f"{url!r} has no host")
    if port == 0:
        raise ValueError(f"{url!r} has port 0")
    if parts.username or parts.password:
        raise ValueError(f"{url!r} carries credentials; send them in a header instead")
    return url


class Webhook(_Model):
    url: str
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        return check_url(url)

    @field_validator("headers")
    @classmethod
    def _headers(cls, headers: dict[str, str]) -> dict[str, str]:
        if len(headers) > MAX_HEADERS:
            raise ValueError(f"has {len(headers)} headers, over the limit of {MAX_HEADERS}")
        for name, value in headers.items():
            if not _TOKEN.match(name):
                raise ValueError(f"header name {name!r} is not a valid HTTP header name")
            if name.lower() in RESERVED_HEADERS:
                raise ValueError(f"header {name!r} is set by the pipeline and cannot be configured")
            if any(ch in value for ch in "\r\n\x00"):
                raise ValueError(f"header {name!r} has a line break or NUL in its value")
            if any((ord(ch) < 0x20 and ch != "\t") or ord(ch) == 0x7F for ch in value):
                raise ValueError(f"header {name!r} has a control character in its value")
            if len(value) > MAX_HEADER_VALUE_CHARS:
                raise ValueError(
                    f"header {name!r} value is {len(value)} characters, "
                    f"over the limit of {MAX_HEADER_VALUE_CHARS}"
                )
        return headers


Id = Annotated[str, Field(pattern=_ID)]


@dataclass(frozen=True, slots=True)
class DurationRange:
    """Validates a duration between ``minimum`` and ``maximum`` seconds; returns float seconds.

    Accepts the text forms of ``pipeline.core.durations`` (``10s``, ``4h``, ``7d``) and numbers
    (seconds), so a record read back from Kafka (float seconds) validates too::

        Deadline = Annotated[float, BeforeValidator(DurationRange(60, 7 * 86_400))]
    """

    minimum: float
    maximum: float

    def __call__(self, value: object) -> float:
        if isinstance(value, str):
            seconds = duration_seconds(value)
            shown = repr(value)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            seconds = float(value)
            shown = f"{value:g}s" if math.isfinite(value) else repr(value)
        else:
            seconds, shown = None, repr(value)
        if seconds is None or not math.isfinite(seconds):
            raise ValueError(f"{shown} is not a duration; {DURATION_HINT}")
        if seconds < self.minimum:
            raise ValueError(f"{shown} is under the minimum of {format_duration(self.minimum)}")
        if seconds > self.maximum:
            raise ValueError(f"{shown} is over the maximum of {format_duration(self.maximum)}")
        return seconds


RetryDelay = Annotated[float, BeforeValidator(DurationRange(1.0, 7 * _DAY))]
RetryDeadline = Annotated[float, BeforeValidator(DurationRange(_MINUTE, 7 * _DAY))]
DisableAfter = Annotated[float, BeforeValidator(DurationRange(_MINUTE, 30 * _DAY))]


class RetryPolicy(_Model):
    """When a destination's failed deliveries are tried again; a missing field means the global
    setting (``PIPELINE_RETRY_DELAYS``, ``PIPELINE_RETRY_DEADLINE``).

        RetryPolicy(delays=[10, 60, 300], deadline=4 * 3600)  # YAML: {delays: [10s, 1m, 5m], deadline: 4h}
    """

    #: Delay before each retry, in seconds (1s..7d each); the last one repeats until the deadline.
    delays: Annotated[list[RetryDelay], Field(min_length=1, max_length=MAX_RETRY_DELAYS)] | None = (
        None
    )
    #: No attempt after this many seconds (1m..7d), counted from the first attempt.
    deadline: RetryDeadline | None = None


BatchWait = Annotated[float, BeforeValidator(DurationRange(0.01, _MINUTE))]


class Batch(_Model):
    """Calls sent in batches (``batch`` in the config file): one POST carries a JSON array of up
    to ``max_events`` calls' bodies and at most ``max_bytes`` bytes (a call bigger than that on
    its own goes alone, in an array of one), sent once it is full or ``max_wait`` seconds after
    its first call was gathered.

        Batch(max_events=100, max_bytes="500KB", max_wait="1s")
    """

    max_events: Annotated[int, Field(strict=True, ge=1, le=MAX_BATCH_EVENTS)] = 100
    #: Bytes (``500KB``, ``1MB``, ``64KiB`` or a number of bytes), 1KB..5MB.
    max_bytes: Annotated[ByteSize, Field(ge=MIN_BATCH_BYTES, le=MAX_BATCH_BYTES)] = ByteSize(
        500_000
    )
    #: Seconds (``250ms``, ``1s``), 10ms..1m.
    max_wait: BatchWait = 1.0


class Ordering(enum.StrEnum):
    """In what order a destination receives calls (``ordering`` in the config file)."""

    NONE = "none"
    """As they come: a call waiting for a retry holds no other call back (the default)."""
    PER_USER = "per_user"
    """Each user's calls (``userId``, else ``anonymousId``) in the order the router received
    them: a call waiting in a retry tier or parked holds that user's later calls back."""


class Source(_Model):
    id: Id
    name: str = ""
    write_keys: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        default_factory=list
    )
    blocked_events: list[str] = Field(default_factory=list)


class Destination(_Model):
    id: Id
    #: The key of this destination in a call's ``integrations`` map (seed §1.3).
    name: str = "Webhooks"
    enabled: bool = True
    sources: list[Id] = Field(min_length=1)
    shared_secret: Secret | None = None
    #: Secrets being rotated out, each signing until its window ends (``pipeline config
    #: rotate-secret``); an ended one is left out of signing, and removed from the config topic.
    previous_secrets: list[PreviousSecret] = Field(
        default_factory=list, max_length=MAX_PREVIOUS_SECRETS
    )
    #: Also sign per the Standard Webhooks spec (replay protection); needs ``shared_secret``.
    standard_webhooks: bool = False
    #: ``ed25519``: Standard Webhooks ``v1a`` signatures as well, with ``signing_key``.
    signing: Signing | None = None
    #: The Ed25519 private key (``whsk_…``): made by ``config apply`` (or the console) when
    #: ``signing`` is set and the file has none, kept across applies; never shown.
    signing_key: SigningKey | None = None
    #: At most this many requests per second to this destination over the whole delivery
    #: consumer group (all processes together). Until the group-wide limiter lands, each
    #: process applies it on its own.
    rate_limit: Annotated[float, Field(gt=0, le=100_000)] | None = None
    #: Retry schedule; ``None`` (or a key left out) means the global settings.
    retry: RetryPolicy | None = None
    #: This destination's share of a worker's in-flight limit (``PIPELINE_MAX_IN_FLIGHT``).
    max_in_flight: Annotated[int, Field(strict=True, ge=1, le=MAX_IN_FLIGHT)] | None = None
    #: Auto-disable an endpoint that has failed every attempt for this many seconds (1m..30d).
    disable_after: DisableAfter | None = None
    #: ``per_user``: each user's calls are delivered in the order the router received them.
    ordering: Ordering = Ordering.NONE
    #: Client certificate and CA for TLS to the receivers (``None``: the system's trust store).
    mtls: ClientTls | None = None
    #: The forward proxy its requests go through (``None``: ``PIPELINE_HTTP_PROXY``, if set).
    proxy: ProxyUrl | None = None
    #: OAuth2 client credentials: a bearer token on every request.
    oauth2: OAuth2 | None = None
    #: Its requests carry the call's W3C trace context (``traceparent``, ``tracestate``).
    trace_context: StrictBool = True
    #: Send calls in batches (a JSON array a request); ``None``: one call a request.
    batch: Batch | None = None
    webhooks: list[Webhook] = Field(min_length=1, max_length=MAX_WEBHOOKS)
    #: Set by the pipeline when it auto-disables the destination (accepted in YAML so that an
    #: exported config applies unchanged): why, and when (epoch milliseconds).
    disabled_reason: str | None = None
    disabled_at: Annotated[int, Field(strict=True, ge=0)] | None = None

    @property
    def ordered(self) -> bool:
        """Whether each user's calls must reach this destination in order."""
        return self.ordering is Ordering.PER_USER

    @field_validator("retry")
    @classmethod
    def _empty_retry_is_none(cls, retry: RetryPolicy | None) -> RetryPolicy | None:
        # ``retry: {}`` says nothing: store it as absent, so it survives a trip through Kafka equal.
        if retry is not None and retry.delays is None and retry.deadline is None:
            return None
        return retry

    @model_validator(mode="after")
    def _signing_needs_secret(self) -> Destination:
        if self.standard_webhooks and not self.shared_secret:
            raise ValueError("standard_webhooks needs a shared_secret to sign with")
        return self

    @model_validator(mode="after")
    def _signing_key_needs_signing(self) -> Destination:
        if self.signing_key is not None and self.signing is None:
            raise ValueError("signing_key needs signing: ed25519")
        return self

    @model_validator(mode="after")
    def _previous_secrets_need_one(self) -> Destination:
        if self.previous_secrets and not self.shared_secret:
            raise ValueError("previous_secrets needs a shared_secret (the one rotated to)")
        if any(p.secret == self.shared_secret for p in self.previous_secrets):
            raise ValueError("previous_secrets repeats the shared_secret; a rotation changes it")
        return self

    @model_validator(mode="after")
    def _batch_fits(self) -> Destination:
        batch = self.batch
        if batch is None:
            return self
        if self.ordered:
            raise ValueError(
                "batch cannot be combined with ordering: per_user (a batch is retried whole, "
                "which would hold back every user it carries); choose one"
            )
        if self.max_in_flight is not None and self.max_in_flight < batch.max_events:
            raise ValueError(
                f"max_in_flight ({self.max_in_flight}) is under batch.max_events "
                f"({batch.max_events}): a batch could never fill; raise max_in_flight or "
                "lower max_events"
            )
        return self


class PipelineConfig(_Model):
    sources: list[Source] = Field(default_factory=list)
    destinations: list[Destination] = Field(default_factory=list)


def _where(data: Mapping[str, Any], loc: tuple[int | str, ...]) -> str:
    """``destinations[0] (hooks-1).webhooks[5].url`` from a pydantic location."""
    text = ""
    node: Any = data
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
            try:
                node = node[part]
            except (IndexError, KeyError, TypeError):
                node = None
            if isinstance(node, dict) and isinstance(node.get("id"), str):
                text += f" ({node['id']})"
        else:
            text += f".{part}" if text else part
            node = node.get(part) if isinstance(node, dict) else None
    return text or "config"


def _number(limit: object) -> object:
    """``0`` rather than ``0.0`` for a whole-number limit of a float field."""
    return int(limit) if isinstance(limit, float) and limit.is_integer() else limit


def _message(error: Mapping[str, Any]) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "too_long" and ctx.get("max_length") == MAX_WEBHOOKS:
        return f"at most {MAX_WEBHOOKS} webhooks per destination, got {ctx.get('actual_length')}"
    if kind == "too_long":
        return f"has {ctx.get('actual_length')} entries, over the limit of {ctx.get('max_length')}"
    if kind == "too_short":
        return "needs at least one entry"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"must be a whole number, got {error.get('input')!r}"
    if kind == "model_type":
        return "must be a mapping (key: value)"
    if kind == "greater_than":
        return f"must be greater than {_number(ctx.get('gt'))}, got {error.get('input')!r}"
    if kind == "greater_than_equal":
        return f"must be at least {_number(ctx.get('ge'))}, got {error.get('input')!r}"
    if kind == "less_than_equal":
        return f"must be at most {_number(ctx.get('le'))}, got {error.get('input')!r}"
    if kind == "extra_forbidden":
        return "is not a known field"
    if kind == "enum":
        return f"must be {ctx.get('expected')}, got {error.get('input')!r}"
    if kind == "missing":
        return "is required"
    if kind.startswith(("datetime", "date_")) or kind == "timezone_aware":
        return (
            f"must be a time with its zone, e.g. 2026-12-01T00:00:00Z, got {error.get('input')!r}"
        )
    if kind == "byte_size":
        return f"must be a size such as 500KB, 1MB or a number of bytes, got {error.get('input')!r}"
    if kind == "string_pattern_mismatch":
        return (
            "must be 1-128 letters, digits, '.', '_', ':' or '-', starting with a letter or digit"
        )
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


def validate_config(data: object, *, now: float | None = None) -> PipelineConfig:
    """Check a parsed config file; ``ConfigError`` lists every problem, each naming its field.
    ``now`` (epoch seconds; the clock by default) bounds rotation windows: a previous secret's
    ``until`` at most ``MAX_ROTATION_WINDOW`` ahead."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(["config: must be a mapping with 'sources' and 'destinations'"])
    try:
        config = PipelineConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(
            [f"{_where(data, tuple(e['loc']))}: {_message(e)}" for e in exc.errors()]
        ) from None

    problems: list[str] = []
    problems += _duplicates("sources", (s.id for s in config.sources))
    problems += _duplicates("destinations", (d.id for d in config.destinations))
    key_owner: dict[str, str] = {}
    for source in config.sources:
        for key in source.write_keys:
            if key in key_owner and key_owner[key] != source.id:
                problems.append(
                    f"sources ({source.id}).write_keys: a write key is also used by source "
                    f"{key_owner[key]!r}; write keys must be unique"
                )
            key_owner[key] = source.id
    known = {s.id for s in config.sources}
    latest = (time.time() if now is None else now) + MAX_ROTATION_WINDOW
    for index, dest in enumerate(config.destinations):
        for number, previous in enumerate(dest.previous_secrets):
            if previous.until.timestamp() > latest:
                problems.append(
                    f"destinations[{index}] ({dest.id}).previous_secrets[{number}].until: "
                    f"{iso_text(previous.until_ms)} is more than "
                    f"{format_duration(MAX_ROTATION_WINDOW)} away; a rotation window is at most "
                    f"{format_duration(MAX_ROTATION_WINDOW)}"
                )
        for source_id in dest.sources:
            if source_id not in known:
                problems.append(
                    f"destinations[{index}] ({dest.id}).sources: unknown source {source_id!r}; "
                    f"known: {', '.join(sorted(known)) or 'none'}"
                )
    if problems:
        raise ConfigError(problems)
    return config


def _duplicates(kind: str, ids: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    problems = []
    for ident in ids:
        if ident in seen:
            problems.append(f"{kind}: the id {ident!r} is used more than once")
        seen.add(ident)
    return problems


@dataclass(frozen=True, slots=True)
class ConfigTable:
    """An immutable snapshot of the live config, with the lookups workers need."""

    sources: Mapping[str, Source] = field(default_factory=dict)
    destinations: Mapping[str, Destination] = field(default_factory=dict)
    _by_write_key: Mapping[str, str] = field(default_factory=dict)
    _by_source: Mapping[str, tuple[Destination, ...]] = field(default_factory=dict)
    _disabled_by_source: Mapping[str, tuple[Destination, ...]] = field(default_factory=dict)

    @classmethod
    def build(cls, sources: Iterable[Source], destinations: Iterable[Destination]) -> ConfigTable:
        source_map = {s.id: s for s in sources}
        dest_map = {d.id: d for d in destinations}
        by_key = {key: s.id for s in source_map.values() for key in s.write_keys}
        by_source: dict[str, list[Destination]] = {}
        disabled: dict[str, list[Destination]] = {}
        for dest in sorted(dest_map.values(), key=lambda d: d.id):
            for source_id in dest.sources:
                (by_source if dest.enabled else disabled).setdefault(source_id, []).append(dest)
        return cls(
            source_map,
            dest_map,
            by_key,
            {source: tuple(dests) for source, dests in by_source.items()},
            {source: tuple(dests) for source, dests in disabled.items()},
        )

    def source_for_write_key(self, write_key: str) -> Source | None:
        source_id = self._by_write_key.get(write_key)
        return None if source_id is None else self.sources.get(source_id)

    def enabled_destinations(self, source_id: str) -> tuple[Destination, ...]:
        """Enabled destinations connected to the source, ordered by id."""
        return self._by_source.get(source_id, ())

    def disabled_destinations(self, source_id: str) -> tuple[Destination, ...]:
        """Disabled destinations connected to the source, ordered by id."""
        return self._disabled_by_source.get(source_id, ())


def iso_text(ms: int) -> str:
    """``2026-12-01T00:00:00Z``: epoch ms as the config file writes a time (to the second, or
    to the millisecond when it has them)."""
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{ms % 1000:03d}Z" if ms % 1000 else f"{text}Z"
