"""``pipeline.runtime.event_loop``: uvloop unless asyncio's loop is chosen or uvloop is missing."""

from __future__ import annotations

import asyncio
import sys

import pytest
import uvloop

from pipeline.runtime.event_loop import EventLoopError, run


async def running_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


def test_auto_and_uvloop_run_on_uvloop() -> None:
    assert isinstance(run(running_loop()), uvloop.Loop)
    assert isinstance(run(running_loop(), "uvloop"), uvloop.Loop)


def test_asyncio_runs_on_asyncios_own_loop() -> None:
    assert not isinstance(run(running_loop(), "asyncio"), uvloop.Loop)


def test_without_uvloop_auto_falls_back_and_uvloop_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if it were not installed
    assert not isinstance(run(running_loop()), uvloop.Loop)
    with pytest.raises(EventLoopError, match="PIPELINE_EVENT_LOOP=uvloop: uvloop is not installed"):
        run(running_loop(), "uvloop")
