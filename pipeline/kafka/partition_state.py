"""State kept per input partition: a keyed store on local disk, backed by a changelog topic,
restored when the partition is assigned. (Kafka Streams and Quix Streams keep theirs so.)

- **The changelog is the truth; the local store is a cache of it.** A handler reads its
  partition's store (``get_many``), and stages what it changes (``stage``); the changes go out as
  changelog records (``take``) with its hand-off, in the hand-off's transaction where there
  is one; once the hand-off is durable, ``apply`` writes them to the local store. A handler killed
  at any moment leaves a changelog that holds exactly what it handed off (with transactions), and
  a local store that is at most behind it.
- **Restored on assignment.** The local store remembers the changelog offset it holds up to (its
  checkpoint: where a restore stopped, or the last record of changes applied with their offset);
  when its partition is assigned, it reads the changelog from there to the end before the
  partition's first record is handled. A local store that cannot be opened (corrupt,
  another version's) is emptied and restored whole; one that cannot be made at all stops the role.
  One another process on this machine holds (its lock) is left alone: this process restores the
  partition whole into a temporary store of its own.
- **Time-bounded.** Every value carries the time it was written (epoch ms, the first 8 bytes).
  Entries older than ``retention`` read as absent and are not restored; RocksDB's TTL drops them at
  compaction, and the changelog topic keeps them as long (``cleanup.policy`` compact,delete).

The store is RocksDB through ``rocksdict``: a lookup of a key it does not hold (most of a dedupe's)
costs 0.8 µs with its bloom filters, 1,000,000 keys take 38 MB (SQLite: 56 MB, and ten times the
time to write; docs/decisions.md).

    >>> import tempfile
    >>> store = PartitionStore(tempfile.mkdtemp(), retention=60.0)
    >>> store.write([(b"k", encode_value(1_000, b"v"))], checkpoint=7)
    >>> store.get_many([b"k", b"other"], now_ms=2_000), store.checkpoint()
    ([(1000, b'v'), None], 7)
    >>> store.close()
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from pipeline.core.exceptions import PipelineError
from pipeline.core.settings import Settings
from pipeline.kafka.clients import consumer_config
from pipeline.kafka.errors import Placed

__all__ = [
    "check_changelog",
    "PartitionStore",
    "PartitionState",
    "Changes",
    "StateUnavailable",
    "encode_value",
    "decode_value",
]

log = logging.getLogger("pipeline.state")

_TIME = struct.Struct(">q")
#: Where a store keeps the changelog offset it has read up to (not a key of the state's: those
#: are never empty).
_CHECKPOINT = b""
#: Changes applied to RocksDB per write while restoring.
_RESTORE_BATCH = 10_000
#: How long a restore waits for the changelog to answer at all.
_RESTORE_IDLE = 30.0


def _held_elsewhere(exc: Exception) -> bool:
    """RocksDB refused the store's lock: another process (or another store in this one) has it
    open. ("IO error: While lock file: ...: Resource temporarily unavailable", or "lock hold by
    current process".)"""
    text = str(exc)
    return text.startswith("IO error") and ("lock file" in text or "lock hold" in text)


class StateUnavailable(PipelineError):
    """A partition's state cannot be opened or restored: its role cannot go on without it."""


def encode_value(at_ms: int, payload: bytes = b"") -> bytes:
    return _TIME.pack(at_ms) + payload


def decode_value(value: bytes) -> tuple[int, bytes]:
    return _TIME.unpack_from(value)[0], value[_TIME.size :]


#: What makes a missing topic.
_FIX = "run `pipeline topics create`"


def _existing(settings: Settings, topic: str, what: str, timeout: float) -> Any:
    """An admin client, once ``topic`` (``what``: "the pace topic") is known to exist;
    ``StateUnavailable`` if it does not, or the topics cannot be listed."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from pipeline.kafka.clients import admin_config

    admin = AdminClient(admin_config(settings, lambda _error: None))
    try:
        found = topic in admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise StateUnavailable(f"could not list the topics for {what} {topic}: {exc}") from None
    if not found:
        raise StateUnavailable(f"{what} {topic} does not exist: {_FIX}")
    return admin


def check_topic(settings: Settings, topic: str, what: str, timeout: float = 10.0) -> None:
    """``StateUnavailable`` unless ``topic`` (``what``: "the pace topic") exists."""
    _existing(settings, topic, what, timeout)


def check_changelog(settings: Settings, topic: str, timeout: float = 10.0) -> None:
    """``StateUnavailable`` unless ``topic`` exists and is compacted (a changelog that deletes
    by time only would forget a key's latest value)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import ConfigResource  # type: ignore[attr-defined]

    admin = _existing(settings, topic, "the changelog topic", timeout)
    try:
        resource = ConfigResource("TOPIC", topic)
        configs = admin.describe_configs([resource], request_timeout=timeout)[resource].result()
    except KafkaException as exc:
        raise StateUnavailable(f"could not describe the changelog topic {topic}: {exc}") from None
    entry = configs.get("cleanup.policy")
    policy = entry.value if entry is not None else "delete"
    if "compact" not in policy.split(","):
        raise StateUnavailable(
            f"the changelog topic {topic} has cleanup.policy={policy}; a changelog must be "
            f"compacted (cleanup.policy=compact,delete): alter it, or delete it and {_FIX}"
        )


class PartitionStore:
    """One partition's local store (a RocksDB directory)."""

    def __init__(self, path: str, *, retention: float, temporary: bool = False) -> None:
        """``temporary``: the directory is deleted when the store is closed."""
        from rocksdict import (
            AccessType,
            BlockBasedOptions,
            DBCompressionType,
            Options,
            Rdict,
            WriteBatch,
        )

        self.path = path
        self._temporary = temporary
        self._retention_ms = int(retention * 1000)
        self._batch = WriteBatch
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_compression_type(DBCompressionType.lz4())
        options.set_write_buffer_size(4 * 1024 * 1024)  # a store per partition: keep each small
        table = BlockBasedOptions()
        table.set_bloom_filter(10, False)  # a key it does not hold costs no disk read
        options.set_block_based_table_factory(table)
        ttl = max(1, int(retention) + 3600)  # compaction drops what is an hour past retention
        os.makedirs(path, exist_ok=True)
        self._db: Any = Rdict(path, options, access_type=AccessType.with_ttl(ttl))

    def get_many(self, keys: Sequence[bytes], *, now_ms: int) -> list[tuple[int, bytes] | None]:
        """(time, payload) of each key, ``None`` for one absent or older than the retention."""
        found = self._db.get(list(keys)) if keys else []
        oldest = now_ms - self._retention_ms
        out: list[tuple[int, bytes] | None] = []
        for value in found:
            if value is None:
                out.append(None)
                continue
            at, payload = decode_value(value)
            out.append((at, payload) if at >= oldest else None)
        return out

    def scan(
        self, prefix: bytes, *, now_ms: int, limit: int | None = None
    ) -> list[tuple[bytes, tuple[int, bytes]]]:
        """The keys starting with ``prefix`` (in key order; the first ``limit``) with their
        (time, payload), those older than the retention left out."""
        oldest = now_ms - self._retention_ms
        found: list[tuple[bytes, tuple[int, bytes]]] = []
        cursor = self._db.iter()
        try:
            cursor.seek(prefix)
            while cursor.valid() and (limit is None or len(found) < limit):
                key = cursor.key()
                if not key.startswith(prefix):
                    break
                at, payload = decode_value(cursor.value())
                if at >= oldest:
                    found.append((key, (at, payload)))
                cursor.next()
        finally:
            del cursor
        return found

    def write(
        self, changes: Iterable[tuple[bytes, bytes | None]], checkpoint: int | None = None
    ) -> None:
        """Apply ``changes`` (``None``: delete the key) and, given, the checkpoint, atomically."""
        batch = self._batch(raw_mode=True)
        for key, value in changes:
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        if checkpoint is not None:
            batch.put(_CHECKPOINT, _TIME.pack(checkpoint))
        self._db.write(batch)

    def checkpoint(self) -> int:
        """The changelog offset this store has read up to (-1: none yet)."""
        value = self._db.get(_CHECKPOINT)
        return -1 if value is None else int(_TIME.unpack(value)[0])

    def close(self) -> None:
        self._db.close()
        if self._temporary:
            shutil.rmtree(self.path, ignore_errors=True)


class PartitionState:
    """A named state of a handler over its input topic's partitions in this process: each
    partition's ``PartitionStore`` under ``directory``, its changelog topic, and the changes
    of the hand-offs in progress.

    ``assigned`` restores (blocking: the consumer loop calls it before the partitions' records
    are read); ``released`` and ``close`` close the stores."""

    def __init__(
        self,
        settings: Settings,
        *,
        changelog: str,
        directory: str,
        retention: float,
    ) -> None:
        self._settings = settings
        self.changelog_topic = changelog
        self._directory = directory
        self._retention = retention
        self._stores: dict[int, PartitionStore] = {}
        self._staged: dict[int, dict[bytes, bytes | None]] = {}
        #: Changes taken for hand-offs not yet durable, oldest first.
        self._taken: dict[int, list[Changes]] = {}
        #: Partitions are assigned and released on the consumer's thread while the handler
        #: reads and writes on the event loop's: a store is never closed under a read.
        self._lock = threading.Lock()

    # ---- partitions ----------------------------------------------------------------------------

    def assigned(self, partitions: Sequence[int], *, restore: bool = True) -> None:
        """Open and restore each partition's store (raises ``StateUnavailable``);
        ``restore=False``: the local store as it is, the changelog not read."""
        opened: dict[int, PartitionStore] = {}
        try:
            for partition in partitions:
                if partition not in self._stores:
                    opened[partition] = self._open(partition)
            if restore and opened:
                self._restore(opened)
        except BaseException:
            for store in opened.values():
                store.close()
            raise
        with self._lock:
            self._stores.update(opened)

    def released(self, partitions: Sequence[int]) -> None:
        with self._lock:
            for partition in partitions:
                store = self._stores.pop(partition, None)
                self.discard(partition)
                if store is not None:
                    store.close()

    def close(self) -> None:
        self.released(list(self._stores))

    def checkpoint(self, partition: int) -> int:
        """The changelog offset the partition's local store holds up to (-1: none, or the
        partition is not here)."""
        with self._lock:
            store = self._stores.get(partition)
            return -1 if store is None else store.checkpoint()

    def _path(self, partition: int) -> str:
        return os.path.join(self._directory, f"{self.changelog_topic}-{partition}")

    def _open(self, partition: int) -> PartitionStore:
        path = self._path(partition)
        try:
            return PartitionStore(path, retention=self._retention)
        except Exception as exc:  # noqa: BLE001 (RocksDB reports corruption as a plain Exception)
            if _held_elsewhere(exc):
                return self._open_private(partition, path)
            log.warning(
                "state %s[%d]: the local store at %s cannot be opened (%s); it is emptied and "
                "restored from the changelog",
                self.changelog_topic,
                partition,
                path,
                exc,
            )
        shutil.rmtree(path, ignore_errors=True)
        return self._make(partition, path)

    def _open_private(self, partition: int, path: str) -> PartitionStore:
        """A store of this process's own, restored whole and deleted when closed: the shared one
        is held by another process (a worker on this machine with the same ``PIPELINE_STATE_DIR``
        that has not let the partition go yet, or a stopped one that does not know it lost it).
        Never emptied: it is that process's."""
        private = tempfile.mkdtemp(prefix=f"pipeline-state-{os.path.basename(path)}-")
        log.warning(
            "state %s[%d]: the local store at %s is held by another process on this machine; "
            "this process restores the partition into a store of its own at %s",
            self.changelog_topic,
            partition,
            path,
            private,
        )
        return self._make(partition, private, temporary=True)

    def _make(self, partition: int, path: str, *, temporary: bool = False) -> PartitionStore:
        """A new store at ``path``, or ``StateUnavailable`` saying why none can be made."""
        try:
            return PartitionStore(path, retention=self._retention, temporary=temporary)
        except Exception as exc:  # noqa: BLE001
            if temporary:
                shutil.rmtree(path, ignore_errors=True)
            raise StateUnavailable(
                f"state {self.changelog_topic}[{partition}]: cannot make a local store at {path}: "
                f"{exc} (check free space and permissions there; PIPELINE_STATE_DIR sets where)"
            ) from None

    def _restore(self, stores: dict[int, PartitionStore]) -> None:
        """Apply each partition's changelog from past its store's checkpoint to its end, all
        partitions read at once."""
        started = time.monotonic()
        restoring = {p: _Restoring(store, store.checkpoint()) for p, store in stores.items()}
        consumer = Consumer(
            consumer_config(
                self._settings,
                f"{self._settings.topic_prefix}state-restore",
                # An empty fetch answers at once: the end of each partition is seen in one round
                # trip, not in the broker's default wait (500 ms) per fetch.
                **{"enable.partition.eof": True, "fetch.wait.max.ms": 10},
            )
        )
        waiting = {p for p in restoring if not self._never_written(consumer, p)}
        consumer.assign(
            [
                TopicPartition(
                    self.changelog_topic, p, OFFSET_BEGINNING if r.last < 0 else r.last + 1
                )
                for p, r in restoring.items()
                if p in waiting
            ]
        )
        oldest = int(time.time() * 1000) - int(self._retention * 1000)
        idle_since = time.monotonic()
        try:
            while waiting:
                messages = consumer.consume(1000, 0.1)
                if not messages:
                    if time.monotonic() - idle_since > _RESTORE_IDLE:
                        raise StateUnavailable(
                            f"state {self.changelog_topic}{sorted(waiting)}: the changelog did "
                            f"not answer within {_RESTORE_IDLE:.0f} s"
                        )
                    continue
                idle_since = time.monotonic()
                for message in messages:
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            waiting.discard(message.partition())
                        elif error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                            raise StateUnavailable(
                                f"the changelog topic {self.changelog_topic} does not exist: "
                                "run `pipeline topics create`"
                            )
                        else:
                            log.warning("state %s: %s", self.changelog_topic, error)
                        continue
                    partition = message.partition()
                    assert partition is not None  # a consumed record has one
                    restoring[partition].add(message, oldest)
        finally:
            consumer.close()
        for partition, state in restoring.items():
            state.flush()
            if state.read:
                log.info(
                    "state %s[%d]: restored %d changes in %.1f s",
                    self.changelog_topic,
                    partition,
                    state.read,
                    time.monotonic() - started,
                )

    def _never_written(self, consumer: Consumer, partition: int) -> bool:
        """Whether the changelog partition never had a record (its end offset is 0): nothing to
        restore, and no fetch to wait for. (Only 0 is trusted: the embedded broker reports an
        end offset short of the last batch's records, DESIGN.md §4.)"""
        try:
            _, high = consumer.get_watermark_offsets(
                TopicPartition(self.changelog_topic, partition), timeout=5.0
            )
        except Exception:  # noqa: BLE001 (not known: read it)
            return False
        return bool(high == 0)

    # ---- a hand-off ----------------------------------------------------------------------------

    def get_many(
        self, partition: int, keys: Sequence[bytes], now_ms: int
    ) -> list[tuple[int, bytes] | None]:
        """What the partition's state holds for ``keys``, the changes of hand-offs in progress
        (staged, or taken and not yet applied) included."""
        with self._lock:
            store = self._stores.get(partition)
            # Released meanwhile: its records go to its new owner, which knows them.
            found: list[tuple[int, bytes] | None] = (
                [None] * len(keys) if store is None else store.get_many(keys, now_ms=now_ms)
            )
        # Read once each: ``released`` (on the consumer's thread) may drop them meanwhile.
        newer = [changes.entries for changes in self._taken.get(partition, ())]
        staged = self._staged.get(partition)
        if staged is not None:
            newer.append(staged)
        for entries_ in newer:  # oldest first: the latest change of a key wins
            for index, key in enumerate(keys):
                if key in entries_:
                    value = entries_[key]
                    found[index] = None if value is None else decode_value(value)
        return found

    def scan(
        self, partition: int, prefix: bytes, now_ms: int, limit: int | None = None
    ) -> list[tuple[bytes, tuple[int, bytes]]]:
        """The keys of the partition's state starting with ``prefix``, in key order, with their
        (time, payload), the changes of hand-offs in progress included (as ``get_many``).
        ``limit``: at most that many, the first ones (fewer when changes in progress deleted
        some of them)."""
        with self._lock:
            store = self._stores.get(partition)
            read = [] if store is None else store.scan(prefix, now_ms=now_ms, limit=limit)
        found = dict(read)
        # Cut short: a change past the last key read may sort after keys that were not read.
        last = read[-1][0] if limit is not None and len(read) >= limit else None
        newer = [changes.entries for changes in self._taken.get(partition, ())]
        staged = self._staged.get(partition)
        if staged is not None:
            newer.append(staged)
        for entries_ in newer:  # oldest first: the latest change of a key wins
            for key, value in entries_.items():
                if key.startswith(prefix) and (last is None or key <= last):
                    if value is None:
                        found.pop(key, None)
                    else:
                        found[key] = decode_value(value)
        return sorted(found.items())[:limit]

    def stage(self, partition: int, key: bytes, value: bytes | None) -> None:
        """Change ``key`` (``None``: delete it) with the hand-off in progress."""
        self._staged.setdefault(partition, {})[key] = value

    def take(self, partition: int) -> Changes | None:
        """The changes staged for ``partition``, with their changelog records to produce with the
        hand-off (``None``: there are none). Once the hand-off is durable, ``apply`` them; they
        are read as the state's meanwhile, and the next hand-off stages afresh."""
        staged = self._staged.pop(partition, None)
        if not staged:
            return None
        changes = Changes(partition, staged, self._records(partition, staged))
        self._taken.setdefault(partition, []).append(changes)
        return changes

    def _records(self, partition: int, staged: dict[bytes, bytes | None]) -> list[Placed]:
        topic = self.changelog_topic
        return [(topic, key, value, [], partition) for key, value in staged.items()]

    def apply(self, changes: Changes, end: int | None = None) -> None:
        """Their hand-off is durable: write ``changes`` to the local store. ``end``: the offset
        of their last changelog record, if known; it becomes the store's checkpoint when nothing
        taken before them is still waiting (a restart on this machine then reads only what came
        after)."""
        taken = self._taken.get(changes.partition, [])
        if changes not in taken:
            return  # forgotten meanwhile (``discard``, ``released``)
        oldest = taken[0] is changes
        taken.remove(changes)
        with self._lock:
            store = self._stores.get(changes.partition)
            if store is not None:
                store.write(changes.entries.items(), checkpoint=end if oldest else None)

    def discard(self, partition: int) -> None:
        """The hand-offs in progress will not happen (the worker stops): forget their changes."""
        self._staged.pop(partition, None)
        self._taken.pop(partition, None)


@dataclass(eq=False, slots=True)  # one hand-off's: two are never the same, whatever they hold
class Changes:
    """The changes of one hand-off to one partition's state (``PartitionState.take``): its
    entries (key → value, ``None``: deleted) and their changelog records."""

    partition: int
    entries: dict[bytes, bytes | None]
    records: list[Placed]


class _Restoring:
    """One partition's store being restored: the changes read and not yet written, and the
    offset of the last one read."""

    __slots__ = ("store", "last", "changes", "read")

    def __init__(self, store: PartitionStore, checkpoint: int) -> None:
        self.store = store
        self.last = checkpoint
        self.changes: list[tuple[bytes, bytes | None]] = []
        self.read = 0

    def add(self, message: Any, oldest: int) -> None:
        """A changelog record (entries older than ``oldest``, epoch ms, are not kept)."""
        self.last = message.offset()
        key, value = message.key(), message.value()
        if key is None:
            return
        if value is not None and decode_value(value)[0] < oldest:
            value = None  # expired: not kept
        self.changes.append((key, value))
        self.read += 1
        if len(self.changes) >= _RESTORE_BATCH:
            self.flush()

    def flush(self) -> None:
        self.store.write(self.changes, checkpoint=self.last)
        self.changes = []
