"""``make bench``: the pipeline's figures, each next to a reference measured in the same run.

    .venv/bin/python -m bench              # everything, ~5 minutes; writes bench/RESULTS.md
    .venv/bin/python -m bench --only 1,3   # some sections (RESULTS.md is not written)
    BENCH_PROFILE=/tmp/prof .venv/bin/python -m bench --only 2   # py-spy profiles of the workers

Starts its own embedded broker, receivers (``bench._receiver``), workers and ingestion API on
127.0.0.1 and ends each by PID. Every figure is the median of ``--runs`` runs (≥ 3), and every ratio
is taken within one run (ours and its reference measured back to back) before the median: this
machine is shared and noisy, so absolute figures move between runs while ratios hold.

Sections (the issue's numbering):

1. End to end, one ``pipeline worker`` process (router + deliver + retry; router transactions
   off, as ``pipeline dev`` runs on this broker, whose transactions can stall read_committed
   readers, docs/decisions.md): calls produced as a
   backlog, events/s from the receiver's first answer to its last, against raw aiohttp POSTs of
   the same body and headers to the same receiver, 100 in flight (our per-host connection cap).
2. The same with a receiver that answers after 100 ms; router and deliver as separate processes
   (the target is per delivery process), ``PIPELINE_MAX_CONNECTIONS_PER_HOST=1000`` (the default
   100 caps one host at ~1,000 req/s at 100 ms); raw aiohttp with 1,000 in flight as reference.
3. A hanging destination (reads requests, never answers) beside a healthy one, both on every call:
   the healthy receiver's events/s against the same with a healthy neighbour instead (same work
   per call) and against section 1's (alone: half the work per call). Plus the first run, when
   the worker meets a hanging endpoint with its circuit still closed: a new one each run, each
   against the destination alone run just before it. Five runs at least (a run's ratio spreads
   far here), each from a settled worker (``Worker.settle``): the last run's tail is not billed
   to the next.
4. Ingestion API, one ``pipeline ingest`` process: calls/s in batches of 100 and one call per
   request (``bench.ingest_client``).
5. ``pipeline.client`` against segment-analytics-python, the same tight loop of ``track()`` calls,
   library defaults, same API: µs per call and calls lost (``bench.ingest_client``).
6. Retry timing: a receiver that fails each call's first attempt; actual arrival of the retry
   minus the ``notBefore`` written on the retry-tier record (read back from Kafka).
7. Peak RSS (VmHWM) of one ``pipeline deliver`` process working on a 1,000,000-record backlog of
   delivery records, bounded in time (RSS is bounded by the in-flight limit, not by the backlog).
8. Naive baseline: poll one call, ``requests.post``, synchronous commit per message.
9. Router transactions: section 1's end to end again with ``PIPELINE_TRANSACTIONS=on`` (same run,
   alternated; runs after the embedded broker's transactions stall are left out, and the row says
   so), and one ``pipeline router`` process alone turning a backlog of calls into delivery
   records, with and without transactions (calls/s until its group's committed offsets reach the
   end of ``calls``).
10. The delivery log: section 1's end to end with the log on (the worker also runs its log-store)
    against ``PIPELINE_LOG=off`` (same run, alternated); then one ``pipeline log-store`` writing
    that run's whole log (a backlog) into a new embedded store, against what the pipeline's top
    rate asks of it (two log records per delivered call). The store's own figures (ingest into
    an empty and a 10-million-entry store, trace/log/stats at 10 million entries, disk per million
    attempts) are ``python -m bench.log_store`` (its first run builds and caches the big store).
11. 50 destinations per call, 10 answering 500 and 1 hanging (each destination on its own path of
    one of three hosts): the 39 healthy ones' deliveries/s against 50 healthy ones (same run,
    alternated).
12. The router's resend memory (``PIPELINE_DEDUPE_WINDOW``): one router alone and end to end,
    dedupe on against off (same run, alternated), and the restore of one partition's state of a
    million keys from its changelog (``bench.dedupe``).
13. Ordered delivery (``ordering: per_user``): end to end, 1,000 users, an ordered destination
    against the same unordered; and with one user's calls answered 503 for 30 s, the other 999
    users' deliveries/s against the same calls without the failing user (same run, alternated;
    ``bench.ordering``).
14. A destination's pace: ``rate_limit`` 20/s and 200/s with 1 and 2 worker processes, delivered
    ÷ limit while a backlog lasts; a receiver that admits 100/s and answers 429 beyond, from 30 s
    on: accepted/s and the share answered 429 (``bench.pace``).
15. Batching: one worker, a destination with batches of 100 against the same one without (same
    run, alternated): calls delivered/s at the receiver, and the worker's CPU seconds per 1,000
    calls (``bench.batching``).
16. Tracing: one worker, calls carrying a ``traceparent``: tracing off against calls without one,
    and tracing on with 1 % and 100 % of the contexts sampled (exported to a stand-in OTLP
    collector) against off (same run, alternated): deliveries/s, and the worker's CPU seconds per
    1,000 calls (``bench.tracing``).
17. The hot path's choices (issue 36): section 1's end to end once per variant of the worker's
    settings (the HTTP client, the event loop, one CPU), alternated: deliveries/s and CPU per
    call (``bench.hot_path``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import logging
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from pipeline.kafka.broker import EmbeddedBroker
from pipeline.kafka.clients import consumer_config
from pipeline.kafka.topic_reader import read_topic

from ._baselines import raw_post_rate
from ._harness import (
    Deployment,
    Receiver,
    Worker,
    delivery_records,
    end_all,
    produce_all,
    rate,
    sample_request,
    wait_answered,
)

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


@dataclass
class Row:
    key: str
    measure: str
    figure: str
    reference: str = ""
    ratio: str = ""
    target: str = ""
    met: bool | None = None
    runs: list[str] = field(default_factory=list)


@dataclass
class Bench:
    bootstrap: str
    runs: int
    quick: bool
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def n(self, full: int) -> int:
        return max(1000, full // 4) if self.quick else full


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def fmt(value: float, unit: str = "") -> str:
    if value != value:  # NaN
        return "n/a"
    text = (
        f"{value:,.0f}"
        if abs(value) >= 100
        else f"{value:.2f}"
        if abs(value) < 10
        else f"{value:.1f}"
    )
    return f"{text}{unit}"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def pipeline_rate(receiver: Receiver, deployment: Deployment, source: str, count: int) -> float:
    """Produce ``count`` calls as fast as Kafka takes them; events/s at ``receiver``."""
    records = list(deployment.call_records(source, count))  # encoded before the clock starts
    receiver.reset()
    produce_all(deployment.settings, deployment.topics.calls, records)
    return rate(wait_answered(receiver, count, timeout=120, stall=15))


def warm_up(receiver: Receiver, deployment: Deployment, source: str, count: int = 20) -> None:
    receiver.reset()
    deployment.produce_calls(source, count)
    wait_answered(receiver, count, timeout=90, stall=60)
    receiver.reset()


# ---- 1 and 8: end to end against raw aiohttp and the naive loop ---------------------------------


def section_e2e(bench: Bench) -> None:
    calls, naive_calls = bench.n(20000), bench.n(2000)
    receiver = Receiver()
    deployment = Deployment(bench.bootstrap, "e2e")
    deployment.apply({"s": [("d1", [receiver.url()])]})
    naive_deployment = Deployment(bench.bootstrap, "naive")
    tx_deployment = Deployment(bench.bootstrap, "e2e-tx")
    tx_deployment.apply({"s": [("d1", [receiver.url()])]})
    # Ours as `pipeline dev` runs it on this broker (transactions off); section 9's comparison
    # with them on is measured while the embedded broker's transactions do not stall.
    worker = Worker("worker", deployment.env(), "e2e-worker")
    tx_worker = Worker("worker", tx_deployment.env(PIPELINE_TRANSACTIONS="on"), "e2e-tx")
    naive = Worker(receiver.url(), naive_deployment.env(), "naive", module="bench._naive")
    stalled = ""
    try:
        warm_up(receiver, deployment, "s")
        warm_up(receiver, naive_deployment, "s")
        try:
            warm_up(receiver, tx_deployment, "s")
        except TimeoutError as exc:
            stalled = f"warm-up: {exc}"
            tx_worker.stop()  # what it holds must not reach the receiver in a later run
        body, headers = sample_request(deployment)
        raw, ours, plain, ours_cpu = [], [], [], []
        on: dict[int, float] = {}  # by run: a stalled run has none
        for run in range(bench.runs):
            raw.append(raw_post_rate(receiver, body, headers, calls, 100))
            # Alternated, so neither mode always runs on the warmer machine.
            for mode in ("off", "on") if run % 2 == 0 else ("on", "off"):
                if mode == "off":
                    worker.settle()
                    cpu = worker.cpu_seconds()
                    ours.append(pipeline_rate(receiver, deployment, "s", calls))
                    worker.settle()  # its delivery log written too
                    ours_cpu.append((worker.cpu_seconds() - cpu) / calls * 1e6)
                elif not stalled:
                    try:
                        on[run] = pipeline_rate(receiver, tx_deployment, "s", calls)
                    except TimeoutError as exc:
                        stalled = f"run {run + 1}: {exc}"
                        tx_worker.stop()
            plain.append(pipeline_rate(receiver, naive_deployment, "s", naive_calls))
            log(
                f"1/8/9 run {run + 1}: ours {ours[-1]:,.0f}/s ({ours_cpu[-1]:.0f} µs CPU a call; "
                f"transactions on "
                f"{on.get(run, 0):,.0f}/s) raw {raw[-1]:,.0f}/s naive {plain[-1]:,.0f}/s"
            )
            if stalled:
                log(f"9: the embedded broker's transactions stalled ({stalled})")
    finally:
        worker.stop()
        tx_worker.stop()
        naive.stop()
        receiver.stop()
    vs_raw = [o / r for o, r in zip(ours, raw, strict=True)]
    vs_naive = [o / p for o, p in zip(ours, plain, strict=True)]
    bench.rows += [
        Row(
            "1",
            f"end to end, one `pipeline worker`, {calls:,} calls (events/s)",
            fmt(median(ours)),
            f"raw aiohttp, 100 in flight: {fmt(median(raw))}",
            fmt(median(vs_raw)),
            "≥ 0.7",
            median(vs_raw) >= 0.7,
            [f"{o:,.0f}/{r:,.0f}" for o, r in zip(ours, raw, strict=True)],
        ),
        Row(
            "1",
            "… the same, the worker's CPU a call, its delivery log and log-store on (µs; all its "
            "threads, until the backlog's log is written)",
            fmt(median(ours_cpu)),
            "",
            "",
            "≤ 120",
            median(ours_cpu) <= 120,
            [f"{used:.0f}" for used in ours_cpu],
        ),
        Row(
            "1",
            "end to end vs the naive loop (same run)",
            fmt(median(ours)),
            f"naive (8): {fmt(median(plain))}",
            fmt(median(vs_naive), "×"),
            "≥ 5×",
            median(vs_naive) >= 5,
        ),
        transactions_row(ours, on, stalled),
        Row(
            "8",
            f"naive: poll, requests.post, sync commit per message, {naive_calls:,} calls (events/s)",
            fmt(median(plain)),
            f"raw aiohttp: {fmt(median(raw))}",
            fmt(median([p / r for p, r in zip(plain, raw, strict=True)])),
            "reference",
            None,
        ),
    ]


def transactions_row(off: list[float], on: dict[int, float], stalled: str) -> Row:
    """Section 9's end to end: runs with router transactions against the same runs' figure
    without; the runs the embedded broker's transactions stalled are left out and said."""
    measure = "end to end with router transactions vs without (same run, alternated)"
    if not on:
        return Row("9", measure, "stalled", f"the embedded broker's transactions: {stalled}")
    ratios = [on[run] / off[run] for run in on]
    return Row(
        "9",
        measure + (f"; then stalled ({stalled})" if stalled else ""),
        fmt(median(list(on.values()))),
        f"`PIPELINE_TRANSACTIONS=off`: {fmt(median([off[run] for run in on]))}",
        fmt(median(ratios)),
        "≥ 0.9",
        median(ratios) >= 0.9,
        [f"{on[run]:,.0f}/{off[run]:,.0f}" for run in on],
    )


