"""Section 17 of ``make bench``: the hot path's choices, each against the other (issue 36).

Section 1's end to end (one ``pipeline worker`` with its log store, the same receiver), once
per variant of the worker's settings, alternated within each run: deliveries/s at the receiver
and the worker process's CPU seconds per 1,000 calls. A variant's
ratio is taken against the first variant in the same run, then the median of the runs is
reported.

Variants:

- ``aiohttp``, ``reqwest``, ``httptools``: ``PIPELINE_HTTP_CLIENT`` (``httptools``, the
  pipeline's own HTTP/1.1 client, is the default; it is also reported against ``reqwest``);
- ``asyncio``: ``PIPELINE_EVENT_LOOP=asyncio``, the standard library's event loop;
- ``uvloop``: ``PIPELINE_EVENT_LOOP=uvloop`` (the default where it is installed);
- ``one CPU``: ``PIPELINE_CPU_AFFINITY=auto``, the worker's threads kept on one CPU (also
  reported against the same without it).

Run alone: ``python -m bench --only 17``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._harness import Deployment, Receiver, Worker, alternated, backlog_run

__all__ = ["VARIANTS", "section_hot_path"]

#: Each variant's settings (the first is the reference).
VARIANTS: dict[str, dict[str, str]] = {
    "aiohttp, asyncio": {"PIPELINE_EVENT_LOOP": "asyncio", "PIPELINE_HTTP_CLIENT": "aiohttp"},
    "aiohttp, uvloop": {"PIPELINE_EVENT_LOOP": "uvloop", "PIPELINE_HTTP_CLIENT": "aiohttp"},
    "reqwest, uvloop": {"PIPELINE_EVENT_LOOP": "uvloop", "PIPELINE_HTTP_CLIENT": "reqwest"},
    "httptools, asyncio": {"PIPELINE_EVENT_LOOP": "asyncio", "PIPELINE_HTTP_CLIENT": "httptools"},
    "httptools, uvloop": {"PIPELINE_EVENT_LOOP": "uvloop", "PIPELINE_HTTP_CLIENT": "httptools"},
    "httptools, uvloop, one CPU": {
        "PIPELINE_EVENT_LOOP": "uvloop",
        "PIPELINE_HTTP_CLIENT": "httptools",
        "PIPELINE_CPU_AFFINITY": "auto",
    },
}
#: (variant, what it is measured against) beside the first variant: the defaults against
#: reqwest's, and against one CPU.
ALSO = (
    ("httptools, uvloop", "reqwest, uvloop"),
    ("httptools, uvloop, one CPU", "httptools, uvloop"),
)


def section_hot_path(
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
    deployments, workers = {}, {}
    names = tuple(VARIANTS)
    for name in names:
        label = "hot-" + name.replace(", ", "-")
        deployment = deployments[name] = Deployment(bench.bootstrap, label)
        deployment.apply({"s": [("d1", [receiver.url()])]})
        workers[name] = Worker("worker", deployment.env(**VARIANTS[name]), label)

    def measure(name: str) -> tuple[float, float]:
        records = list(deployments[name].call_records("s", count))  # before the clock starts
        return backlog_run(receiver, deployments[name], workers[name], records, count)

    try:
        for name in names:
            warm_up(receiver, deployments[name], "s")
        rates, cpu = alternated("17", bench.runs, names, measure, log)
    finally:
        for worker in workers.values():
            worker.stop()
        receiver.stop()
    for name, base in (*((name, names[0]) for name in names[1:]), *ALSO):
        ratios = [a / b for a, b in zip(rates[name], rates[base], strict=True)]
        cpu_ratios = [b / a for a, b in zip(cpu[name], cpu[base], strict=True)]
        bench.rows.append(
            row(
                "17",
                f"hot path: {name} vs {base}, one worker with its log, {count:,} calls: "
                f"deliveries/s (CPU s per 1,000 calls {median(cpu[name]):.3f} vs "
                f"{median(cpu[base]):.3f}: {median(cpu_ratios):.2f}× less)",
                fmt(median(rates[name])),
                f"{base}: {fmt(median(rates[base]))}",
                f"{median(ratios):.2f}",
                "reference",
                None,
                [f"{a:,.0f}/{b:,.0f}" for a, b in zip(rates[name], rates[base], strict=True)],
            )
        )
