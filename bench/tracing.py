"""Section 16 of ``make bench``: what tracing costs (``pipeline.runtime.tracing``).

One ``pipeline worker`` (no log store) per mode, the same receiver, and a second receiver process
standing in for an OTLP/HTTP collector (it answers every export 200). Every call of a run carries
a W3C ``traceparent``, as from a sender that traces, except in the ``none`` mode:

- ``none``: calls without a trace context, tracing off (the pipeline as before tracing);
- ``off``: calls with one (1 % of them sampled), tracing off: the context only passes through;
- ``1 %``: tracing on (``OTEL_EXPORTER_OTLP_ENDPOINT``, the default parent-based sampler), 1 %
  of the calls' contexts sampled, as a sender sampling 1 % sends them;
- ``100 %``: tracing on, every context sampled (each call makes a routing span and an attempt
  span, exported).

Each run produces ``calls`` calls and waits until the receiver has answered them all; the modes
alternate (same run). Reported: deliveries/s, each mode ÷ the one it is measured against (``off``
÷ ``none``; ``1 %`` and ``100 %`` ÷ ``off``), and the worker's CPU seconds per 1,000 calls.

Run alone: ``python -m bench --only 16``.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from ._harness import Deployment, Receiver, Worker, alternated, backlog_run

__all__ = ["section_tracing"]

MODES = ("none", "off", "1 %", "100 %")
#: The share of the calls' contexts that are sampled, per mode.
SAMPLED = {"none": 0.0, "off": 0.01, "1 %": 0.01, "100 %": 1.0}
#: What each mode is measured against, and its target (the issue's).
AGAINST = {"off": ("none", 0.98), "1 %": ("off", 0.95), "100 %": ("off", 0.85)}


def _traced(
    records: Iterable[tuple[bytes, bytes]], sampled: float, rng: random.Random
) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    """Each call with a traceparent of its own, ``sampled`` of them sampled."""
    out = []
    for key, value in records:
        flags = "01" if rng.random() < sampled else "00"
        traceparent = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-{flags}"
        out.append((key, value, [("traceparent", traceparent.encode())]))
    return out


def _run(
    receiver: Receiver,
    deployment: Deployment,
    worker: Worker,
    count: int,
    sampled: float | None,
    rng: random.Random,
) -> tuple[float, float]:
    """(deliveries/s, worker CPU seconds per 1,000 calls) for one backlog."""
    plain = list(deployment.call_records("s", count))  # encoded before the clock starts
    records: list[Any] = plain if sampled is None else _traced(plain, sampled, rng)
    return backlog_run(receiver, deployment, worker, records, count)


def section_tracing(
    bench: Any,
    *,
    warm_up: Callable[..., None],
    row: Callable[..., Any],
    fmt: Callable[..., str],
    median: Callable[[list[float]], float],
    log: Callable[[str], None],
) -> None:
    count = bench.n(20_000)
    receiver, collector = Receiver(), Receiver()
    exporting = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url(""),
        "OTEL_SERVICE_NAME": "bench-worker",
    }
    deployments = {}
    workers = {}
    for mode in MODES:
        name = "tracing-" + mode.replace(" %", "pc")
        deployment = deployments[mode] = Deployment(bench.bootstrap, name)
        deployment.apply({"s": [("d1", [receiver.url()])]})
        env = deployment.env(**(exporting if mode in ("1 %", "100 %") else {}))
        workers[mode] = Worker("worker --no-log-store", env, name)
    rng = random.Random(16)

    def measure(mode: str) -> tuple[float, float]:
        sampled = None if mode == "none" else SAMPLED[mode]
        return _run(receiver, deployments[mode], workers[mode], count, sampled, rng)

    try:
        for mode in MODES:
            warm_up(receiver, deployments[mode], "s")
        rates, cpu = alternated("16", bench.runs, MODES, measure, log)
        time.sleep(1)  # the last exports
        exports = collector.stats().get("answered", 0)
    finally:
        for worker in workers.values():
            worker.stop()
        receiver.stop()
        collector.stop()
    for mode, (base, target) in AGAINST.items():
        ratios = [a / b for a, b in zip(rates[mode], rates[base], strict=True)]
        bench.rows.append(
            row(
                "16",
                f"tracing {mode} vs {base}, one worker, {count:,} calls: deliveries/s",
                fmt(median(rates[mode])),
                f"{base}: {fmt(median(rates[base]))}",
                f"{median(ratios):.2f}",
                f"≥ {target}",
                median(ratios) >= target,
                [f"{a:,.0f}/{b:,.0f}" for a, b in zip(rates[mode], rates[base], strict=True)],
            )
        )
    bench.rows.append(
        row(
            "16",
            "tracing: the worker's CPU seconds per 1,000 calls, none / off / 1 % / 100 % "
            f"({exports:,} exports to the collector in all)",
            " / ".join(f"{median(cpu[mode]):.3f}" for mode in MODES),
            "",
            "",
            "reference",
            None,
            [" / ".join(f"{c:.3f}" for c in run) for run in zip(*cpu.values(), strict=True)],
        )
    )