# ---- 2: 100 ms receivers ------------------------------------------------------------------------


def section_slow(bench: Bench) -> None:
    calls = bench.n(15000)
    receiver = Receiver(delay=0.1)
    deployment = Deployment(bench.bootstrap, "slow")
    deployment.apply({"s": [("d1", [receiver.url()])]})
    env = deployment.env(PIPELINE_MAX_CONNECTIONS_PER_HOST="1000")
    router = Worker("router", env, "slow-router")
    deliver = Worker("deliver", env, "slow-deliver")
    try:
        warm_up(receiver, deployment, "s")
        body, headers = sample_request(deployment)
        raw, ours, cores, cpu_per_event = [], [], [], []
        for run in range(bench.runs):
            raw.append(raw_post_rate(receiver, body, headers, calls, 1000))
            cpu, begun = deliver.cpu_seconds(), time.monotonic()
            ours.append(pipeline_rate(receiver, deployment, "s", calls))
            used = deliver.cpu_seconds() - cpu
            cores.append(used / (time.monotonic() - begun))
            cpu_per_event.append(used / calls * 1e6)
            log(
                f"2 run {run + 1}: ours {ours[-1]:,.0f}/s raw {raw[-1]:,.0f}/s, deliver process "
                f"{cores[-1]:.2f} cores, {cpu_per_event[-1]:.0f} µs CPU per event"
            )
    finally:
        router.stop()
        deliver.stop()
        receiver.stop()
    ratio = [o / r for o, r in zip(ours, raw, strict=True)]
    bench.rows.append(
        Row(
            "2",
            f"100 ms receiver, one `pipeline deliver` (+ a router process), {calls:,} calls (events/s)",
            fmt(median(ours)),
            f"raw aiohttp, 1,000 in flight: {fmt(median(raw))} (ideal 10,000)",
            fmt(median(ratio)),
            "≥ 8,000/s",
            median(ours) >= 8000,
            [f"{o:,.0f}/{r:,.0f}" for o, r in zip(ours, raw, strict=True)],
        )
    )
    bench.notes.append(
        f"(2): the deliver process used {median(cores):.2f} cores, {median(cpu_per_event):.0f} µs "
        f"of CPU per event (all its threads); at one full core that is "
        f"{1e6 / median(cpu_per_event):,.0f} events/s."
    )


