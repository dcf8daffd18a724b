"""The router killed without transactions, and a router stopped (SIGSTOP) as a zombie: nothing
is lost (see ``router_crashes``)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable

import pytest

from pipeline.core.settings import Settings
from tests.integration.router_crashes import (
    CALLS,
    OPEN_TRANSACTION,
    RECEIVER_DELAY,
    TRANSACTIONS_OFF,
    delivery_records,
    everything,
    figures,
    kill_router_mid_stream,
    progress,
    streamed_a_third,
    topic_figures,
)
from tests.support import (
    Receiver,
    started,
    stays,
    wait_or_tell,
)

#: A kill costs a session timeout (3 s) and a group join before the work goes on; the final waits
#: (90 s) fail with the processes' logs before pytest's own timeout does.
pytestmark = pytest.mark.timeout(180)


def test_sigkill_of_the_router_without_transactions_loses_nothing(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    process_factory: Callable[..., subprocess.Popen[bytes]],
) -> None:
    receiver = receiver_factory(delay=RECEIVER_DELAY)
    at_kill, sent = kill_router_mid_stream(settings, receiver, process_factory, TRANSACTIONS_OFF)
    figures("SIGKILL router (transactions off)", receiver, None, at_kill, sent)
    topic_figures(settings)
    print("  transactions off: no bound; compare with the transactional run")


def test_a_stopped_router_resumed_after_its_successor_took_over_stops_producing(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    process_factory: Callable[..., subprocess.Popen[bytes]],
) -> None:
    """A router stopped (SIGSTOP) mid-stream is a zombie once its session expired and another
    took its partitions over. Resumed, it learns that it lost them and produces nothing more;
    nothing is lost, and what is doubled is bounded by what it held.

    Run without transactions: on tansu 0.6 a stopped producer's open transaction holds the
    deliveries topic's read_committed readers back for good (seen in CI: half of each partition
    present and never visible), which Apache Kafka ends when the successor takes the id. The
    fencing of a zombie's transactions is shown deterministically in test_transactions.py."""
    receiver = receiver_factory(delay=RECEIVER_DELAY)
    streamed = streamed_a_third(settings, receiver, process_factory, TRANSACTIONS_OFF)
    zombie, zombie_log, deliver_log, stream = streamed
    zombie.send_signal(signal.SIGSTOP)
    at_stop, sent = receiver.count(), stream.sent
    assert sent < CALLS, "the stream ended before the stop: pace it slower"

    # B takes over once A's session (3 s) timed out.
    _, successor_log = started(process_factory, settings, "router", TRANSACTIONS_OFF)
    logs = {"stopped router": zombie_log, "deliver": deliver_log, "new router": successor_log}
    told = progress(receiver, settings)
    wait_or_tell(lambda: successor_log.assigned("router"), 60, logs, told, 0.1)
    zombie.send_signal(signal.SIGCONT)
    stream.finish()
    wait_or_tell(lambda: zombie_log.has("lost"), 30, logs, told, 0.1)
    seen = next(line for line in zombie_log.lines if "lost" in line)
    everything(settings, receiver, logs)
    before = sum(delivery_records(settings).values())
    unchanged = stays(lambda: sum(delivery_records(settings).values()) == before, seconds=3.0)

    # The batch it was routing when stopped (finished after the resume) and the same calls
    # routed again by the successor from the last commit.
    bound = 2 * OPEN_TRANSACTION
    duplicates = figures("SIGSTOP router, successor, SIGCONT", receiver, bound, at_stop, sent)
    topic_figures(settings)
    print(f"  zombie: {seen[-160:]}")
    assert unchanged, "the resumed router went on producing delivery records"
    assert duplicates <= bound
