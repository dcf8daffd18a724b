"""Human durations (``10s``, ``1m``, ``250ms``, ``4h``) for settings such as ``PIPELINE_RETRY_DELAYS``."""

from __future__ import annotations

import re

__all__ = ["parse_duration", "parse_duration_list", "format_duration"]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_duration(text: str, *, name: str = "duration") -> float:
    """Return seconds for ``text``; a bare number means seconds.

    >>> parse_duration("1m")
    60.0
    """
    match = _PATTERN.match(text)
    if match is None:
        raise ValueError(
            f"{name}: {text!r} is not a duration; use a number with a unit, e.g. 500ms, 10s, 1m, 4h"
        )
    value = float(match.group(1)) * _UNITS[match.group(2) or "s"]
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
