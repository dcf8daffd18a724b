"""What the delivery processes say of each destination's pace (the pace topic,
``pipeline.core.pace``), for ``pipeline stats`` and the console: a lowered pace, a pause.

    views = pace_views(settings)          # one read of the topic
    follower = PaceFollower(settings).start()
    follower.of("hooks")                  # PaceView(pace=18.2, paused_until=0.0)
"""

from __future__ import annotations

import threading

from confluent_kafka import Message

from pipeline.core.pace import PaceBook, PaceView
from pipeline.core.settings import Settings
from pipeline.kafka.clients import topics_for
from pipeline.kafka.topic_reader import TopicFollower, read_topic

__all__ = ["PaceFollower", "pace_views"]

#: The member name of a reader: never a delivery process's.
_READER = "reader"


def pace_views(settings: Settings) -> dict[str, PaceView]:
    """Each destination with something to say (a lowered pace, a pause), as last reported.
    Raises ``BrokerUnavailable`` when the topic cannot be read."""
    book = PaceBook(_READER)
    for message in read_topic(settings, topics_for(settings).pace):
        book.take(message.key(), message.value())
    views = {d: book.view(d) for d in book.destinations()}
    return {d: v for d, v in views.items() if v.pace is not None or v.paused_until > 0}


class PaceFollower:
    """Follows the pace topic in a background thread; ``of(destination)`` tells its pace now."""

    def __init__(self, settings: Settings) -> None:
        self._book = PaceBook(_READER)
        self._lock = threading.Lock()
        self._follower = TopicFollower(settings, topics_for(settings).pace, self._take, name="pace")

    def start(self) -> PaceFollower:
        self._follower.start()
        return self

    def stop(self) -> None:
        self._follower.stop()

    def of(self, destination: str) -> PaceView:
        with self._lock:
            return self._book.view(destination)

    def _take(self, records: list[Message]) -> None:
        with self._lock:
            for message in records:
                self._book.take(message.key(), message.value())