# ---- 3: a hanging destination beside a healthy one ----------------------------------------------


def section_hang(bench: Bench) -> None:
    calls = bench.n(10000)
    healthy, other = Receiver(), Receiver()
    # A new hanging receiver for each first run: each is met fresh (circuit closed, no answer
    # yet). The first of them is also the steady runs' neighbour. A run's ratio spreads far on
    # this shared machine (0.72-1.02 over five first runs, 0.83-1.11 over eight steady ones, in
    # /tmp harnesses: docs/decisions.md), so each row is the median of five runs at least.
    runs = max(bench.runs, 5)
    hangs = [Receiver("hang") for _ in range(runs)]
    fresh = ["hang", *(f"hang-{k}" for k in range(1, runs))]
    deployment = Deployment(bench.bootstrap, "hang")
    deployment.apply(
        {
            "warm": [("warm-healthy", [healthy.url()])],
            "alone": [("healthy-alone", [healthy.url()])],
            # Every call makes two delivery records: the healthy one, and one to the neighbour.
            "hang": [("healthy", [healthy.url()]), ("hanging", [hangs[0].url()])],
            **{
                source: [
                    (f"healthy-first-{k}", [healthy.url()]),
                    (f"hanging-first-{k}", [hangs[k].url()]),
                ]
                for k, source in enumerate(fresh)
                if k
            },
            "pair": [("healthy-2", [healthy.url()]), ("other", [other.url()])],
        }
    )
    worker = Worker("worker", deployment.env(), "hang-worker")
    onsets: list[float] = []
    onset_solos: list[float] = []

    def measured(source: str) -> float:
        """A run from a settled worker: the last run's tail (its delivery log, its commits) is
        done first. The run after the pair's, twice the work, was 8 % slower without it (a
        median of eight rounds, ``docs/decisions.md``), and the hang's always came after it."""
        worker.settle()
        return pipeline_rate(healthy, deployment, source, calls)

    def first_run(k: int) -> None:
        """A hanging endpoint met fresh: its circuit is closed, so the worker learns only from
        silence and timeouts. Against the destination alone, run just before."""
        onset_solos.append(measured("alone"))
        onsets.append(measured(fresh[k]))
        log(f"3 first run {k + 1}: healthy {onsets[-1]:,.0f}/s, alone {onset_solos[-1]:,.0f}/s")

    try:
        warm_up(healthy, deployment, "warm")
        first_run(0)
        beside_hang, beside_healthy, solo = [], [], []
        for run in range(runs):  # the steady state: circuit open, probes
            solo.append(measured("alone"))
            beside_healthy.append(measured("pair"))
            beside_hang.append(measured("hang"))
            log(
                f"3 run {run + 1}: healthy beside hanging {beside_hang[-1]:,.0f}/s, "
                f"beside healthy {beside_healthy[-1]:,.0f}/s, alone {solo[-1]:,.0f}/s"
            )
        for k in range(1, runs):
            # The one before has settled (its requests timed out, its circuit open): each first
            # run meets one new hang, as the first did.
            time.sleep(deployment.settings.delivery_timeout + 1)
            first_run(k)
        hung = sum(hang.stats()["requests"] for hang in hangs)
    finally:
        worker.stop()
        healthy.stop()
        other.stop()
        for hang in hangs:
            hang.stop()
    isolation = [h / p for h, p in zip(beside_hang, beside_healthy, strict=True)]
    alone = [h / s for h, s in zip(beside_hang, solo, strict=True)]
    first = [o / s for o, s in zip(onsets, onset_solos, strict=True)]
    bench.rows += [
        Row(
            "3",
            f"healthy destination beside a hanging one, {calls:,} calls (events/s at the healthy one)",
            fmt(median(beside_hang)),
            f"beside a healthy one (same work per call): {fmt(median(beside_healthy))}",
            fmt(median(isolation)),
            "≥ 0.9",
            median(isolation) >= 0.9,
            [f"{h:,.0f}/{p:,.0f}" for h, p in zip(beside_hang, beside_healthy, strict=True)],
        ),
        Row(
            "3",
            "… the same against the destination alone (half the work per call)",
            fmt(median(beside_hang)),
            f"alone, same worker: {fmt(median(solo))}",
            fmt(median(alone)),
            "≥ 0.95 (as written)",
            median(alone) >= 0.95,
            [f"{h:,.0f}/{s:,.0f}" for h, s in zip(beside_hang, solo, strict=True)],
        ),
        Row(
            "3",
            "… first run: a new hanging endpoint each run, not yet known (5 s timeouts until its "
            "circuit opens)",
            fmt(median(onsets)),
            f"alone, run just before each: {fmt(median(onset_solos))}",
            fmt(median(first)),
            "≥ 0.9",
            median(first) >= 0.9,
            [f"{o:,.0f}/{s:,.0f}" for o, s in zip(onsets, onset_solos, strict=True)],
        ),
    ]
    bench.notes.append(
        f"(3): the hanging receivers got {hung:,} requests in all; the rest of their records were "
        "parked in the retry tiers (undecoded) without a request."
    )


