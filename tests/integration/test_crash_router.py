"""The router killed mid-stream (SIGKILL) with transactions, with and without dedupe: a crash
doubles at most what one open transaction held (see ``router_crashes``)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from pipeline.core.settings import Settings
from tests.integration.router_crashes import (
    RECEIVER_DELAY,
    TANSU_NOTE,
    TRANSACTIONS_ON,
    TRANSACTIONS_ON_DEDUPE,
    figures,
    kill_router_mid_stream,
    router_bound,
    tansu_transaction_faults_expected,
    topic_figures,
)
from tests.support import (
    Receiver,
)

#: A kill costs a session timeout (3 s) and a group join before the work goes on; the final waits
#: (90 s) fail with the processes' logs before pytest's own timeout does.
pytestmark = pytest.mark.timeout(180)


def test_sigkill_of_the_router_doubles_at_most_one_open_transaction(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    process_factory: Callable[..., subprocess.Popen[bytes]],
) -> None:
    receiver = receiver_factory(delay=RECEIVER_DELAY)
    with tansu_transaction_faults_expected(settings, receiver):
        at_kill, sent = kill_router_mid_stream(settings, receiver, process_factory, TRANSACTIONS_ON)
    bound = router_bound()
    duplicates = figures("SIGKILL router (transactions)", receiver, bound, at_kill, sent)
    on_topic = topic_figures(settings)
    print(f"  {TANSU_NOTE}")
    assert on_topic <= bound
    assert duplicates <= bound


def test_sigkill_of_the_router_with_dedupe_routes_no_call_twice(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    process_factory: Callable[..., subprocess.Popen[bytes]],
) -> None:
    """With dedupe, what the killed router's open transaction routed is in the changelog it
    wrote in the same transaction: the next router, restoring it after taking the transactional
    id over, knows those calls. On Apache Kafka that transaction is aborted and the calls are
    routed once by the next router; on tansu 0.6 it becomes visible (the bound of the test above)
    and the next router drops their copies as resends. Either way: each call routed once."""
    receiver = receiver_factory(delay=RECEIVER_DELAY)
    with tansu_transaction_faults_expected(settings, receiver):
        at_kill, sent = kill_router_mid_stream(
            settings, receiver, process_factory, TRANSACTIONS_ON_DEDUPE
        )
    duplicates = figures("SIGKILL router (transactions, dedupe)", receiver, 0, at_kill, sent)
    assert topic_figures(settings) == 0
    assert duplicates == 0
