"""The deliver role or the retry role SIGKILLed mid-stream: nothing is lost, and the duplicates
stay within what was in flight plus one commit interval (see ``delivery_crashes``)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from pipeline.core.settings import Settings
from tests.integration.delivery_crashes import (
    CALLS,
    DELAY,
    ROLE_ENV,
    delivery_bound,
    everything,
    figures,
    kill_at_a_third,
    sender,
)
from tests.support import (
    Receiver,
    apply,
    by_attempt,
    ready,
    simple_config,
    started,
)

#: A kill costs a session timeout (3 s) and a group join before the work goes on; the final waits
#: (90 s) fail with the processes' logs before pytest's own timeout does.
pytestmark = pytest.mark.timeout(180)


def test_sigkill_of_deliver_doubles_at_most_what_was_in_flight_and_one_interval(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    process_factory: Callable[..., subprocess.Popen[bytes]],
) -> None:
    receiver = receiver_factory(delay=DELAY)
    apply(settings, simple_config(receiver.url))
    _, router_log = started(process_factory, settings, "router")
    deliver, deliver_log = started(process_factory, settings, "deliver", ROLE_ENV)
    ready((router_log, "router"), (deliver_log, "deliver"))
    stream = sender(settings)

    at_kill = kill_at_a_third(deliver, receiver)
    sent = stream.sent
    _, successor_log = started(process_factory, settings, "deliver", ROLE_ENV)
    stream.finish()
    logs = {"router": router_log, "killed deliver": deliver_log, "new deliver": successor_log}
    everything(settings, receiver, logs)

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
    # (3 s) must expire before the next one takes over: a deadline well past the compressed 8 s,
    # and circuits that never open (every attempt of the deliver role fails), keep this about
    # the crash, not about deadlines or circuit breakers.
    settings = settings.replace(retry_deadline=120.0, circuit_failures=1_000_000)
    receiver = receiver_factory(by_attempt(500, then=200), delay=DELAY)
    apply(settings, simple_config(receiver.url))
    _, router_log = started(process_factory, settings, "router")
    _, deliver_log = started(process_factory, settings, "deliver", ROLE_ENV)
    retry, retry_log = started(process_factory, settings, "retry", ROLE_ENV)
    ready((router_log, "router"), (deliver_log, "deliver"), (retry_log, "retry"))
    stream = sender(settings)

    at_kill = kill_at_a_third(retry, receiver)
    sent = stream.sent
    _, successor_log = started(process_factory, settings, "retry", ROLE_ENV)
    stream.finish()
    logs = {
        "router": router_log,
        "deliver": deliver_log,
        "killed retry": retry_log,
        "new retry": successor_log,
    }
    everything(settings, receiver, logs)

    bound = delivery_bound()
    duplicates = figures("SIGKILL retry", receiver, bound, at_kill, sent)
    assert at_kill < CALLS, "every call was delivered before the kill"
    assert duplicates <= bound
