"""The router's memory of the calls it routed: a call whose (source, ``messageId``) it already
routed within ``PIPELINE_DEDUPE_WINDOW`` is a resend, and is dropped (reason ``duplicate``).

Senders resend: an SDK whose batch got no answer sends it again although the API may have
accepted it, and a source that replays a file sends its calls again. Segment drops such resends
by ``messageId`` for 24 hours; so does this, per source (two sources may use the same id).

Where it holds: calls are keyed by ``userId`` (else ``anonymousId``), so a resend lands on the
partition its first copy did, whose state remembers it. A resend with another user id lands
elsewhere and is not recognised. ``delete`` calls are never dropped as resends: a deletion
request repeated must still reach the receivers.

The memory is ``pipeline.kafka.partition_state`` (a RocksDB store per partition of ``calls``,
with a changelog topic). With router transactions the changelog records go in the same
transaction as the routed records and the consumed offset: a router killed at any moment neither
forgets a call it routed nor remembers one it did not. Without them, the routed records are
acknowledged first and the changelog records after: a router killed in between routes those
calls again after its restart (as it always did), and one killed after them drops its
re-consumed calls as the resends they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from pipeline.core.calls import Call, CallType
from pipeline.kafka.partition_state import Changes, PartitionState, encode_value

__all__ = ["Dedupe", "dedupe_key"]


def dedupe_key(call: Call) -> bytes:
    """The key a call is remembered by: its source and its ``messageId``."""
    return f"{call.source_id}\x00{call.message_id}".encode()


#: The state keeps a call this much longer than the window: a router running late still knows a
#: resend received within the window of its first copy.
MARGIN = 3600.0


class Dedupe:
    """Resends recognised per input partition, from ``state`` (whose retention is the window
    and ``MARGIN``): a call received within ``window`` seconds of its first copy is a resend,
    however late the router reads it."""

    def __init__(self, state: PartitionState, window: float) -> None:
        self.state = state
        self._window_ms = int(window * 1000)

    def first_seen(self, calls: Sequence[tuple[int, Call] | None], now_ms: int) -> list[int | None]:
        """For each (input partition, call): when the call was first received if it is a resend
        (epoch ms), else ``None``, and the call is staged as routed now (a copy received past
        the window of the first starts a window of its own). ``None`` items (records
        that are not calls) and ``delete`` calls are never resends."""
        by_partition: dict[int, list[tuple[int, bytes, Call]]] = {}
        for index, item in enumerate(calls):
            if item is not None and item[1].type is not CallType.DELETE:
                partition, call = item
                by_partition.setdefault(partition, []).append((index, dedupe_key(call), call))
        found: list[int | None] = [None] * len(calls)
        for partition, items in by_partition.items():
            known = self.state.get_many(partition, [key for _, key, _ in items], now_ms)
            here: dict[bytes, int] = {}  # this batch's own first copies
            for (index, key, call), seen in zip(items, known, strict=True):
                first = seen[0] if seen is not None else here.get(key)
                if first is not None and call.received_at - first <= self._window_ms:
                    found[index] = first
                else:
                    here[key] = call.received_at
                    self.state.stage(partition, key, encode_value(call.received_at))
        return found

    def take(self, partitions: Iterable[int]) -> list[Changes]:
        """What ``first_seen`` staged for ``partitions``, with its changelog records, to hand
        off (then ``apply`` each)."""
        return [changes for p in partitions if (changes := self.state.take(p)) is not None]

    def apply(
        self, taken: Iterable[Changes], ends: Mapping[tuple[str, int], int] | None = None
    ) -> None:
        """Their hand-off is durable (``ends``: the offset of the last record acknowledged in
        each changelog partition, when known)."""
        topic = self.state.changelog_topic
        for changes in taken:
            self.state.apply(changes, (ends or {}).get((topic, changes.partition)))

    def discard(self, partitions: Iterable[int]) -> None:
        for partition in partitions:
            self.state.discard(partition)
