"""The event loop every long-running command runs on: uvloop where it is installed (it is a
dependency on Linux and macOS), else asyncio's own. ``PIPELINE_EVENT_LOOP`` chooses:
``auto`` (the default), ``uvloop`` (an error if it is missing) or ``asyncio``.

    >>> async def answer() -> int:
    ...     return 42
    >>> run(answer(), "asyncio")
    42
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["CHOICES", "EventLoopError", "loop_factory", "run"]

T = TypeVar("T")

#: What ``PIPELINE_EVENT_LOOP`` may be.
CHOICES = ("auto", "uvloop", "asyncio")


class EventLoopError(ValueError):
    """The chosen event loop cannot be had."""


def loop_factory(choice: str = "auto") -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of the ``choice`` of loop (``None``: asyncio's default)."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise EventLoopError(
                "PIPELINE_EVENT_LOOP=uvloop: uvloop is not installed (pip install uvloop)"
            ) from None
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], choice: str = "auto") -> T:
    """``asyncio.run(main)`` on the ``choice`` of loop."""
    try:
        factory = loop_factory(choice)
    except EventLoopError:
        main.close()  # never started
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
