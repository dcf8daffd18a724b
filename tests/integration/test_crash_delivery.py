"""The deliver role, the retry role, or a whole worker is SIGKILLed mid-stream: nothing is lost, and
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
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from pipeline.core.settings import Settings
from pipeline.kafka.clients import consumer_config, topics_for
from pipeline.kafka.topic_reader import read_topic
from tests.support import Receiver, apply, by_attempt, send_calls, simple_config, wait_for

#: A kill costs a session timeout (6 s) and a group join before the work goes on; the final waits
#: (90 s) fail with the processes' logs before pytest's own timeout does.
pytestmark = pytest.mark.timeout(180)

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


def all_calls() -> list[dict[str, Any]]:
    return [
        {"type": "track", "userId": f"u{i % 97}", "event": "Crash", "messageId": f"m-{i}"}
        for i in range(CALLS)
    ]


class Sender(threading.Thread):
    """Sends the calls in chunks, in the background."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(daemon=True)
        self.settings = settings
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        calls = all_calls()
        try:
            for start in range(0, len(calls), CHUNK):
                send_calls(self.settings, calls[start : start + CHUNK], "wk")
                self.sent += len(calls[start : start + CHUNK])
        except BaseException as exc:  # surfaced by finish()
            self.error = exc

    def finish(self, timeout: float = 60.0) -> None:
        self.join(timeout)
        assert not self.is_alive(), f"sending did not finish within {timeout} s"
        if self.error is not None:
            raise self.error
        assert self.sent == CALLS


class Stderr:
    """Drains a process's stderr into ``lines`` on a thread (a full pipe would block it)."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.lines: list[str] = []
        self._stream = process.stderr
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        if self._stream is None:
            return
        try:
            for line in iter(self._stream.readline, b""):
                self.lines.append(line.decode(errors="replace").rstrip())
        except (ValueError, OSError):  # closed by the fixture at the end of the test
            pass

    def assigned(self, role: str) -> bool:
        """Whether ``role`` was assigned at least one partition."""
        return any(f"{role}: assigned " in line and "[" in line for line in list(self.lines))


def wait_or_tell(
    predicate: Callable[[], Any],
    timeout: float,
    logs: dict[str, Stderr],
    receiver: Receiver,
    interval: float = 0.05,
) -> None:
    """``wait_for``; when it fails, the message tells the progress and the processes' last lines."""
    try:
        wait_for(predicate, timeout=timeout, interval=interval)
    except AssertionError as exc:
        tails = "".join(
            f"\n--- {name}:\n" + "\n".join(log.lines[-12:]) for name, log in logs.items()
        )
        progress = f"{unique_2xx(receiver)} of {CALLS} delivered, {receiver.count()} requests"
        raise AssertionError(f"{exc}\n{progress}{tails}") from None


def start(
    process_factory: Callable[..., subprocess.Popen[bytes]],
    settings: Settings,
    role: str,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], Stderr]:
    process = process_factory(settings, role, env=env)
    return process, Stderr(process)


def ready(*logs: tuple[Stderr, str]) -> None:
    """Each (process, role) owns partitions: the stream starts only then."""
    wait_for(lambda: all(log.assigned(role) for log, role in logs), timeout=60, interval=0.1)


def delivered_2xx(receiver: Receiver) -> int:
    return len(receiver.delivered())


def unique_2xx(receiver: Receiver) -> int:
    return len({body["messageId"] for body in receiver.delivered()})


def caught_up(settings: Settings, roles: dict[str, list[str]]) -> bool:
    """Each role's group committed the end of the topics it reads: nothing is left to be
    delivered again, so the figures are final."""
    for role, topics in roles.items():
        for topic in topics:
            ends: dict[int, int] = {}
            for record in read_topic(settings, topic):
                partition, offset = record.partition(), record.offset()
                assert partition is not None and offset is not None
                ends[partition] = max(ends.get(partition, 0), offset + 1)
            if not ends:
                continue
            consumer = Consumer(consumer_config(settings, f"{settings.topic_prefix}{role}"))
            try:
                positions = {
                    tp.partition: tp.offset
                    for tp in consumer.committed(
                        [TopicPartition(topic, p) for p in ends], timeout=10
                    )
                }
            finally:
                consumer.close()
            if any(positions.get(p, -1) < end for p, end in ends.items()):
                return False
    return True


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
    seen = Counter(body["messageId"] for body in receiver.delivered())
    duplicates = sum(n - 1 for n in seen.values())
    print(
        f"\n{name}: sent {CALLS}, delivered {len(seen)} unique, {duplicates} duplicates "
        f"(bound {bound}), at kill {at_kill} ({sent} calls sent then; "
        f"max in flight {MAX_IN_FLIGHT}, receiver delay {DELAY:g} s, "
        f"commit interval {COMMIT_INTERVAL:g} s; peak {peak_concurrency(receiver)} requests "
        "at the receiver at once)"
    )
    missing = {f"m-{i}" for i in range(CALLS)} - set(seen)
    assert not missing, f"{len(missing)} calls lost, e.g. {sorted(missing)[:5]}"
    return duplicates


