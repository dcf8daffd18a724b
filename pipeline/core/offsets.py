"""Which offset a worker may commit. Pure logic.

Records of a partition finish out of order (one webhook answers in 5 ms, another in 5 s), but the
committed offset says "everything below here is done". So each partition keeps its records in
consumption order and the commit position is one past the highest record below which every record
has finished: the highest contiguous finished offset. A crash then re-delivers what was in flight
(at-least-once) and never skips what was not finished.

    >>> t = PartitionOffsets()
    >>> for offset in (5, 6, 7): t.add(offset)
    >>> t.finish(6); t.position() is None
    True
    >>> t.finish(5); t.position()
    7
"""

from __future__ import annotations

from collections import deque

__all__ = ["PartitionOffsets"]


class PartitionOffsets:
    __slots__ = ("_pending", "_done", "_position", "_committed")

    def __init__(self) -> None:
        self._pending: deque[int] = deque()
        self._done: set[int] = set()
        self._position: int | None = None
        self._committed: int | None = None

    def __len__(self) -> int:
        """Records taken and not yet finished."""
        return len(self._pending) - len(self._done)

    def add(self, offset: int) -> None:
        """Record that ``offset`` was taken for processing (offsets arrive in increasing order)."""
        if self._pending and offset <= self._pending[-1]:
            raise ValueError(f"offset {offset} is not after {self._pending[-1]}")
        self._pending.append(offset)

    def finish(self, offset: int) -> None:
        """Record that ``offset``'s outcome is durable (only offsets added and not forgotten)."""
        pending = self._pending
        if pending and pending[0] == offset:
            pending.popleft()
            self._position = offset + 1
            done = self._done
            while pending and pending[0] in done:
                head = pending.popleft()
                done.discard(head)
                self._position = head + 1
        else:
            self._done.add(offset)

    def forget_from(self, offset: int) -> None:
        """Drop records at and after ``offset`` (they will be consumed again after a seek)."""
        while self._pending and self._pending[-1] >= offset:
            self._done.discard(self._pending.pop())

    def position(self) -> int | None:
        """The offset to commit now, or ``None`` if nothing new finished since the last commit."""
        if self._position is None or self._position == self._committed:
            return None
        return self._position

    def committed(self, position: int) -> None:
        self._committed = position