# ---- 11: many destinations, some failing --------------------------------------------------------


def section_many(bench: Bench) -> None:
    """50 destinations per call: 39 healthy, 10 answering 500, 1 hanging, each on its own path
    (two hosts: the healthy one, and the failing one); against 50 healthy ones."""
    calls = bench.n(2000)
    healthy, failing, hanging = Receiver(), Receiver("fail"), Receiver("hang")
    deployment = Deployment(bench.bootstrap, "many")
    good = [(f"ok-{n}", [healthy.url(f"/ok/{n}")]) for n in range(39)]
    bad = [(f"fail-{n}", [failing.url(f"/fail/{n}")]) for n in range(10)]
    all_good = [(f"all-ok-{n}", [healthy.url(f"/all/{n}")]) for n in range(50)]
    deployment.apply(
        {
            "warm": [("warm", [healthy.url()])],
            "mixed": [*good, *bad, ("hang", [hanging.url("/hang")])],
            "healthy": all_good,
        }
    )
    worker = Worker("worker", deployment.env(), "many-worker")
    try:
        warm_up(healthy, deployment, "warm")
        mixed, fine = [], []
        for run in range(bench.runs):
            order = ("mixed", "healthy") if run % 2 == 0 else ("healthy", "mixed")
            for source in order:
                per_call = 39 if source == "mixed" else 50
                records = list(deployment.call_records(source, calls))
                healthy.reset()
                produce_all(deployment.settings, deployment.topics.calls, records)
                figure = rate(wait_answered(healthy, calls * per_call, timeout=300, stall=30))
                (mixed if source == "mixed" else fine).append(figure)
            log(
                f"11 run {run + 1}: 39 healthy beside 11 failing {mixed[-1]:,.0f} deliveries/s, "
                f"50 healthy {fine[-1]:,.0f}/s"
            )
        failed, hung = failing.stats()["requests"], hanging.stats()["requests"]
    finally:
        worker.stop()
        healthy.stop()
        failing.stop()
        hanging.stop()
    ratios = [m / f for m, f in zip(mixed, fine, strict=True)]
    bench.rows.append(
        Row(
            "11",
            f"50 destinations, 10 answering 500 and 1 hanging, {calls:,} calls: the 39 healthy "
            "ones' deliveries/s",
            fmt(median(mixed)),
            f"50 healthy ones: {fmt(median(fine))}",
            fmt(median(ratios)),
            "≥ 0.9",
            median(ratios) >= 0.9,
            [f"{m:,.0f}/{f:,.0f}" for m, f in zip(mixed, fine, strict=True)],
        )
    )
    bench.notes.append(
        f"(11): the failing receiver got {failed:,} requests and the hanging one {hung:,}; the "
        "rest of their records were parked."
    )


# ---- 6: retry timing ----------------------------------------------------------------------------


