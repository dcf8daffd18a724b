"""``Slots``: a host's connection slots, first come first served, with waiters let go early;
``OutSlots``: a destination's ``max_in_flight``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from pipeline.core.config import Batch, Destination
from pipeline.http.slots import OutSlots, Slots


def run(test: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(test(), timeout=10))


async def settle() -> None:
    """Let every ready task take its step."""
    for _ in range(5):
        await asyncio.sleep(0)


def test_waiters_get_slots_in_the_order_they_came() -> None:
    async def test() -> list[str]:
        slots = Slots(1, interval=0.01)
        assert await slots.acquire() and slots.locked()
        order: list[str] = []

        async def wait(name: str) -> None:
            assert await slots.acquire(give_up=lambda: False)
            order.append(name)

        tasks = [asyncio.create_task(wait(name)) for name in "abc"]
        await asyncio.sleep(0.05)  # several checks pass: none gives up, none loses its place
        for _ in "abc":
            slots.release()
            await settle()
        await asyncio.gather(*tasks)
        return order

    assert run(test) == ["a", "b", "c"]


def test_a_waiter_that_gives_up_takes_no_slot_and_the_others_keep_theirs() -> None:
    async def test() -> None:
        slots = Slots(1, interval=0.01)
        await slots.acquire()
        silent = asyncio.Event()
        quitter = asyncio.create_task(slots.acquire(give_up=silent.is_set))
        patient = asyncio.create_task(slots.acquire(give_up=lambda: False))
        await asyncio.sleep(0.05)
        assert not quitter.done() and not patient.done()
        silent.set()
        assert await asyncio.wait_for(quitter, 1) is False  # let go within a check or two
        assert not patient.done()
        slots.release()  # the one slot goes to the waiter still waiting
        assert await asyncio.wait_for(patient, 1) is True
        assert slots.locked()
        slots.release()
        assert not slots.locked()

    run(test)


def test_a_waiter_without_give_up_waits_for_a_slot_whatever_the_checks_find() -> None:
    async def test() -> None:
        slots = Slots(1, interval=0.01)
        await slots.acquire()
        final = asyncio.create_task(slots.acquire())
        quitter = asyncio.create_task(slots.acquire(give_up=lambda: True))
        assert await asyncio.wait_for(quitter, 1) is False
        await asyncio.sleep(0.05)
        assert not final.done()
        slots.release()
        assert await asyncio.wait_for(final, 1) is True

    run(test)


def test_a_cancelled_waiter_takes_no_slot() -> None:
    async def test() -> None:
        slots = Slots(1, interval=0.01)
        await slots.acquire()
        gone = asyncio.create_task(slots.acquire(give_up=lambda: False))
        after = asyncio.create_task(slots.acquire())
        await settle()
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        slots.release()  # skips the cancelled waiter
        assert await asyncio.wait_for(after, 1) is True
        slots.release()
        assert not slots.locked()  # and the count is whole again
        assert await slots.acquire() and slots.locked()

    run(test)


def test_a_waiter_cancelled_as_it_is_handed_a_slot_passes_it_on() -> None:
    async def test() -> None:
        slots = Slots(1, interval=0.01)
        await slots.acquire()
        first = asyncio.create_task(slots.acquire())
        second = asyncio.create_task(slots.acquire())
        await settle()
        slots.release()  # handed to ``first`` ...
        first.cancel()  # ... which is cancelled before it runs again
        with pytest.raises(asyncio.CancelledError):
            await first
        assert await asyncio.wait_for(second, 1) is True
        slots.release()
        assert not slots.locked()

    run(test)


def test_many_waiters_and_releases_keep_the_count() -> None:
    async def test() -> None:
        slots = Slots(3, interval=0.005)
        held = 0
        most = 0

        async def use(n: int) -> None:
            nonlocal held, most
            if not await slots.acquire(give_up=lambda: n % 7 == 0):
                return
            held += 1
            most = max(most, held)
            await asyncio.sleep(0.001 * (n % 3))
            held -= 1
            slots.release()

        await asyncio.gather(*(use(n) for n in range(200)))
        assert most == 3 and held == 0
        for _ in range(3):
            assert await slots.acquire()
        assert slots.locked()

    run(test)


def test_waiters_sharing_a_give_up_are_judged_by_one_call_a_check() -> None:
    """An endpoint's waiters share its ``give_up``: a check asks it once, not once a waiter,
    and lets them all go together."""

    async def test() -> None:
        slots = Slots(1, interval=0.01)
        await slots.acquire()
        calls: list[bool] = []
        silent = False

        def give_up() -> bool:
            calls.append(silent)
            return silent

        waiters = [asyncio.create_task(slots.acquire(give_up=give_up)) for _ in range(50)]
        other = asyncio.create_task(slots.acquire(give_up=lambda: False))
        await asyncio.sleep(0.055)
        checks = len(calls)
        assert 1 <= checks <= 10, f"{checks} calls in some 5 checks of 50 waiters"
        silent = True
        assert await asyncio.wait_for(asyncio.gather(*waiters), 1) == [False] * 50
        assert len(calls) <= checks + 2  # one check let all 50 go
        assert not other.done()
        slots.release()
        assert await asyncio.wait_for(other, 1) is True

    run(test)


HOOKS = Destination(id="hooks", sources=["s"], webhooks=[{"url": "https://a.example/"}])  # type: ignore[list-item]


def test_a_destinations_max_in_flight_is_held_while_its_requests_are_out() -> None:
    out = OutSlots()
    limited = HOOKS.model_copy(update={"max_in_flight": 2})
    assert isinstance(out.of(HOOKS), contextlib.nullcontext)  # no limit: nothing to take
    batching = limited.model_copy(update={"batch": Batch(max_events=2)})
    assert isinstance(out.of(batching), contextlib.nullcontext)  # counted in calls, not here
    slots = out.of(limited)
    assert isinstance(slots, Slots) and out.of(limited) is slots
    assert out.of(limited.model_copy(update={"max_in_flight": 3})) is not slots  # a new limit
    order: list[str] = []

    async def request(name: str, slots: Any) -> None:
        async with slots:
            order.append(f"{name} out")
            await asyncio.sleep(0.01)
            order.append(f"{name} answered")

    async def three() -> None:
        slots = OutSlots().of(limited)
        await asyncio.gather(*(request(name, slots) for name in "abc"))

    run(three)
    assert order.index("c out") > min(order.index("a answered"), order.index("b answered"))
