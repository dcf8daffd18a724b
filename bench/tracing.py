"""Section 16 of ``make bench``: what tracing costs (``pipeline.runtime.tracing``).

Two ``pipeline worker``s (no log store), one with tracing off and one with it on, the same
receiver, and a second receiver process standing in for an OTLP/HTTP collector (it answers every
export 200). Every call of a run carries a W3C ``traceparent``, as from a sender that traces,
except in the ``bare`` and ``none`` modes:

- ``bare``: calls with no header at all, tracing off (a reference: what a header costs the
  producer, the broker and the worker's Kafka client);
- ``none``: the same calls and bytes as ``off``, each context under a header the pipeline does
  not read (``x-traceparent``), tracing off: the pipeline as before tracing, given what a
  tracing sender sends;
- ``off``: calls with one (1 % of them sampled), tracing off: the context names the call's trace
  in the delivery log, no more;
- ``1 %``: tracing on (``OTEL_EXPORTER_OTLP_ENDPOINT``, the default parent-based sampler), 1 %
  of the calls' contexts sampled, as a sender sampling 1 % sends them;
- ``100 %``: tracing on, every context sampled (each call makes a routing span and an attempt
  span, exported).

With tracing off a context goes no further than the delivery log (``PIPELINE_TRACE_PASS_THROUGH``
is off); at 1 % the unsampled 99 % pass on to the receivers, as a sampler that follows its parent
must.

First the tracing-off worker runs alone, ``bare``, ``none`` and ``off`` alternated: a deployment
without tracing, given calls with contexts and without (one process against itself). Then the
tracing-on worker starts beside it, and ``off``, ``1 %`` and ``100 %`` alternate (``100 %`` ÷
``1 %`` is one process against itself). Two worker processes of the same code differ by several
per cent on this machine, run after run, so both workers are started again before each of these
runs: a ratio of two processes is a new pair's each time, and its median is not one pair's bias.

Each run produces ``calls`` calls and waits until the receiver has answered them all; the modes
alternate (same run). Reported: deliveries/s, each mode ÷ the one it is measured against (``off``
÷ ``none``; ``1 %`` and ``100 %`` ÷ ``off``; ``100 %`` ÷ ``1 %``), and the same ratios of the
worker's CPU a call (as rates: the calls a core of the worker carries), which the other
processes on the two cores (the broker, the receiver, the collector, the idle worker) move less
than the rate; and the workers' CPU seconds per 1,000 calls. Runs of one worker spread ±15 % here,
more than tracing off or at 1 % costs; the tracing code's own work a call is also measured alone
(``bench.tracing_alone``), for reference.

Run alone: ``python -m bench --only 16``.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from ._harness import Deployment, Receiver, Worker, alternated, backlog_run
from .tracing_alone import work_alone

__all__ = ["section_tracing"]

MODES = ("none", "off", "1 %", "100 %")
#: The share of the calls' contexts that are sampled, per mode.
SAMPLED = {"none": 0.01, "off": 0.01, "1 %": 0.01, "100 %": 1.0}
#: The header a call's context travels in, per mode (``none``: one the pipeline does not read).
HEADER = {
    "none": "x-traceparent",
    "off": "traceparent",
    "1 %": "traceparent",
    "100 %": "traceparent",
}
#: (mode, what it is measured against, the issue's target; ``None``: a reference).
AGAINST: tuple[tuple[str, str, float | None], ...] = (
    ("none", "bare", None),
    ("off", "none", 0.98),
    ("1 %", "off", 0.95),
    ("100 %", "off", 0.85),
    ("100 %", "1 %", None),
)
#: The worker each mode runs on: tracing off, or on.
WORKER = {"bare": "off", "none": "off", "off": "off", "1 %": "on", "100 %": "on"}


def _traced(
    records: Iterable[tuple[bytes, bytes]], sampled: float, rng: random.Random, header: str
) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    """Each call with a traceparent of its own in ``header``, ``sampled`` of them sampled."""
    out = []
    for key, value in records:
        flags = "01" if rng.random() < sampled else "00"
        traceparent = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-{flags}"
        out.append((key, value, [(header, traceparent.encode())]))
    return out


def _run(
    receiver: Receiver,
    deployment: Deployment,
    worker: Worker,
    count: int,
    mode: str,
    rng: random.Random,
) -> tuple[float, float]:
    """(deliveries/s, worker CPU seconds per 1,000 calls) for one backlog."""
    plain = list(deployment.call_records("s", count))  # encoded before the clock starts
    records: list[Any] = plain
    if mode != "bare":
        records = _traced(plain, SAMPLED[mode], rng, HEADER[mode])
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
    workers: dict[str, Worker] = {}
    rng = random.Random(16)

    def start(tracing: str) -> None:
        name = f"tracing-{tracing}"
        if tracing in workers:  # started again: the same deployment, a new process
            workers.pop(tracing).stop()
        if tracing not in deployments:
            deployments[tracing] = Deployment(bench.bootstrap, name)
            deployments[tracing].apply({"s": [("d1", [receiver.url()])]})
        deployment = deployments[tracing]
        env = deployment.env(**(exporting if tracing == "on" else {}))
        workers[tracing] = Worker("worker --no-log-store", env, name)
        warm_up(receiver, deployment, "s")

    def restart() -> None:
        """A new pair of workers for the next run of the paired modes."""
        start("off")
        start("on")

    def measure(mode: str) -> tuple[float, float]:
        on = WORKER[mode]
        return _run(receiver, deployments[on], workers[on], count, mode, rng)

    try:
        start("off")  # first alone: a tracing-off worker, as a deployment without tracing runs
        # 9 runs: a run's ratio spreads ±10 % here (±30 µs of a worker's CPU a call, back to back),
        # and the targets are 2-15 % apart.
        runs = max(bench.runs, 9)
        single = alternated("16", runs, ("bare", "none", "off"), measure, log)
        paired = alternated("16", runs, ("off", "1 %", "100 %"), measure, log, before_run=restart)
        time.sleep(1)  # the last exports
        exports = collector.stats().get("answered", 0)
    finally:
        for worker in workers.values():
            worker.stop()
        receiver.stop()
        collector.stop()
    for mode, base, target in AGAINST:
        rates, cpu = single if mode in single[0] else paired  # bare and none run only alone
        same = WORKER[mode] == WORKER[base]
        ratios = [a / b for a, b in zip(rates[mode], rates[base], strict=True)]
        bench.rows.append(
            row(
                "16",
                f"tracing {mode} vs {base}, {count:,} calls: deliveries/s "
                f"({'the same worker' if same else 'two workers, a new pair each run'})",
                fmt(median(rates[mode])),
                f"{base}: {fmt(median(rates[base]))}",
                f"{median(ratios):.2f}",
                "reference" if target is None else f"≥ {target}",
                None if target is None else median(ratios) >= target,
                [f"{a:,.0f}/{b:,.0f}" for a, b in zip(rates[mode], rates[base], strict=True)],
            )
        )
        # The worker's CPU a call, as a rate (base's CPU over the mode's): the calls one core
        # of the worker delivers, whatever else the two shared cores ran in that run.
        used = [b / a for a, b in zip(cpu[mode], cpu[base], strict=True)]
        bench.rows.append(
            row(
                "16",
                f"… the same, the worker's CPU a call (µs; ratio: {base}'s CPU over {mode}'s, "
                "as a rate)",
                fmt(median(cpu[mode]) * 1000),
                f"{base}: {fmt(median(cpu[base]) * 1000)}",
                f"{median(used):.2f}",
                "reference" if target is None else f"≥ {target}",
                None if target is None else median(used) >= target,
                [
                    f"{a * 1000:,.0f}/{b * 1000:,.0f}"
                    for a, b in zip(cpu[mode], cpu[base], strict=True)
                ],
            )
        )
    # Measured alone (bench.tracing_alone): the tracing code's own work a call, in a tight loop
    # (hot caches: the same code runs about three times slower inside a busy worker).
    alone = work_alone()
    log(
        "16 tracing's work a call, alone: " + ", ".join(f"{k} {v:.1f} µs" for k, v in alone.items())
    )
    bench.rows.append(
        row(
            "16",
            "tracing: the tracing code's own work a call, measured alone (µs), none / off / 1 % "
            "/ 100 % (two spans made, encoded and queued; the export request not counted)",
            " / ".join(f"{alone[mode]:.1f}" for mode in MODES),
            "",
            "",
            "reference",
            None,
        )
    )
    bench.rows.append(
        row(
            "16",
            "tracing: the workers' CPU seconds per 1,000 calls, bare / none / off (alone), off / 1 % / "
            f"100 % (two workers; {exports:,} exports to the collector in all)",
            " / ".join(f"{median(c):.3f}" for c in (*single[1].values(), *paired[1].values())),
            "",
            "",
            "reference",
            None,
        )
    )
