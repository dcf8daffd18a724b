"""What the delivery crash tests share (``test_crash_delivery.py``, ``test_crash_worker.py``).

The deliver role, the retry role, or a whole worker is SIGKILLed mid-stream: nothing is lost, and
the duplicates stay within what was in flight plus what finished within one commit interval.

Each test prints ``sent N, delivered U unique, D duplicates (bound B), at kill K`` (``pytest -s``).

The receiver answers after ``DELAY`` seconds and each delivery role holds at most ``MAX_IN_FLIGHT``
records unfinished, so (Little's law) a role finishes at most ``MAX_IN_FLIGHT / DELAY`` records a
second. A kill delivers again what was in flight (``MAX_IN_FLIGHT``) plus what finished since the
last commit: one ``COMMIT_INTERVAL`` and a commit's round trip (``COMMIT_ROUND_TRIP``).
"""

from __future__ import annotations

import math
import signal
import subprocess

from pipeline.core.settings import Settings
from pipeline.kafka.clients import topics_for
from tests.support import (
    ChunkedSender,
    Receiver,
    Stderr,
    caught_up,
    crash_calls,
    delivery_figures,
    positions,
    unique_delivered,
    wait_for,
    wait_or_tell,
)

CALLS = 3000
#: Sent in three chunks (about 1 s each): faster than the delivery roles finish them, so the
#: roles, bounded by the receiver's delay, make the stream last several seconds.
CHUNK = 1000
MAX_IN_FLIGHT = 50
DELAY = 0.1
COMMIT_INTERVAL = 0.1
COMMIT_ROUND_TRIP = 0.2
ROLE_ENV = {
    "PIPELINE_MAX_IN_FLIGHT": str(MAX_IN_FLIGHT),
    "PIPELINE_COMMIT_INTERVAL": f"{int(COMMIT_INTERVAL * 1000)}ms",
}
#: What one router transaction can hold (one consume batch): tansu 0.6 lets a killed router's open
#: transaction through once the next owner initialises its id; on Apache Kafka this is 0.
OPEN_TRANSACTION = 500


def delivery_bound(max_in_flight: int = MAX_IN_FLIGHT, delay: float = DELAY) -> int:
    """Duplicates a killed delivery role may cause: in flight, plus what finished within one
    commit interval and a commit round trip at the most it can finish a second."""
    finished_per_second = max_in_flight / delay
    # round(): 500 * 0.30000000000000004 must not make 151.
    return max_in_flight + math.ceil(
        round(finished_per_second * (COMMIT_INTERVAL + COMMIT_ROUND_TRIP), 6)
    )


def worker_bound(max_in_flight: int = MAX_IN_FLIGHT, delay: float = DELAY) -> int:
    """A whole worker: its router's open transaction (tansu), what its deliver and retry roles
    held, and one commit interval's worth."""
    return OPEN_TRANSACTION + max_in_flight + delivery_bound(max_in_flight, delay)


def sender(settings: Settings) -> ChunkedSender:
    """The stream: ``CALLS`` calls in chunks of ``CHUNK``, started."""
    stream = ChunkedSender(settings, crash_calls(CALLS), CHUNK)
    stream.start()
    return stream


def everything(settings: Settings, receiver: Receiver, logs: dict[str, Stderr]) -> None:
    """Wait until every call is delivered and every group committed the end of its topics."""

    topics = topics_for(settings)

    def progress() -> str:
        return (
            f"{unique_delivered(receiver)} of {CALLS} delivered, {receiver.count()} requests\n"
            + positions(settings, {"router": topics.calls, "deliver": topics.deliveries})
        )

    wait_or_tell(lambda: unique_delivered(receiver) == CALLS, 90, logs, progress)
    wait_or_tell(lambda: caught_up(settings, all_roles(settings)), 45, logs, progress, 0.5)


def all_roles(settings: Settings) -> dict[str, list[str]]:
    topics = topics_for(settings)
    return {
        "router": [topics.calls],
        "deliver": [topics.deliveries],
        "retry": list(topics.retry),
    }


def peak_concurrency(receiver: Receiver) -> int:
    """The most requests the receiver held at once (each is held ``DELAY`` seconds)."""
    with receiver.lock:
        arrivals = sorted(request.at for request in receiver.requests)
    peak, first = 0, 0
    for last, at in enumerate(arrivals):
        while arrivals[first] <= at - DELAY:
            first += 1
        peak = max(peak, last - first + 1)
    return peak


def figures(name: str, receiver: Receiver, bound: int, at_kill: int, sent: int) -> int:
    """Prints the figures and checks nothing was lost; returns the duplicates among the
    receiver's 2xx answers."""
    details = (
        f"{sent} calls sent then; max in flight {MAX_IN_FLIGHT}, receiver delay {DELAY:g} s, "
        f"commit interval {COMMIT_INTERVAL:g} s; peak {peak_concurrency(receiver)} requests "
        "at the receiver at once"
    )
    return delivery_figures(name, receiver, CALLS, bound, at_kill, details)


def kill_at_a_third(process: subprocess.Popen[bytes], receiver: Receiver) -> int:
    wait_for(lambda: len(receiver.delivered()) >= CALLS // 3, timeout=60, interval=0.01)
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    return len(receiver.delivered())
