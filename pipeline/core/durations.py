"""Human durations (``10s``, ``1m``, ``250ms``, ``4h``) for settings such as ``PIPELINE_RETRY_DELAYS``."""

from __future__ import annotations

import re

__all__ = [
    "parse_duration",
    "parse_duration_list",
    "format_duration",
    "duration_seconds",
    "DURATION_HINT",
    "HOUR_MS",
]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
#: An hour in epoch milliseconds: the delivery log's hourly buckets (event names, the console's
#: charts).
HOUR_MS = 3_600_000
#: What every "is not a duration" message ends with.
DURATION_HINT = "use a number with a unit, e.g. 500ms, 10s, 1m, 4h"


def duration_seconds(text: str) -> float | None:
    """Seconds for ``text`` (zero included; a bare number means seconds), ``None`` if malformed.

    >>> duration_seconds("4h"), duration_seconds("10x")
    (14400.0, None)
    """
    match = _PATTERN.match(text)
    if match is None:
        return None
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def parse_duration(text: str, *, name: str = "duration") -> float:
    """Return seconds for ``text``; a bare number means seconds.

    >>> parse_duration("1m")
    60.0
    """
    value = duration_seconds(text)
    if value is None:
        raise ValueError(f"{name}: {text!r} is not a duration; {DURATION_HINT}")
    if value <= 0:
        raise ValueError(f"{name}: {text!r} must be greater than zero")
    return value


def parse_duration_list(text: str, *, name: str = "durations") -> tuple[float, ...]:
    """Parse a comma-separated list such as ``10s,1m,5m``; at least one entry."""
    parts = [part for part in text.split(",") if part.strip()]
    if not parts:
        raise ValueError(f"{name}: empty list; give at least one duration, e.g. 10s,1m,5m")
    return tuple(parse_duration(part, name=name) for part in parts)


def format_duration(seconds: float) -> str:
    """The shortest exact form: ``1h``, ``90s``, ``250ms``."""
    for unit in ("d", "h", "m", "s"):
        size = _UNITS[unit]
        if seconds >= size and float(seconds / size).is_integer():
            return f"{int(seconds / size)}{unit}"
    return f"{round(seconds * 1000)}ms"
