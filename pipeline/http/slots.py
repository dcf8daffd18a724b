"""A host's connection slots: first come, first served, and a waiter can be let go early; and a
destination's ``max_in_flight`` requests out (``OutSlots``).

``WebhookSender`` has at most ``max_connections_per_host`` requests out to one host. A record
waiting for a slot behind a hanging endpoint should not hold its worker's in-flight slot for the
hanging requests' whole timeout, so a waiter gives up once its endpoint falls silent. With an
``asyncio.Semaphore`` that took a timer per waiter (``asyncio.timeout`` every 100 ms, and after
each, the back of the queue again); under load, when every record waits for a slot, those timers
cost the worker a measurable share of its CPU per call. Here one check per host, every
``interval`` while anyone waits, lets go the waiters whose ``give_up()`` says so.

    >>> import asyncio
    >>> async def demo() -> list[bool]:
    ...     slots = Slots(1, interval=0.01)
    ...     first = await slots.acquire()
    ...     late = await slots.acquire(give_up=lambda: True)  # waits, and is let go
    ...     slots.release()
    ...     return [first, late, await slots.acquire()]
    >>> asyncio.run(demo())
    [True, False, True]
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable

from pipeline.core.config import Destination

__all__ = ["Slots", "OutSlots"]

#: Asked while the waiter waits: ``True`` lets it go without a slot.
GiveUp = Callable[[], bool]


class Slots:
    """``count`` slots. Not thread-safe: one event loop uses it."""

    __slots__ = ("_free", "_waiters", "_interval", "_check")

    def __init__(self, count: int, *, interval: float) -> None:
        self._free = count
        self._waiters: deque[tuple[asyncio.Future[bool], GiveUp | None]] = deque()
        self._interval = interval
        self._check: asyncio.TimerHandle | None = None

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *_exc: object) -> None:
        self.release()

    def locked(self) -> bool:
        """Every slot is taken (a new ``acquire`` waits)."""
        return self._free == 0

    async def acquire(self, give_up: GiveUp | None = None) -> bool:
        """Take a slot: ``True``. With ``give_up``, ``False`` (no slot taken) if a check while it
        waits finds ``give_up()`` true. Waiters get slots in the order they came."""
        if self._free:  # a free slot means nobody waits: release hands slots to waiters first
            self._free -= 1
            return True
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        self._waiters.append((future, give_up))
        if give_up is not None and self._check is None:
            self._check = loop.call_later(self._interval, self._let_go)
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.result():
                self.release()  # handed a slot as it was cancelled: the next one gets it
            raise

    def release(self) -> None:
        """Give a slot back: to the first waiter still waiting, else to the free ones."""
        waiters = self._waiters
        while waiters:
            future, _ = waiters.popleft()
            if not future.done():  # not cancelled, not let go
                future.set_result(True)
                return
        self._free += 1

    def _let_go(self) -> None:
        """The periodic check: let go the waiters whose ``give_up()`` is true; again in
        ``interval`` while some that may give up still wait. Each ``give_up`` is asked once a
        check, however many waiters share it (a sender gives all of an endpoint's one)."""
        self._check = None
        verdicts: dict[GiveUp, bool] = {}
        let_go = checked = False
        for future, give_up in self._waiters:
            if give_up is None or future.done():
                continue
            verdict = verdicts.get(give_up)
            if verdict is None:
                verdict = verdicts[give_up] = give_up()
            if verdict:
                future.set_result(False)
                let_go = True
            else:
                checked = True
        if let_go:
            self._waiters = deque(waiter for waiter in self._waiters if not waiter[0].done())
        if checked:
            self._check = asyncio.get_running_loop().call_later(self._interval, self._let_go)


class OutSlots:
    """Each destination's ``max_in_flight`` requests out at a time, in its own ``Slots``: the
    records past it wait for one (how many, ``admission.in_flight_room`` says)."""

    def __init__(self) -> None:
        self._of: dict[str, tuple[int, Slots]] = {}

    def of(self, destination: Destination) -> contextlib.AbstractAsyncContextManager[object]:
        """``destination``'s slots, to hold while its requests are out (none to take: no limit,
        or a batching destination's, which admission counts in calls, not requests)."""
        limit = destination.max_in_flight
        if limit is None or destination.batch is not None:
            return _NO_SLOT
        found = self._of.get(destination.id)
        if found is None or found[0] != limit:  # a new limit: the requests out keep theirs
            found = self._of[destination.id] = (limit, Slots(limit, interval=1.0))
        return found[1]


_NO_SLOT = contextlib.nullcontext()
