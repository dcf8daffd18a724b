"""``DeliveryQueue``, branch by branch: no threads, no sockets, a hand-moved clock."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.client import Backoff, ClientClosed, DeliveryError, QueueFull
from pipeline.client._messages import Queued, build_message, prepare
from pipeline.client._options import ClientOptions
from pipeline.client._queue import (
    Admission,
    DeliveryQueue,
    GiveUp,
    Retry,
    Sending,
    Wait,
    as_delivery_error,
)


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make(**options: Any) -> tuple[DeliveryQueue, Clock]:
    clock = Clock()
    options.setdefault("backoff", Backoff(jitter=0.0))
    return DeliveryQueue(ClientOptions.build("wk", **options), clock=clock), clock


def item(n: int = 0) -> Queued:
    return prepare(build_message("track", user_id=f"u{n}", event="E"), event_time=0)


def fill(queue: DeliveryQueue, count: int) -> list[Queued]:
    items = [item(n) for n in range(count)]
    for one in items:
        queue.put(one)
    return items


# ---- enqueue ------------------------------------------------------------------------------------


def test_put_wakes_the_worker_for_the_first_call_and_at_flush_at_only() -> None:
    queue, _ = make(flush_at=3)
    assert [queue.put(item(n)) for n in range(4)] == [
        Admission.WAKE,
        Admission.QUEUED,
        Admission.WAKE,
        Admission.QUEUED,
    ]
    assert (len(queue), queue.accepted, queue.dropped) == (4, 4, 0)


def test_a_full_queue_refuses_and_counts_the_drop() -> None:
    queue, _ = make(max_queue_size=2)
    fill(queue, 2)
    assert queue.put(item()) is Admission.QUEUE_FULL
    assert (len(queue), queue.accepted, queue.dropped) == (2, 2, 1)
    error = queue.refusal(Admission.QUEUE_FULL)
    assert isinstance(error, QueueFull) and error.limit == 2


def test_a_closed_queue_refuses_everything() -> None:
    queue, _ = make()
    queue.closed = True
    assert queue.put(item()) is Admission.CLOSED
    assert queue.dropped == 1 and len(queue) == 0
    assert isinstance(queue.refusal(Admission.CLOSED), ClientClosed)


# ---- take a batch or wait -----------------------------------------------------------------------


def test_an_empty_queue_waits_until_woken_and_stops_when_stopping() -> None:
    queue, _ = make()
    queue.flush_requested = True
    assert queue.next_batch() == Wait(None)
    assert queue.flush_requested is False  # nothing to flush: the request is done
    queue.stop(abandon=False)
    assert queue.next_batch() is None


def test_flush_after_counts_from_the_oldest_call() -> None:
    queue, clock = make(flush_after=5.0)
    clock.now += 60  # idle for a minute: the timer starts at the first call, not the last flush
    queue.put(item())
    clock.now += 2
    queue.put(item())
    assert queue.next_batch() == Wait(3.0)
    clock.now += 3
    assert len(queue.next_batch() or []) == 2


def test_the_flush_after_timer_restarts_after_every_batch() -> None:
    queue, clock = make(flush_after=5.0, flush_at=2)
    fill(queue, 2)
    clock.now += 1
    assert isinstance(queue.next_batch(), list)  # flush_at: at once
    clock.now += 1
    queue.put(item())
    clock.now += 1
    assert queue.next_batch() == Wait(4.0)  # 5 s from the call after the batch


def test_flush_at_a_flush_request_or_stopping_take_everything_at_once() -> None:
    for reason in ("flush_at", "flush", "stopping"):
        queue, _ = make(flush_at=3)
        items = fill(queue, 3 if reason == "flush_at" else 2)
        if reason == "flush":
            queue.request_flush()
        elif reason == "stopping":
            queue.stop(abandon=False)
        assert queue.next_batch() == items, reason
        assert len(queue) == 0 and queue.flush_requested is False


def test_an_abandoned_queue_stops_even_with_calls_left_and_drain_gives_them_up() -> None:
    queue, _ = make()
    items = fill(queue, 2)
    queue.stop(abandon=True)
    assert queue.next_batch() is None
    gave_up = queue.drain()
    assert gave_up is not None and gave_up.items == items
    assert isinstance(gave_up.error, ClientClosed)
    assert str(gave_up.error) == "closed with 2 calls queued"
    assert (queue.failed, queue.finished, len(queue)) == (2, 2, 0)
    assert queue.drain() is None


# ---- flush accounting ---------------------------------------------------------------------------


def test_a_flush_waits_for_the_calls_queued_before_it_only() -> None:
    queue, _ = make()
    fill(queue, 2)
    mark = queue.request_flush()
    assert queue.flush_requested and not queue.flushed(mark) and queue.unfinished(mark) == 2
    batch = queue.next_batch()
    assert isinstance(batch, list)
    fill(queue, 1)  # after the flush began: not waited for
    queue.delivered(Sending(batch))
    assert queue.flushed(mark) and queue.all_delivered(mark)
    assert (queue.sent, queue.batches) == (2, 1)


def test_a_flush_of_nothing_is_done_at_once_and_asks_for_no_batch() -> None:
    queue, _ = make()
    mark = queue.request_flush()
    assert queue.flushed(mark) and queue.all_delivered(mark) and not queue.flush_requested


def test_a_flush_with_a_failure_is_finished_but_not_all_delivered() -> None:
    queue, _ = make(max_retries=0)
    items = fill(queue, 1)
    mark = queue.request_flush()
    queue.next_batch()
    queue.refused(Sending(items), DeliveryError("HTTP 503", retryable=True))
    assert queue.flushed(mark) and not queue.all_delivered(mark)


# ---- retries ------------------------------------------------------------------------------------


def test_a_retryable_error_is_retried_with_backoff_until_max_retries() -> None:
    queue, _ = make(max_retries=2)
    items = fill(queue, 2)
    sending = Sending(items)
    error = DeliveryError("HTTP 503", retryable=True)
    assert queue.refused(sending, error) == Retry(0.25)
    assert queue.refused(sending, error) == Retry(0.5)
    gave_up = queue.refused(sending, error)
    assert gave_up == GiveUp(items, error)
    assert (queue.failed, queue.sent, queue.finished) == (2, 0, 2)


def test_retry_after_sets_the_delay() -> None:
    queue, _ = make()
    sending = Sending(fill(queue, 1))
    error = DeliveryError("HTTP 429", retryable=True, retry_after=7.0)
    assert queue.refused(sending, error) == Retry(7.0)


def test_a_permanent_error_is_given_up_at_once() -> None:
    queue, _ = make(max_retries=10)
    sending = Sending(fill(queue, 1))
    error = DeliveryError("HTTP 400", retryable=False, status=400)
    step = queue.refused(sending, error)
    assert isinstance(step, GiveUp) and step.error is error and queue.failed == 1


def test_a_partial_delivery_counts_the_delivered_part_and_retries_the_rest() -> None:
    queue, _ = make()
    items = fill(queue, 3)
    sending = Sending(items)
    error = DeliveryError("Kafka refused 1 of 3", retryable=True, pending=[items[1]])
    assert isinstance(queue.refused(sending, error), Retry)
    assert list(sending.pending) == [items[1]]
    assert (queue.sent, queue.finished, queue.batches) == (2, 2, 0)
    queue.delivered(sending)
    assert (queue.sent, queue.finished, queue.batches) == (3, 3, 1)


def test_an_abandoned_client_gives_up_before_the_next_try() -> None:
    queue, clock = make()
    sending = Sending(fill(queue, 2))
    assert queue.before_try(sending) is None and sending.started == clock.now
    queue.stop(abandon=True)
    gave_up = queue.before_try(sending)
    assert gave_up is not None and isinstance(gave_up.error, ClientClosed)
    assert str(gave_up.error) == "closed before these calls were sent"
    assert queue.failed == 2


def test_an_unexpected_transport_failure_is_retryable() -> None:
    error = as_delivery_error(OSError("boom"))
    assert error.retryable and str(error) == "OSError: boom"
    given = DeliveryError("HTTP 400", retryable=False)
    assert as_delivery_error(given) is given


@pytest.mark.parametrize("max_retries", [0, 1])
def test_max_retries_counts_retries_after_the_first_try(max_retries: int) -> None:
    queue, _ = make(max_retries=max_retries)
    sending = Sending(fill(queue, 1))
    error = DeliveryError("HTTP 503", retryable=True)
    steps = [queue.refused(sending, error) for _ in range(max_retries + 1)]
    assert [type(step) for step in steps] == [Retry] * max_retries + [GiveUp]
