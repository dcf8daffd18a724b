"""One of two whole workers SIGKILLed mid-stream: the survivor finishes, nothing is lost (see
``delivery_crashes``)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from pipeline.core.settings import Settings
from tests.integration.delivery_crashes import (
    CALLS,
    DELAY,
    MAX_IN_FLIGHT,
    OPEN_TRANSACTION,
    ROLE_ENV,
    everything,
    figures,
    kill_at_a_third,
    sender,
    worker_bound,
)
from tests.support import (
    Receiver,
    apply,
    ready,
    simple_config,
    started,
)

#: A kill costs a session timeout (3 s) and a group join before the work goes on; the final waits
#: (90 s) fail with the processes' logs before pytest's own timeout does.
pytestmark = pytest.mark.timeout(180)


def test_sigkill_of_one_of_two_workers_the_survivor_finishes(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    process_factory: Callable[..., subprocess.Popen[bytes]],
) -> None:
    receiver = receiver_factory(delay=DELAY)
    apply(settings, simple_config(receiver.url))
    first, first_log = started(process_factory, settings, "worker", ROLE_ENV)
    _, second_log = started(process_factory, settings, "worker", ROLE_ENV)
    # Both own partitions of calls and deliveries before the stream starts, so the kill matters.
    ready(*((log, role) for log in (first_log, second_log) for role in ("router", "deliver")))
    stream = sender(settings)

    at_kill = kill_at_a_third(first, receiver)
    sent = stream.sent
    stream.finish()
    logs = {"killed worker": first_log, "survivor": second_log}
    everything(settings, receiver, logs)

    bound = worker_bound()
    duplicates = figures("SIGKILL one of two workers", receiver, bound, at_kill, sent)
    print(
        f"  bound {bound} = {OPEN_TRANSACTION} (one open router transaction tansu 0.6 lets "
        f"through; 0 on Apache Kafka) + 2 x {MAX_IN_FLIGHT} in flight + one commit interval"
    )
    assert at_kill < CALLS, "every call was delivered before the kill"
    assert duplicates <= bound
