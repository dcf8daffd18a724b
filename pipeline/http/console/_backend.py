"""What the console reads and changes: the live config (followed from the config topic), the
operational events, the held users of ordered destinations (followed from the ordering
changelog), the delivery log's store, dead-letter replays and test events.

Blocking calls (the store's queries, Kafka writes, reading the dead-letter topic) run in threads;
the pages never wait on each other.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from pipeline.core.batching import batch_body, batch_id
from pipeline.core.config import ConfigTable, Destination, Source
from pipeline.core.console import changed_fields
from pipeline.core.exceptions import StoreUnavailable
from pipeline.core.settings import Settings, default_log_store_url
from pipeline.core.timestamps import now_ms
from pipeline.http.oauth2 import TokenError
from pipeline.http.sender import Probe, WebhookSender, merged_headers
from pipeline.kafka.clients import topics_for
from pipeline.kafka.config_store import ConfigFollower, write_config
from pipeline.kafka.events import EventEmitter, EventKind, EventLog
from pipeline.kafka.producer import AsyncProducer
from pipeline.kafka.registry_codec import make_codec
from pipeline.ops.dlq import DlqFilter, ReplaySummary, replay_dead_letters
from pipeline.ops.ordering import HeldUsersFollower
from pipeline.ops.pace import PaceFollower
from pipeline.store import LogStore, open_store

__all__ = ["Console", "ReplayJob"]

log = logging.getLogger("pipeline.console")

T = TypeVar("T")

#: Finished dead-letter replays whose pages stay available.
_KEPT_JOBS = 20
#: How long a save waits to see its change on the config topic before saying it is not visible.
_SAVE_VISIBLE_TIMEOUT = 10.0


@dataclass
class ReplayJob:
    """A dead-letter replay started from the console, running in a thread."""

    id: str
    selection: DlqFilter
    started_by: str
    total: int = 0
    done: int = 0
    finished: bool = False
    summary: ReplaySummary | None = None
    error: str | None = None
    started_at: int = field(default_factory=now_ms)

    def progress(self, done: int, total: int) -> None:
        self.done, self.total = done, total


class Console:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.config = ConfigFollower(settings)
        self.events = EventLog(settings)
        self.held = HeldUsersFollower(settings)
        self.pace = PaceFollower(settings)
        self.sender = WebhookSender(settings)
        self.jobs: dict[str, ReplayJob] = {}
        #: Held around every read-change-write of the config, so that two saves (two clicks,
        #: two people) never overwrite each other.
        self.lock = asyncio.Lock()
        self._store: LogStore | None = None
        self._store_problem: str | None = None
        self._store_lock = threading.Lock()
        self._producer: AsyncProducer | None = None
        self._emitter: EventEmitter | None = None

    async def start(self) -> None:
        self.config.start()
        self.events.start()
        self.held.start()
        self.pace.start()
        await self.sender.start()
        self._producer = AsyncProducer(self.settings)
        self._emitter = EventEmitter(
            self._producer, make_codec(self.settings), topics_for(self.settings).events
        )
        await asyncio.to_thread(self.config.wait_ready, 30.0)

    async def stop(self) -> None:
        if self._emitter is not None:
            await self._emitter.aclose()
        if self._producer is not None:
            await asyncio.to_thread(self._producer.close)
        await self.sender.aclose()
        self.config.stop()
        self.events.stop()
        self.held.stop()
        self.pace.stop()
        if self._store is not None:
            await asyncio.to_thread(self._store.close)

    @property
    def table(self) -> ConfigTable:
        return self.config.table

    # ---- the delivery log's store ---------------------------------------------------------------

    def _open_store(self) -> LogStore:
        with self._store_lock:
            if self._store is None:
                self._store = open_store(default_log_store_url(self.settings))
            return self._store

    async def query(self, question: Callable[[LogStore], T]) -> T | None:
        """Ask the store; ``None`` (and ``store_problem`` says why) while it cannot be read."""
        try:
            answer = await asyncio.to_thread(lambda: question(self._open_store()))
        except StoreUnavailable as exc:
            self._store_problem = str(exc)
            return None
        self._store_problem = None
        return answer

    @property
    def store_problem(self) -> str | None:
        return self._store_problem

    # ---- changes --------------------------------------------------------------------------------

    async def save(self, entity: Source | Destination, who: str) -> list[str]:
        """Write one source or destination to the config topic, record the change on
        ``pipeline.events``, and wait until this console's own follower sees it (so the next page
        shows it). Returns the names of the fields that changed."""
        kind = "source" if isinstance(entity, Source) else "destination"
        table = self.table
        old: Source | Destination | None = (
            table.sources.get(entity.id) if kind == "source" else table.destinations.get(entity.id)
        )
        changed = changed_fields(old, entity)
        if not changed:
            return []
        await asyncio.to_thread(write_config, self.settings, [entity], changed_by=who)
        assert self._emitter is not None
        event = self._emitter.emit(
            EventKind.CONSOLE_CHANGE,
            entity.id if kind == "destination" else None,
            f"{kind} {entity.id}: {', '.join(changed)} changed in the console by {who}",
            session=who,
            entity=f"{kind}:{entity.id}",
            fields=changed,
        )
        await self._visible(kind, entity, event["id"])
        return changed

    async def _visible(self, kind: str, entity: Source | Destination, event_id: str) -> None:
        """Wait until the change and its event are back from Kafka (the next page shows both)."""
        deadline = time.monotonic() + _SAVE_VISIBLE_TIMEOUT
        key = f"{kind}:{entity.id}"
        while time.monotonic() < deadline:
            table = self.table
            seen = (table.sources if kind == "source" else table.destinations).get(entity.id)
            if seen == entity and any(e.id == event_id for e in self.events.of(key)):
                return
            await asyncio.sleep(0.05)
        log.warning("%s saved but not seen on the config or events topic yet", key)

    # ---- dead letters ---------------------------------------------------------------------------

    def running_replay(self) -> ReplayJob | None:
        return next((job for job in self.jobs.values() if not job.finished), None)

    def start_replay(self, selection: DlqFilter, who: str) -> ReplayJob:
        """Start a dead-letter replay in a thread (one at a time: see ``running_replay``); the
        last ``_KEPT_JOBS`` jobs are kept for their pages."""
        job = ReplayJob(f"r{uuid.uuid4().hex[:10]}", selection, who)
        for old in [j for j in self.jobs.values() if j.finished][: -_KEPT_JOBS + 1 or None]:
            del self.jobs[old.id]
        self.jobs[job.id] = job

        def run() -> None:
            try:
                job.summary = replay_dead_letters(self.settings, selection, progress=job.progress)
                job.total = job.total or len(job.summary.replayed)
                job.done = len(job.summary.replayed)
            except Exception as exc:  # shown on the job's page
                log.exception("dead-letter replay %s failed", job.id)
                job.error = str(exc) or type(exc).__name__
            finally:
                job.finished = True

        threading.Thread(target=run, name=f"replay-{job.id}", daemon=True).start()
        return job

    # ---- test events ----------------------------------------------------------------------------

    async def send_test(
        self, destination: Destination, body: bytes, message_id: str
    ) -> tuple[dict[str, str], list[Probe]]:
        """POST ``body`` to each webhook of ``destination`` as a delivery would (its static
        headers, signed with its secret; a batching destination's as a batch of one); the headers
        sent (signature included) and each answer."""
        if destination.batch is not None:
            body, message_id = batch_body([body]), batch_id()
        signed = self.sender.signed_headers(destination, body, message_id)
        tls = self.sender.tls_of(destination)
        try:
            bearer = await self.sender.bearer(destination)
        except TokenError as exc:
            return signed, [
                Probe(hook.url, None, [], "", 0.0, str(exc)) for hook in destination.webhooks
            ]
        probes: Sequence[Probe] = await asyncio.gather(
            *(
                self.sender.probe(
                    hook.url,
                    merged_headers(hook.headers, {**signed, **bearer}),
                    body,
                    tls,
                    self.sender.proxy_of(destination),
                )
                for hook in destination.webhooks
            )
        )
        return signed, list(probes)