def kill_at_a_third(process: subprocess.Popen[bytes], receiver: Receiver) -> int:
    wait_for(lambda: delivered_2xx(receiver) >= CALLS // 3, timeout=60, interval=0.01)
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    return delivered_2xx(receiver)


def test_sigkill_of_deliver_doubles_at_most_what_was_in_flight_and_one_interval(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    process_factory: Callable[..., subprocess.Popen[bytes]],
) -> None:
    receiver = receiver_factory(delay=DELAY)
    apply(settings, simple_config(receiver.url))
    _, router_log = start(process_factory, settings, "router")
    deliver, deliver_log = start(process_factory, settings, "deliver", ROLE_ENV)
    ready((router_log, "router"), (deliver_log, "deliver"))
    sender = Sender(settings)
    sender.start()

    at_kill = kill_at_a_third(deliver, receiver)
    sent = sender.sent
    _, successor_log = start(process_factory, settings, "deliver", ROLE_ENV)
    sender.finish()
    logs = {"router": router_log, "killed deliver": deliver_log, "new deliver": successor_log}
    wait_or_tell(lambda: unique_2xx(receiver) == CALLS, 90, logs, receiver)
    wait_or_tell(lambda: caught_up(settings, all_roles(settings)), 45, logs, receiver, 0.5)

    bound = delivery_bound()
    duplicates = figures("SIGKILL deliver", receiver, bound, at_kill, sent)
    assert at_kill < CALLS, "every call was delivered before the kill"
    assert duplicates <= bound


def test_sigkill_of_retry_doubles_at_most_what_was_in_flight_and_one_interval(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    process_factory: Callable[..., subprocess.Popen[bytes]],
) -> None:
    # Every first attempt fails, so every call goes through tier 0. The killed member's session
    # (6 s) must expire before the next one takes over: a deadline well past the compressed 8 s,
    # and circuits that never open (every attempt of the deliver role fails), keep this about
    # the crash, not about deadlines or circuit breakers.
    settings = settings.replace(retry_deadline=120.0, circuit_failures=1_000_000)
    receiver = receiver_factory(by_attempt(500, then=200), delay=DELAY)
    apply(settings, simple_config(receiver.url))
    _, router_log = start(process_factory, settings, "router")
    _, deliver_log = start(process_factory, settings, "deliver", ROLE_ENV)
    retry, retry_log = start(process_factory, settings, "retry", ROLE_ENV)
    ready((router_log, "router"), (deliver_log, "deliver"), (retry_log, "retry"))
    sender = Sender(settings)
    sender.start()

    at_kill = kill_at_a_third(retry, receiver)
    sent = sender.sent
    _, successor_log = start(process_factory, settings, "retry", ROLE_ENV)
    sender.finish()
    logs = {
        "router": router_log,
        "deliver": deliver_log,
        "killed retry": retry_log,
        "new retry": successor_log,
    }
    wait_or_tell(lambda: unique_2xx(receiver) == CALLS, 90, logs, receiver)
    wait_or_tell(lambda: caught_up(settings, all_roles(settings)), 45, logs, receiver, 0.5)

    bound = delivery_bound()
    duplicates = figures("SIGKILL retry", receiver, bound, at_kill, sent)
    assert at_kill < CALLS, "every call was delivered before the kill"
    assert duplicates <= bound


def test_sigkill_of_one_of_two_workers_the_survivor_finishes(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    process_factory: Callable[..., subprocess.Popen[bytes]],
) -> None:
    receiver = receiver_factory(delay=DELAY)
    apply(settings, simple_config(receiver.url))
    first, first_log = start(process_factory, settings, "worker", ROLE_ENV)
    _, second_log = start(process_factory, settings, "worker", ROLE_ENV)
    # Both own partitions of calls and deliveries before the stream starts, so the kill matters.
    ready(*((log, role) for log in (first_log, second_log) for role in ("router", "deliver")))
    sender = Sender(settings)
    sender.start()

    at_kill = kill_at_a_third(first, receiver)
    sent = sender.sent
    sender.finish()
    logs = {"killed worker": first_log, "survivor": second_log}
    wait_or_tell(lambda: unique_2xx(receiver) == CALLS, 90, logs, receiver)
    wait_or_tell(lambda: caught_up(settings, all_roles(settings)), 45, logs, receiver, 0.5)

    bound = worker_bound()
    duplicates = figures("SIGKILL one of two workers", receiver, bound, at_kill, sent)
    print(
        f"  bound {bound} = {OPEN_TRANSACTION} (one open router transaction tansu 0.6 lets "
        f"through; 0 on Apache Kafka) + 2 x {MAX_IN_FLIGHT} in flight + one commit interval"
    )
    assert at_kill < CALLS, "every call was delivered before the kill"
    assert duplicates <= bound
