"""Section 15 of ``make bench``: batching (``batch`` in a destination's config).

One ``pipeline worker`` (no log store) per mode and the same receiver: a destination without
batching, and one with ``batch: {max_events: 100, max_wait: 200ms}``. Each run produces
``calls`` calls and waits until the receiver has accepted them all (it counts the calls in each
request's body). Reported: calls delivered per second at the receiver, and the worker's CPU
seconds per 1,000 calls, batching on ÷ off (the two modes alternate, same run).

Run alone: ``python -m bench --only 15``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._harness import Deployment, Receiver, Worker, alternated, backlog_run, wait_answered

__all__ = ["section_batching"]

BATCH = {"max_events": 100, "max_wait": "200ms"}


def _run(
    receiver: Receiver, deployment: Deployment, worker: Worker, count: int
) -> tuple[float, float]:
    """(calls/s at the receiver, worker CPU seconds per 1,000 calls) for one backlog."""
    records = list(deployment.call_records("s", count))  # encoded before the clock starts
    return backlog_run(receiver, deployment, worker, records, count, counted="calls")


def section_batching(
    bench: Any,
    *,
    warm_up: Callable[..., None],
    row: Callable[..., Any],
    fmt: Callable[..., str],
    median: Callable[[list[float]], float],
    log: Callable[[str], None],
) -> None:
    count = bench.n(20_000)
    receiver = Receiver()
    off = Deployment(bench.bootstrap, "batch-off")
    off.apply({"s": [("d1", [receiver.url()])]})
    on = Deployment(bench.bootstrap, "batch-on")
    on.apply({"s": [("d1", [receiver.url()])]}, destination_fields={"batch": BATCH})
    workers = {
        "off": Worker("worker --no-log-store", off.env(), "batch-off"),
        "on": Worker("worker --no-log-store", on.env(), "batch-on"),
    }
    deployments = {"off": off, "on": on}
    try:
        warm_up(receiver, off, "s")
        receiver.reset()
        on.produce_calls("s", 20)
        wait_answered(receiver, 20, timeout=90, stall=60, counted="calls")
        rates, cpu = alternated(
            "15",
            bench.runs,
            ("off", "on"),
            lambda mode: _run(receiver, deployments[mode], workers[mode], count),
            log,
        )
    finally:
        for worker in workers.values():
            worker.stop()
        receiver.stop()
    speedups = [a / b for a, b in zip(rates["on"], rates["off"], strict=True)]
    savings = [b / a for a, b in zip(cpu["on"], cpu["off"], strict=True)]
    bench.rows += [
        row(
            "15",
            f"batching on (100 a batch) vs off, one worker, {count:,} calls: calls delivered/s",
            fmt(median(rates["on"])),
            f"off: {fmt(median(rates['off']))}",
            fmt(median(speedups), "×"),
            "> 1×",
            median(speedups) > 1,
            [f"{a:,.0f}/{b:,.0f}" for a, b in zip(rates["on"], rates["off"], strict=True)],
        ),
        row(
            "15",
            "batching on vs off: the worker's CPU seconds per 1,000 calls",
            f"{median(cpu['on']):.3f}",
            f"off: {median(cpu['off']):.3f}",
            fmt(median(savings), "× less"),
            "> 1×",
            median(savings) > 1,
            [f"{a:.3f}/{b:.3f}" for a, b in zip(cpu["on"], cpu["off"], strict=True)],
        ),
    ]
