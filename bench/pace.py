"""Section 14 of ``make bench``: a destination's pace (``pipeline.core.pace``).

- **Rate accuracy**: a destination with ``rate_limit`` 20/s and 200/s, served by 1 and by 2
  ``pipeline worker`` processes, and a backlog of ``BACKLOG_SECONDS`` of calls: the calls the
  receiver got per second while the backlog lasted (past the first second, when each process
  spends its first burst, up to the arrival of 90 % of the calls) ÷ the limit.
- **A receiver that admits 100/s** and answers 429 (no ``Retry-After``) beyond, an unlimited
  destination, one worker, a backlog of ``THROTTLED_SECONDS`` at 100/s: from 30 s on, the calls
  it accepted per second and the share of its requests it answered 429.

Run alone: ``python -m bench --only 14``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ._harness import Deployment, Receiver, Worker

__all__ = ["section_pace"]

#: Seconds of calls at the limit in each accuracy run's backlog.
BACKLOG_SECONDS = 15
#: The throttling receiver's admissions a second, and the seconds of calls at that rate.
ADMITS = 100
THROTTLED_SECONDS = 60
#: From when the throttled run is judged (the issue's "within 30 s").
SETTLED_AFTER = 30.0


def _assigned(worker: Worker) -> bool:
    return "deliver: assigned" in worker.log_path.read_text(errors="replace")


def _started(deployment: Deployment, processes: int, name: str) -> list[Worker]:
    """``processes`` workers (no log store), each holding partitions, settled."""
    env = deployment.env()
    workers = [Worker("worker --no-log-store", env, f"pace-{name}-{n}") for n in range(processes)]
    deadline = time.monotonic() + 90
    while not all(_assigned(w) for w in workers):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name}: the workers were not assigned partitions in 90 s")
        time.sleep(0.2)
    time.sleep(3.0)  # the group's last rebalance settles
    for worker in workers:
        worker.settle()
    return workers


def _backlog_rate(times: list[float]) -> float:
    """Arrivals per second past the first second, up to the arrival of 90 % of them."""
    times = sorted(times)
    end = times[int(len(times) * 0.9)]
    steady = [t for t in times if times[0] + 1.0 <= t <= end]
    return (len(steady) - 1) / (steady[-1] - steady[0]) if len(steady) > 1 else 0.0


def accuracy(bench: Any, limit: float, processes: int, log: Callable[[str], None]) -> float:
    """One run: the backlog rate ÷ ``limit``."""
    receiver = Receiver(log=True)
    deployment = Deployment(bench.bootstrap, f"pace{limit:g}x{processes}")
    deployment.apply({"s": [("d1", [receiver.url()])]}, destination_fields={"rate_limit": limit})
    workers: list[Worker] = []
    try:
        workers = _started(deployment, processes, f"{limit:g}x{processes}")
        count = int(limit * BACKLOG_SECONDS)
        deployment.produce_calls("s", count)
        deadline = time.monotonic() + BACKLOG_SECONDS * 3 + 30
        while receiver.stats()["answered"] < count and time.monotonic() < deadline:
            time.sleep(0.2)
        times = [at for _, attempt, at in receiver.arrivals() if attempt == 1]
        ratio = _backlog_rate(times) / limit
        log(f"14 rate {limit:g}/s, {processes} process(es): {ratio:.3f} of the limit")
        return ratio
    finally:
        for worker in workers:
            worker.stop()
        receiver.stop()


def throttled(bench: Any, log: Callable[[str], None]) -> tuple[float, float]:
    """One run against a receiver that admits ``ADMITS``/s: (accepted/s, share answered 429)
    from ``SETTLED_AFTER`` on."""
    receiver = Receiver(admit=ADMITS)
    deployment = Deployment(bench.bootstrap, "pace429", retry_delays=(1.0, 5.0))
    deployment.apply({"s": [("d1", [receiver.url()])]})
    workers: list[Worker] = []
    try:
        workers = _started(deployment, 1, "429")
        count = ADMITS * THROTTLED_SECONDS
        deployment.produce_calls("s", count)
        started = time.monotonic()
        at_settled: dict[str, Any] | None = None
        last = receiver.stats()
        while time.monotonic() - started < THROTTLED_SECONDS + 30:
            time.sleep(0.5)
            last = receiver.stats()
            if at_settled is None and time.monotonic() - started >= SETTLED_AFTER:
                at_settled, settled_at = last, time.monotonic()
            if last["answered"] >= count:
                break
        assert at_settled is not None, "the backlog was delivered before 30 s"
        span = time.monotonic() - settled_at
        accepted = (last["answered"] - at_settled["answered"]) / span
        requests = last["requests"] - at_settled["requests"]
        share = (last["throttled"] - at_settled["throttled"]) / requests if requests else 0.0
        log(
            f"14 receiver admitting {ADMITS}/s: from {SETTLED_AFTER:g} s on {accepted:.1f}/s "
            f"accepted, {share:.1%} of {requests} requests answered 429 "
            f"({last['throttled']} in all)"
        )
        return accepted, share
    finally:
        for worker in workers:
            worker.stop()
        receiver.stop()


def section_pace(
    bench: Any,
    *,
    row: Callable[..., Any],
    fmt: Callable[..., str],
    median: Callable[[list[float]], float],
    log: Callable[[str], None],
) -> None:
    runs = 1 if bench.quick else 2
    for limit in (20.0, 200.0):
        for processes in (1, 2):
            ratios = [accuracy(bench, limit, processes, log) for _ in range(runs)]
            ratio = median(ratios)
            bench.rows.append(
                row(
                    "14",
                    f"rate_limit {limit:g}/s, {processes} worker process(es): delivered ÷ limit",
                    fmt(ratio * limit),
                    f"limit: {limit:g}/s",
                    fmt(ratio),
                    "0.9-1.1",
                    0.9 <= ratio <= 1.1,
                    [f"{r:.3f}" for r in ratios],
                )
            )
    accepted, share = throttled(bench, log)
    bench.rows.append(
        row(
            "14",
            f"receiver admitting {ADMITS}/s, 429 beyond: accepted/s from {SETTLED_AFTER:g} s on",
            fmt(accepted),
            f"admits: {ADMITS}/s",
            fmt(accepted / ADMITS),
            "≥ 0.8",
            accepted >= 0.8 * ADMITS,
        )
    )
    bench.rows.append(
        row(
            "14",
            f"receiver admitting {ADMITS}/s: share of requests answered 429 from "
            f"{SETTLED_AFTER:g} s on",
            f"{share:.1%}",
            "",
            "",
            "< 5 %",
            share < 0.05,
        )
    )
