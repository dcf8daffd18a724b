"""Section 12 of ``make bench``: the router's resend memory (``PIPELINE_DEDUPE_WINDOW``).

- one ``pipeline router`` alone turning a backlog of calls into delivery records, dedupe on
  against off (same run, alternated; transactions off, as on this broker by default);
- end to end, one ``pipeline worker``, dedupe on against off (same run, alternated);
- restoring one partition's state of ``--restore-keys`` keys (1,000,000) from its changelog into
  an empty local store: seconds, and the store's size on disk.

Run alone: ``python -m bench --only 12``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer

from pipeline.kafka.clients import producer_config
from pipeline.kafka.partition_state import PartitionState, encode_value

from ._harness import LOG_DIR, Deployment, Receiver, Worker

__all__ = ["section_dedupe"]


def section_dedupe(
    bench: Any,
    *,
    router_rate: Callable[[Deployment, int], float],
    pipeline_rate: Callable[[Receiver, Deployment, str, int], float],
    warm_up: Callable[[Receiver, Deployment, str], None],
    row: Callable[..., Any],
    fmt: Callable[..., str],
    median: Callable[[list[float]], float],
    log: Callable[[str], None],
) -> None:
    calls = bench.n(50000)
    e2e_calls = bench.n(20000)
    receiver = Receiver()
    modes = {
        "on": Deployment(bench.bootstrap, "dedupe-on"),
        "off": Deployment(bench.bootstrap, "dedupe-off"),
    }
    window = {"on": "24h", "off": "off"}
    routers: dict[str, list[float]] = {"on": [], "off": []}
    e2e: dict[str, list[float]] = {"on": [], "off": []}
    workers: dict[str, Worker] = {}
    try:
        for mode, deployment in modes.items():
            deployment.apply({"s": [("d1", [receiver.url()])]})
            env = deployment.env(PIPELINE_DEDUPE_WINDOW=window[mode])
            workers[mode] = Worker("router", env, f"dedupe-router-{mode}")
        runs = max(bench.runs, 5)  # a run's ratio spreads 0.8-1.1 on this machine
        for run in range(-1, runs):  # run -1: the group joined
            for mode in ("on", "off") if run % 2 == 0 else ("off", "on"):
                rate = router_rate(modes[mode], 100 if run < 0 else calls)
                if run >= 0:
                    routers[mode].append(rate)
            if run >= 0:
                log(
                    f"12 run {run + 1}: router dedupe on {routers['on'][-1]:,.0f}/s, "
                    f"off {routers['off'][-1]:,.0f}/s"
                )
        for worker in workers.values():
            worker.stop()
        workers.clear()
        for mode, deployment in modes.items():
            env = deployment.env(PIPELINE_DEDUPE_WINDOW=window[mode])
            workers[mode] = Worker("worker", env, f"dedupe-worker-{mode}")
            warm_up(receiver, deployment, "s")
        for run in range(runs):
            for mode in ("on", "off") if run % 2 == 0 else ("off", "on"):
                e2e[mode].append(pipeline_rate(receiver, modes[mode], "s", e2e_calls))
            log(
                f"12 run {run + 1}: end to end dedupe on {e2e['on'][-1]:,.0f}/s, "
                f"off {e2e['off'][-1]:,.0f}/s"
            )
    finally:
        for worker in workers.values():
            worker.stop()
        receiver.stop()
    keys = bench.n(1_000_000)
    seconds, disk = restore_time(modes["on"], keys)
    log(f"12: restored {keys:,} keys in {seconds:.1f} s, {disk / 1e6:.0f} MB on disk")

    def on_against_off(measure: str, rates: dict[str, list[float]]) -> Any:
        """A row of dedupe on against off, the ratio the median of the runs' ratios."""
        pairs = list(zip(rates["on"], rates["off"], strict=True))
        ratio = median([on / off for on, off in pairs])
        return row(
            "12",
            measure,
            fmt(median(rates["on"])),
            f"dedupe off: {fmt(median(rates['off']))}",
            fmt(ratio),
            "≥ 0.9",
            ratio >= 0.9,
            [f"{on:,.0f}/{off:,.0f}" for on, off in pairs],
        )

    bench.rows += [
        on_against_off(
            f"one `pipeline router` alone, {calls:,} calls backlog, dedupe on (calls/s)", routers
        ),
        on_against_off(
            f"end to end, one `pipeline worker`, {e2e_calls:,} calls, dedupe on (events/s)", e2e
        ),
        row(
            "12",
            f"restore one partition's dedupe state of {keys:,} keys from its changelog into an "
            "empty local store (seconds; reference: its size on disk)",
            fmt(seconds, " s"),
            f"{disk / 1e6:.0f} MB on disk ({disk / keys:.0f} bytes a key)",
            "",
            "reported",
            None,
        ),
    ]


def restore_time(deployment: Deployment, keys: int) -> tuple[float, int]:
    """Write ``keys`` seen messageIds to partition 0 of the deployment's dedupe changelog as the
    router does (a batch of 500 calls at a time), then restore them into an empty store:
    (seconds, bytes on disk)."""
    settings = deployment.settings
    changelog = deployment.topics.changelog("dedupe")
    retention = 24 * 3600.0 + 3600.0
    producer = Producer(producer_config(settings, **{"linger.ms": 50}))
    writer = PartitionState(
        settings,
        changelog=changelog,
        directory=tempfile.mkdtemp(prefix="written-", dir=LOG_DIR),
        retention=retention,
    )
    writer.assigned([0], restore=False)
    value = encode_value(int(time.time() * 1000))
    for n in range(keys):
        writer.stage(0, f"s\x00{uuid.uuid4()}".encode(), value)  # random, as messageIds are
        if n % 500 == 499 or n == keys - 1:
            changes = writer.take(0)
            assert changes is not None
            for topic, key, change, _, partition in changes.records:
                while True:
                    try:
                        producer.produce(topic, change, key, partition=partition)
                        break
                    except BufferError:  # the producer's queue is full: let it drain
                        producer.poll(0.05)
            writer.discard(0)
            producer.poll(0)
    producer.flush(120)
    writer.close()
    directory = tempfile.mkdtemp(prefix="restore-", dir=LOG_DIR)
    state = PartitionState(settings, changelog=changelog, directory=directory, retention=retention)
    try:
        started = time.monotonic()
        state.assigned([0])
        seconds = time.monotonic() - started
    finally:
        state.close()
    disk = sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(directory)
        for name in names
    )
    shutil.rmtree(directory, ignore_errors=True)
    return seconds, disk
