"""The live config written back as the config file (``pipeline config export``, the console's
forms): ``validate_config`` of ``config_data(table)`` builds models equal to the table's."""

from __future__ import annotations

from typing import Any

from pipeline.core.config import (
    Batch,
    ConfigTable,
    Destination,
    Ordering,
    Source,
    _number,
    iso_text,
)
from pipeline.core.durations import duration_seconds, format_duration

__all__ = ["batch_data", "bytes_text", "config_data"]


def config_data(table: ConfigTable) -> dict[str, Any]:
    """The config file of ``table``, as ``yaml.safe_dump`` takes it: ``validate_config`` of it
    builds models equal to the table's, so exporting then applying it changes nothing.

    Sources, then destinations, each sorted by id, with the keys in the order of the example
    above. A field at its default is left out, except a destination's ``name`` and ``enabled``
    (what it is, and whether it is on). Durations are text (``10s``, ``4h``). Secrets are written
    as they are: this is the file ``config apply`` takes, and one without them would clear them.
    """
    return {
        "sources": [_source_data(s) for s in sorted(table.sources.values(), key=lambda s: s.id)],
        "destinations": [
            _destination_data(d) for d in sorted(table.destinations.values(), key=lambda d: d.id)
        ],
    }


def _present(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` without its ``None`` values: the callers map a field at its default to ``None``."""
    return {key: value for key, value in data.items() if value is not None}


def _source_data(source: Source) -> dict[str, Any]:
    return _present(
        {
            "id": source.id,
            "name": source.name or None,
            "write_keys": list(source.write_keys) or None,
            "blocked_events": list(source.blocked_events) or None,
        }
    )


def _destination_data(dest: Destination) -> dict[str, Any]:
    retry = dest.retry
    return _present(
        {
            "id": dest.id,
            "name": dest.name,
            "enabled": dest.enabled,
            "sources": list(dest.sources),
            "shared_secret": dest.shared_secret,
            "previous_secrets": [
                {"secret": p.secret, "until": iso_text(p.until_ms)} for p in dest.previous_secrets
            ]
            or None,
            "standard_webhooks": dest.standard_webhooks or None,
            "signing": None if dest.signing is None else dest.signing.value,
            "signing_key": dest.signing_key,
            "mtls": None if dest.mtls is None else _present(dest.mtls.model_dump()),
            "proxy": dest.proxy,
            "trace_context": None if dest.trace_context else False,
            "oauth2": None if dest.oauth2 is None else _present(dest.oauth2.model_dump()),
            "webhooks": [
                _present({"url": hook.url, "headers": dict(hook.headers) or None})
                for hook in dest.webhooks
            ],
            "retry": None
            if retry is None
            else _present(
                {
                    "delays": None
                    if retry.delays is None
                    else [_duration_text(delay) for delay in retry.delays],
                    "deadline": None if retry.deadline is None else _duration_text(retry.deadline),
                }
            ),
            "max_in_flight": dest.max_in_flight,
            "rate_limit": None if dest.rate_limit is None else _number(dest.rate_limit),
            "disable_after": None
            if dest.disable_after is None
            else _duration_text(dest.disable_after),
            "ordering": None if dest.ordering is Ordering.NONE else dest.ordering.value,
            "batch": None if dest.batch is None else batch_data(dest.batch),
            "disabled_reason": dest.disabled_reason,
            "disabled_at": dest.disabled_at,
        }
    )


def batch_data(batch: Batch) -> dict[str, Any]:
    """``batch`` as the config file writes it: ``{max_events: 100, max_bytes: 500KB,
    max_wait: 1s}`` (every field, so the file says what the batches are)."""
    return {
        "max_events": int(batch.max_events),
        "max_bytes": bytes_text(batch.max_bytes),
        "max_wait": _duration_text(batch.max_wait),
    }


def bytes_text(size: int) -> str | int:
    """``500KB``, ``1MB``: the shortest decimal text for ``size`` bytes, else the number.

    >>> bytes_text(500_000), bytes_text(2_000_000), bytes_text(1536)
    ('500KB', '2MB', 1536)
    """
    for unit, factor in (("MB", 1_000_000), ("KB", 1000)):
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return int(size)  # a plain int: ``ByteSize`` is one, and yaml.safe_dump refuses it


def _duration_text(seconds: float) -> str | float:
    """``10s``, ``4h``: the shortest text that reads back as exactly ``seconds``, else the number
    itself (``1.0004``), which the file also takes as seconds."""
    text = format_duration(seconds)
    return text if duration_seconds(text) == seconds else seconds
