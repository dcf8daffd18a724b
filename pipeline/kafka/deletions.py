"""Which users were asked to be deleted, and when: the delivery workers' view of deletion requests.

``pipeline delete-user`` records every request in the compacted topic ``deletion-requests``
(``pipeline.ops.deletion``), one record per user holding the user's history.
``DeletionFollower`` reads that topic from the beginning in a background thread and keeps
following it: ``deleted`` maps each user id to the time of the user's latest request, and the
delivery handler suppresses a pending delivery of a call received before it
(``pipeline.core.suppression``).

The request record is written *before* the delete calls are produced, so every delivery worker
knows of a request within about a second of ``delete-user`` starting to notify receivers.
``deleted`` is one dict, updated in place on the follower's thread and read on the event loop
(a single ``get`` is atomic under the interpreter lock): the hot path pays a look-up, no copy.
"""

from __future__ import annotations

import logging

from confluent_kafka import Message

from pipeline.core.exceptions import UndecodableRecord
from pipeline.core.records import deletion_request_from_record
from pipeline.core.settings import Settings
from pipeline.core.suppression import deleted_at
from pipeline.kafka.clients import topics_for
from pipeline.kafka.codec import RecordCodec
from pipeline.kafka.registry_codec import make_codec
from pipeline.kafka.topic_reader import TopicFollower

__all__ = ["DeletionFollower"]

log = logging.getLogger("pipeline.deletions")


class DeletionFollower:
    """Follows ``deletion-requests`` in a background thread (a ``TopicFollower``).

    follower = DeletionFollower(settings).start()
    follower.wait_ready(timeout=30)
    follower.deleted.get("user-42")     # epoch ms of the latest request, or None
    """

    def __init__(self, settings: Settings, *, codec: RecordCodec | None = None) -> None:
        self._codec = codec or make_codec(settings)
        #: User id → when the user's latest deletion request was made (epoch ms).
        self.deleted: dict[str, int] = {}
        self._follower = TopicFollower(
            settings, topics_for(settings).deletion_requests, self._apply_all, name="deletions"
        )

    def start(self) -> DeletionFollower:
        self._follower.start()
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Return once every request recorded so far is known: a worker that attempted records
        before that could deliver what an old request suppresses."""
        self._follower.wait_ready(timeout)

    def stop(self) -> None:
        self._follower.stop()

    def _apply_all(self, records: list[Message]) -> None:
        for message in records:
            self._apply(message.key(), message.value())

    def _apply(self, key: bytes | None, value: bytes | None) -> None:
        if value is None:  # a tombstone: the user's requests were forgotten
            self.deleted.pop((key or b"").decode(errors="replace"), None)
            return
        try:
            request = deletion_request_from_record(self._codec.decode("DeletionRequest", value))
        except (UndecodableRecord, KeyError, ValueError) as exc:
            log.error("deletion request record %r ignored: %s", key, exc)
            return
        at = deleted_at(request)
        if at is None:
            self.deleted.pop(request.user_id, None)
        else:
            self.deleted[request.user_id] = at
