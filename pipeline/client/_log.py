"""The client's logger, ``pipeline.client``; ``DEBUG=analytics`` turns it on (seed §4.3 rule 5)."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping

__all__ = ["log", "debug_requested", "enable_debug_logging", "DropWarnings"]

log = logging.getLogger("pipeline.client")


def debug_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``DEBUG`` lists ``analytics`` (comma-separated, like the ``debug`` package).

    >>> debug_requested({"DEBUG": "http,analytics"})
    True
    """
    env = os.environ if environ is None else environ
    return "analytics" in (part.strip() for part in env.get("DEBUG", "").split(","))


def enable_debug_logging() -> None:
    """Log everything the client does; to stderr unless the application configured logging."""
    log.setLevel(logging.DEBUG)
    if not log.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)


class DropWarnings:
    """A warning for dropped calls at most every ``interval`` seconds, not one per call: a full
    queue drops thousands a second, and logging each would slow the caller further."""

    __slots__ = ("interval", "_last", "_since")

    def __init__(self, interval: float = 5.0) -> None:
        self.interval = interval
        self._last = -interval
        self._since = 0

    def dropped(self, error: Exception) -> None:
        self._since += 1
        now = time.monotonic()
        if now - self._last >= self.interval:
            log.warning("%s (%d dropped since the last warning)", error, self._since)
            self._last = now
            self._since = 0