def section_retry(bench: Bench) -> None:
    calls = bench.n(1000)
    receiver = Receiver("fail-first", log=True)
    # 2 s: longer than HOLD_SECONDS, so each partition is paused, resumed early, then held.
    deployment = Deployment(bench.bootstrap, "retry", retry_delays=(2.0,), retry_partitions=3)
    deployment.apply({"s": [("d1", [receiver.url()])]})
    # Every first attempt fails on purpose: keep the circuit breaker out of the way.
    env = deployment.env(PIPELINE_CIRCUIT_FAILURES="1000000")
    worker = Worker("worker", env, "retry-worker")
    p50s, p99s, lows, highs = [], [], [], []
    try:
        for run in range(bench.runs + 1):  # run 0 warms the worker up (not counted)
            receiver.reset()
            count = 20 if run == 0 else calls
            deployment.produce_calls("s", count)
            wait_answered(receiver, count, timeout=90, stall=60)
            if run == 0:
                continue
            arrivals = receiver.arrivals()
            due = {}
            for message in read_topic(
                deployment.settings, deployment.topics.retry[0], idle_timeout=30
            ):
                record = deployment.codec.decode("Delivery", message.value())
                due[record["messageId"]] = record["notBefore"] / 1000
            errors = sorted(
                (at - due[mid]) * 1000
                for mid, attempt, at in arrivals
                if attempt == 2 and mid in due
            )
            if len(errors) < calls:
                raise RuntimeError(f"only {len(errors)} of {calls} retries matched their records")
            p50s.append(errors[len(errors) // 2])
            p99s.append(errors[min(len(errors) - 1, int(len(errors) * 0.99))])
            lows.append(errors[0])
            highs.append(errors[-1])
            log(f"6 run {run}: p50 {p50s[-1]:.0f} ms p99 {p99s[-1]:.0f} ms min {lows[-1]:.1f} ms")
    finally:
        worker.stop()
        receiver.stop()
    bench.rows.append(
        Row(
            "6",
            f"retry timing error, actual − scheduled, {calls:,} retries a run (p50 / p99, ms)",
            f"{fmt(median(p50s))} / {fmt(median(p99s))}",
            f"earliest {min(lows):.1f} ms, latest {max(highs):,.0f} ms",
            "",
            "never early; p99 < 1,000",
            min(lows) >= 0 and median(p99s) < 1000,
            [f"{a:.0f}/{b:.0f}" for a, b in zip(p50s, p99s, strict=True)],
        )
    )


# ---- 7: peak RSS on a 1,000,000-record backlog --------------------------------------------------


def section_rss(bench: Bench) -> None:
    backlog, seconds = (250_000 if bench.quick else 1_000_000), 8.0
    receiver = Receiver()
    deployment = Deployment(bench.bootstrap, "rss")
    deployment.apply({"s": [("d1", [receiver.url()])]})
    started = time.monotonic()
    produce_all(
        deployment.settings,
        deployment.topics.deliveries,
        delivery_records(deployment, "d1", backlog),
    )
    log(f"7: {backlog:,} delivery records produced in {time.monotonic() - started:.1f} s")
    peaks, delivered, early, late = [], [], [], []
    for run in range(bench.runs):
        receiver.reset()
        worker = Worker("deliver", deployment.env(), f"rss-deliver-{run}")
        samples: list[tuple[float, float]] = []
        try:
            begun = time.monotonic()
            while time.monotonic() - begun < 60 and not receiver.stats()["answered"]:
                time.sleep(0.1)
            first = time.monotonic()
            while time.monotonic() - first < seconds and worker.alive():
                samples.append((time.monotonic() - first, worker.memory_mb()[0]))
                time.sleep(0.2)
            peaks.append(worker.memory_mb()[1])
        finally:
            worker.stop()
        delivered.append(receiver.stats()["answered"])
        early.append(max(r for t, r in samples if t <= seconds / 3))
        late.append(max(r for t, r in samples if t >= 2 * seconds / 3))
        log(f"7 run {run + 1}: peak {peaks[-1]:.0f} MB, delivered {delivered[-1]:,}")
    receiver.stop()
    bench.rows.append(
        Row(
            "7",
            f"peak RSS, one `pipeline deliver`, {backlog:,}-record backlog, {seconds:.0f} s (MB)",
            fmt(median(peaks)),
            f"RSS first third {fmt(median(early))}, last third {fmt(median(late))}; "
            f"{fmt(median(delivered))} delivered a run",
            "",
            "< 300",
            median(peaks) < 300,
            [f"{p:.0f}" for p in peaks],
        )
    )


# ---- 4 and 5: ingestion API and client library (bench.ingest_client) ----------------------------


def section_ingest(bench: Bench) -> None:
    from pipeline.core.config import validate_config
    from pipeline.kafka.config_store import apply_config
    from pipeline.runtime.net import free_port

    from . import ingest_client as ic

    deployment = Deployment(bench.bootstrap, "ingest")
    apply_config(
        deployment.settings,
        validate_config({"sources": [{"id": "web", "write_keys": [ic.WRITE_KEY]}]}),
    )
    port = free_port()
    api = Worker(f"ingest --port {port}", deployment.env(), "ingest")
    url = f"http://127.0.0.1:{port}"
    batch_requests, single_requests, calls = bench.n(800), bench.n(2000), bench.n(20000)
    batched, single, ours, segment, ours_lost, segment_lost = [], [], [], [], [], []
    api_cpu: list[float] = []
    logging.getLogger("segment").setLevel(logging.CRITICAL)  # "queue is full", once per call
    try:
        ic._wait_ready(url)
        for run in range(bench.runs):
            cpu, begun = api.cpu_seconds(), time.monotonic()
            result = asyncio.run(ic._api_throughput(url, batch_requests, 100, 32))
            api_cpu.append((api.cpu_seconds() - cpu) / (time.monotonic() - begun))
            batched.append(result["calls_per_s"])
            result = asyncio.run(ic._api_throughput(url, single_requests, 1, 32))
            single.append(result["calls_per_s"])
            log(f"4 run {run + 1}: batches of 100 {batched[-1]:,.0f}/s, single {single[-1]:,.0f}/s")
        for run in range(bench.runs):
            mine = ic._ours(url, calls)
            theirs = ic._segment(url, calls)
            ours.append(mine["us_per_call"])
            ours_lost.append(mine["lost"])
            segment.append(theirs["us_per_call"])
            segment_lost.append(theirs["lost"])
            log(
                f"5 run {run + 1}: ours {ours[-1]:.1f} µs lost {ours_lost[-1]}, "
                f"segment {segment[-1]:.1f} µs lost {segment_lost[-1]}"
            )
    finally:
        api.stop()
    ratio = [o / s for o, s in zip(ours, segment, strict=True)]
    bench.rows += [
        Row(
            "4",
            f"ingestion API, one process, batches of 100, 32 in flight "
            f"({batch_requests:,} requests, calls/s; API process used {median(api_cpu):.2f} cores)",
            fmt(median(batched)),
            "",
            "",
            "≥ 30,000",
            median(batched) >= 30000,
            [f"{b:,.0f}" for b in batched],
        ),
        Row(
            "4",
            f"ingestion API, one call per request (`/v1/batch` of 1), 32 in flight "
            f"({single_requests:,} requests, calls/s)",
            fmt(median(single)),
            f"batches of 100: {fmt(median(batched))}",
            fmt(median([s / b for s, b in zip(single, batched, strict=True)])),
            "reference",
            None,
            [f"{s:,.0f}" for s in single],
        ),
        Row(
            "5",
            f"pipeline.client µs per track(), {calls:,} calls in a tight loop, defaults",
            fmt(median(ours), " µs"),
            f"segment-analytics-python: {fmt(median(segment), ' µs')}",
            fmt(median(ratio)),
            "≤ 0.33",
            median(ratio) <= 1 / 3,
            [f"{o:.1f}/{s:.1f}" for o, s in zip(ours, segment, strict=True)],
        ),
        Row(
            "5",
            "calls lost (queue full or failed), defaults, per run",
            ", ".join(str(x) for x in ours_lost),
            f"segment-analytics-python: {', '.join(str(x) for x in segment_lost)}",
            "",
            "0",
            not any(ours_lost),
        ),
    ]


# ---- 9: the router alone, with and without transactions ------------------------------------------


def routed_total(deployment: Deployment) -> int:
    """Calls the router has committed as handed off, over every partition of ``calls``."""
    settings = deployment.settings
    consumer = Consumer(consumer_config(settings, f"{settings.topic_prefix}router"))
    try:
        partitions = [
            TopicPartition(deployment.topics.calls, p) for p in range(settings.partitions)
        ]
        return sum(max(0, tp.offset) for tp in consumer.committed(partitions, timeout=10))
    finally:
        consumer.close()


def router_rate(deployment: Deployment, count: int) -> float:
    """Produce ``count`` calls; calls/s until the router's committed offsets cover them all."""
    records = list(deployment.call_records("s", count))
    target = routed_total(deployment) + count
    started = time.monotonic()
    produce_all(deployment.settings, deployment.topics.calls, records)
    deadline = started + 120
    while (routed := routed_total(deployment)) < target:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the router handed off {routed - target + count} of {count}")
        time.sleep(0.02)
    return count / (time.monotonic() - started)


def section_router(bench: Bench) -> None:
    calls = bench.n(50000)
    receiver = Receiver()
    modes = {
        "on": Deployment(bench.bootstrap, "router-on"),
        "off": Deployment(bench.bootstrap, "router-off"),
    }
    workers: dict[str, Worker] = {}
    figures: dict[str, dict[int, float]] = {"on": {}, "off": {}}
    stalled = ""
    try:
        for mode, deployment in modes.items():
            deployment.apply({"s": [("d1", [receiver.url()])]})
            env = deployment.env(PIPELINE_TRANSACTIONS=mode)
            workers[mode] = Worker("router", env, f"router-{mode}")
        for run in range(-1, bench.runs):  # run -1: joined the group, transactions initialised
            for mode in ["on", "off"] if run % 2 == 0 else ["off", "on"]:
                if mode == "on" and stalled:
                    continue
                try:
                    figures[mode][run] = router_rate(modes[mode], 100 if run < 0 else calls)
                except TimeoutError as exc:
                    if mode == "off":
                        raise
                    stalled = f"run {run + 1}: {exc}"
                    workers["on"].stop()
            if run >= 0:
                log(
                    f"9 run {run + 1}: router {figures['on'].get(run, 0):,.0f}/s, "
                    f"off {figures['off'][run]:,.0f}/s"
                )
    finally:
        for worker in workers.values():
            worker.stop()
        receiver.stop()
    paired = [run for run in figures["on"] if run >= 0]
    measure = f"one `pipeline router` alone, {calls:,} calls backlog, transactions on (calls/s)"
    if not paired:
        bench.rows.append(
            Row("9", measure, "stalled", f"the embedded broker's transactions: {stalled}")
        )
        return
    on = [figures["on"][run] for run in paired]
    off = [figures["off"][run] for run in paired]
    bench.rows.append(
        Row(
            "9",
            measure + (f"; then stalled ({stalled})" if stalled else ""),
            fmt(median(on)),
            f"transactions off: {fmt(median(off))}",
            fmt(median([a / b for a, b in zip(on, off, strict=True)])),
            "reference",
            None,
            [f"{a:,.0f}/{b:,.0f}" for a, b in zip(on, off, strict=True)],
        )
    )


# ---- 10: the delivery log --------------------------------------------------------------------------


@dataclass
class LogBacklog:
    kafka_records: int
    """Kafka records on ``deliveries.log`` (``LogBatch``es)."""
    log_records: int
    """``LogRecord``s in them: one per call and hand-off (the router's; each attempt's)."""
    entries: int
    """Entries in those: one per decision (received, routed, attempt, delivered, ...)."""


def log_backlog(deployment: Deployment) -> LogBacklog:
    """What the deployment's ``deliveries.log`` holds (to its ends)."""
    from pipeline.kafka.codec import Codec
    from pipeline.kafka.log_reading import decode_log_records

    codec = Codec.default()
    kafka_records = log_records = entries = 0
    for message in read_topic(deployment.settings, deployment.topics.log):
        kafka_records += 1
        records = decode_log_records(codec, message.value())
        log_records += len(records)
        entries += sum(len(record["entries"]) for record in records)
    return LogBacklog(kafka_records, log_records, entries)


def store_positions(url: str) -> int:
    """Log records the store at ``url`` has written (the sum of its partitions' positions)."""
    from pipeline.store import open_store

    try:
        store = open_store(url)
    except Exception:  # noqa: BLE001 - not created yet
        return 0
    try:
        return sum(store.positions().values())
    finally:
        store.close()


def log_store_rate(deployment: Deployment, backlog: LogBacklog, name: str) -> float:
    """One ``pipeline log-store`` on a new store over the deployment's log: its log records/s
    from its first write until its store holds them all (its start-up and group join are not
    counted; the first write's share is taken out pro rata)."""
    url = f"{deployment.log_store_url}.{name}"
    worker = Worker("log-store", deployment.env(PIPELINE_LOG_STORE_URL=url), name)
    try:
        deadline = time.monotonic() + 300
        while (first := store_positions(url)) == 0:
            if time.monotonic() > deadline:
                raise TimeoutError("log-store wrote nothing")
            time.sleep(0.01)
        started = time.monotonic()
        records = backlog.kafka_records
        while (written := store_positions(url)) < records:
            if time.monotonic() > deadline:
                raise TimeoutError(f"log-store wrote {written} of {records} Kafka records")
            time.sleep(0.05)
        return backlog.log_records * (records - first) / records / (time.monotonic() - started)
    finally:
        worker.stop()


def section_log(bench: Bench) -> None:
    calls = bench.n(20000)
    receiver = Receiver()
    # on: the worker as shipped, its log-store process beside it on this 2-core machine;
    # produced: the log produced, its log-store elsewhere (``--no-log-store``); off: no log.
    commands = {
        "on": ("worker", "on"),
        "produced": ("worker --no-log-store", "on"),
        "off": ("worker", "off"),
    }
    modes = {mode: Deployment(bench.bootstrap, f"log-{mode}") for mode in commands}
    workers: dict[str, Worker] = {}
    figures: dict[str, list[float]] = {mode: [] for mode in commands}
    # The worker's CPU per call: steadier than events/s on a shared machine, and what the log
    # costs the pipeline's own process (the broker's and the log-store's share are elsewhere).
    cpu: dict[str, list[float]] = {mode: [] for mode in commands}
    try:
        for mode, deployment in modes.items():
            deployment.apply({"s": [("d1", [receiver.url()])]})
            command, logging_on = commands[mode]
            env = deployment.env(PIPELINE_LOG=logging_on)
            workers[mode] = Worker(command, env, f"log-{mode}")
        for deployment in modes.values():
            warm_up(receiver, deployment, "s")
        for run in range(bench.runs):
            order = list(commands) if run % 2 == 0 else list(reversed(commands))
            for mode in order:
                before = workers[mode].cpu_seconds()
                figures[mode].append(pipeline_rate(receiver, modes[mode], "s", calls))
                cpu[mode].append((workers[mode].cpu_seconds() - before) / calls * 1e6)
            log(
                f"10 run {run + 1}: log on {figures['on'][-1]:,.0f}/s, produced only "
                f"{figures['produced'][-1]:,.0f}/s, off {figures['off'][-1]:,.0f}/s; worker CPU "
                f"per call {cpu['produced'][-1]:,.0f} µs produced, {cpu['off'][-1]:,.0f} µs off"
            )
    finally:
        for worker in workers.values():
            worker.stop()
        receiver.stop()
    ratios = [a / b for a, b in zip(figures["on"], figures["off"], strict=True)]
    cpu_ratios = [b / a for a, b in zip(cpu["produced"], cpu["off"], strict=True)]
    produced = [a / b for a, b in zip(figures["produced"], figures["off"], strict=True)]
    backlog = log_backlog(modes["on"])
    per_record = backlog.entries / backlog.log_records
    ingest = []
    for run in range(bench.runs):
        ingest.append(log_store_rate(modes["on"], backlog, f"log-store-{run}"))
        log(
            f"10 log-store run {run + 1}: {ingest[-1]:,.0f} log records/s "
            f"({ingest[-1] * per_record:,.0f} entries/s)"
        )
    # What the pipeline at its top rate asks of the store: a delivered call is two log records.
    needed = 2 * max(figures["on"])
    bench.rows += [
        Row(
            "10",
            f"end to end producing the delivery log (`worker --no-log-store`), {calls:,} calls "
            "(events/s)",
            fmt(median(figures["produced"])),
            f"`PIPELINE_LOG=off`: {fmt(median(figures['off']))}",
            fmt(median(produced)),
            "≥ 0.9",
            median(produced) >= 0.9,
            [
                f"{a:,.0f}/{b:,.0f}"
                for a, b in zip(figures["produced"], figures["off"], strict=True)
            ],
        ),
        Row(
            "10",
            "the same, the worker's CPU per call (µs; ratio: off's CPU over produced's, as a rate)",
            fmt(median(cpu["produced"])),
            f"`PIPELINE_LOG=off`: {fmt(median(cpu['off']))}",
            fmt(median(cpu_ratios)),
            "≥ 0.9",
            median(cpu_ratios) >= 0.9,
            [f"{a:,.0f}/{b:,.0f}" for a, b in zip(cpu["produced"], cpu["off"], strict=True)],
        ),
        Row(
            "10",
            f"end to end with the log and its log-store process on the same 2 cores, {calls:,} "
            "calls (events/s; the log-store's CPU is the machine's here, its own figure is the "
            "next row)",
            fmt(median(figures["on"])),
            f"`PIPELINE_LOG=off`: {fmt(median(figures['off']))}",
            fmt(median(ratios)),
            "reference",
            None,
            [f"{a:,.0f}/{b:,.0f}" for a, b in zip(figures["on"], figures["off"], strict=True)],
        ),
        Row(
            "10",
            f"one `pipeline log-store` (embedded store), a backlog of {backlog.log_records:,} log "
            f"records ({backlog.entries:,} entries in {backlog.kafka_records:,} Kafka records), "
            "first write to last (log records/s; a log record is one call's hand-off)",
            fmt(median(ingest)),
            f"the pipeline's top rate needs {fmt(needed)}; "
            f"{fmt(median(ingest) * per_record)} entries/s",
            fmt(median(ingest) / needed, "×"),
            "≥ 20,000/s and ≥ 1×",
            median(ingest) >= 20000 and median(ingest) >= needed,
            [f"{r:,.0f}" for r in ingest],
        ),
    ]


def section_dedupe(bench: Bench) -> None:
    from .dedupe import section_dedupe as run

    run(
        bench,
        router_rate=router_rate,
        pipeline_rate=pipeline_rate,
        warm_up=warm_up,
        row=Row,
        fmt=fmt,
        median=median,
        log=log,
    )


def section_ordering(bench: Bench) -> None:
    from .ordering import section_ordering as run

    run(bench, warm_up=warm_up, row=Row, fmt=fmt, median=median, log=log)


def section_pace(bench: Bench) -> None:
    from .pace import section_pace as run

    run(bench, row=Row, fmt=fmt, median=median, log=log)


def section_batching(bench: Bench) -> None:
    from .batching import section_batching as run

    run(bench, warm_up=warm_up, row=Row, fmt=fmt, median=median, log=log)


def section_tracing(bench: Bench) -> None:
    from .tracing import section_tracing as run

    run(bench, warm_up=warm_up, row=Row, fmt=fmt, median=median, log=log)


def section_hot_path(bench: Bench) -> None:
    from .hot_path import section_hot_path as run

    run(bench, warm_up=warm_up, row=Row, fmt=fmt, median=median, log=log)


SECTIONS: dict[str, Callable[[Bench], None]] = {
    "1": section_e2e,  # also 8
    "3": section_hang,
    "2": section_slow,
    "6": section_retry,
    "4": section_ingest,  # also 5
    "7": section_rss,
    "9": section_router,
    "10": section_log,
    "11": section_many,
    "12": section_dedupe,
    "13": section_ordering,
    "14": section_pace,
    "15": section_batching,
    "16": section_tracing,
    "17": section_hot_path,
}


# ---- the table ------------------------------------------------------------------------------------


def versions() -> str:
    import confluent_kafka

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return (
        f"Python {platform.python_version()}, confluent-kafka {version('confluent-kafka')} "
        f"(librdkafka {confluent_kafka.libversion()[0]}), aiohttp {version('aiohttp')}, "
        f"fastavro {version('fastavro')}, orjson {version('orjson')}, "
        f"segment-analytics-python {version('segment-analytics-python')}"
    )


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    loadavg = Path("/proc/loadavg")
    load = " ".join(loadavg.read_text().split()[:3]) if loadavg.exists() else "?"
    cpus = len(os.sched_getaffinity(0))
    return (
        f"{cpus} CPUs (nproc), {model}, {platform.system()} {platform.release()}; "
        f"load average at start {load}"
    )


def table(rows: list[Row]) -> str:
    lines = [
        "| # | measure | figure (median) | reference, same run | ratio (median of per-run ratios) "
        "| target | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        met = {True: "yes", False: "**no**", None: ""}[row.met]
        lines.append(
            f"| {row.key} | {row.measure} | {row.figure} | {row.reference} | {row.ratio} | "
            f"{row.target} | {met} |"
        )
    return "\n".join(lines)


def report(bench: Bench, started: float, load: str) -> str:
    today = datetime.date.today().isoformat()
    runs = "\n".join(f"- ({r.key}) {r.measure}: {', '.join(r.runs)}" for r in bench.rows if r.runs)
    notes = "\n".join(f"- {n}" for n in bench.notes)
    sections = ", ".join(f"{k}: {v:.0f} s" for k, v in bench.timings.items())
    return f"""# Benchmark results

`make bench` (`python -m bench`) on {today}, {time.monotonic() - started:.0f} s in all ({sections}).

- Versions: {versions()}.
- Machine: {load}.
- Each figure is the median of {bench.runs} runs (sections 3, 12 and 13: {max(bench.runs, 5)};
  16: {max(bench.runs, 9)}); each ratio is computed per run (ours and its reference back to back)
  and the median of those is shown. The machine is shared: compare ratios.
- One embedded broker (tansu) for everything; receivers are `bench/_receiver.py` (a minimal asyncio
  HTTP/1.1 responder, one process each), serving the raw baselines and the pipeline alike.
- Events/s are counted at the receiver, from its first answer to its last.

{table(bench.rows)}

Per run (ours/reference):
{runs}

Notes:
{notes}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description="The pipeline's benchmarks; see bench/__main__.py")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (median; at least 3)")
    parser.add_argument("--only", default="", help="comma-separated sections, e.g. 1,3,6")
    parser.add_argument("--quick", action="store_true", help="smaller counts (a smoke test)")
    args = parser.parse_args()
    if args.runs < 3 and not args.quick:
        parser.error("--runs: at least 3 (each figure is a median)")
    wanted = [k for k in SECTIONS if not args.only or k in args.only.split(",")]
    started = time.monotonic()
    load = machine()
    with EmbeddedBroker(port=0) as broker:
        bench = Bench(broker.bootstrap_servers, args.runs, args.quick)
        for key in wanted:
            begun = time.monotonic()
            log(f"section {key} ...")
            try:
                SECTIONS[key](bench)
            except Exception as exc:  # keep going: the table shows what failed
                traceback.print_exc()
                bench.rows.append(Row(key, f"section {key} failed", f"{type(exc).__name__}: {exc}"))
            finally:
                end_all()
            bench.timings[key] = time.monotonic() - begun
    text = report(bench, started, load)
    print(table(bench.rows))
    if not args.only and not args.quick:
        RESULTS.write_text(text)
        print(f"\nwritten to {RESULTS}")
    print(f"{time.monotonic() - started:.0f} s in all", file=sys.stderr)


if __name__ == "__main__":
    main()
