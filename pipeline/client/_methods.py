"""The six call methods, shared by ``Client`` and ``AsyncClient``.

Arguments are Segment's, in Python spelling (``user_id``, ``anonymous_id``, ``event``,
``properties``, ``traits``, ``context``, ``integrations``, ``timestamp`` (a datetime or an ISO 8601
string, for historical import), ``message_id``, ``name``, ``category``, ``group_id``,
``previous_id``). The first ones may be positional as in ``analytics-python``
(``track(user_id, event, properties)``); the rest are keyword-only.

Every method validates at once (``InvalidCall`` naming the field, ``CallTooLarge`` over 32 KB),
queues, and returns ``None``; it never waits for the network.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from pipeline.core.timestamps import now_ms

from ._log import log
from ._messages import Queued, build_message

#: ``on_error(error, messages)``: called with the messages a failure or a drop concerns.
OnError = Callable[[Exception, list[dict[str, Any]]], None]

__all__ = ["CallMethods"]


class CallMethods:
    on_error: OnError | None

    def _enqueue(self, message: dict[str, Any], now: int) -> None:
        """Validate, encode and queue ``message``, made at ``now`` (epoch ms)."""
        raise NotImplementedError

    def _report(self, error: Exception, items: Sequence[Queued]) -> None:
        """Tell ``on_error`` (if set) which messages ``error`` concerns; its own errors are logged."""
        if self.on_error is None:
            return
        try:
            self.on_error(error, [item.message() for item in items])
        except Exception:
            log.exception("on_error raised")

    def identify(
        self,
        user_id: str | int | None = None,
        traits: Mapping[str, Any] | None = None,
        *,
        anonymous_id: str | int | None = None,
        context: Mapping[str, Any] | None = None,
        integrations: Mapping[str, Any] | None = None,
        timestamp: datetime | str | None = None,
        message_id: str | None = None,
    ) -> None:
        now = now_ms()
        self._enqueue(
            build_message(
                "identify",
                now,
                user_id=user_id,
                anonymous_id=anonymous_id,
                traits=traits,
                context=context,
                integrations=integrations,
                timestamp=timestamp,
                message_id=message_id,
            ),
            now,
        )

    def track(
        self,
        user_id: str | int | None = None,
        event: str | None = None,
        properties: Mapping[str, Any] | None = None,
        *,
        anonymous_id: str | int | None = None,
        context: Mapping[str, Any] | None = None,
        integrations: Mapping[str, Any] | None = None,
        timestamp: datetime | str | None = None,
        message_id: str | None = None,
    ) -> None:
        now = now_ms()
        self._enqueue(
            build_message(
                "track",
                now,
                user_id=user_id,
                anonymous_id=anonymous_id,
                event=event,
                properties=properties,
                context=context,
                integrations=integrations,
                timestamp=timestamp,
                message_id=message_id,
            ),
            now,
        )

    def page(
        self,
        user_id: str | int | None = None,
        *,
        name: str | None = None,
        category: str | None = None,
        properties: Mapping[str, Any] | None = None,
        anonymous_id: str | int | None = None,
        context: Mapping[str, Any] | None = None,
        integrations: Mapping[str, Any] | None = None,
        timestamp: datetime | str | None = None,
        message_id: str | None = None,
    ) -> None:
        now = now_ms()
        self._enqueue(
            build_message(
                "page",
                now,
                user_id=user_id,
                anonymous_id=anonymous_id,
                name=name,
                category=category,
                properties=properties,
                context=context,
                integrations=integrations,
                timestamp=timestamp,
                message_id=message_id,
            ),
            now,
        )

    def screen(
        self,
        user_id: str | int | None = None,
        *,
        name: str | None = None,
        category: str | None = None,
        properties: Mapping[str, Any] | None = None,
        anonymous_id: str | int | None = None,
        context: Mapping[str, Any] | None = None,
        integrations: Mapping[str, Any] | None = None,
        timestamp: datetime | str | None = None,
        message_id: str | None = None,
    ) -> None:
        now = now_ms()
        self._enqueue(
            build_message(
                "screen",
                now,
                user_id=user_id,
                anonymous_id=anonymous_id,
                name=name,
                category=category,
                properties=properties,
                context=context,
                integrations=integrations,
                timestamp=timestamp,
                message_id=message_id,
            ),
            now,
        )

    def group(
        self,
        user_id: str | int | None = None,
        group_id: str | int | None = None,
        traits: Mapping[str, Any] | None = None,
        *,
        anonymous_id: str | int | None = None,
        context: Mapping[str, Any] | None = None,
        integrations: Mapping[str, Any] | None = None,
        timestamp: datetime | str | None = None,
        message_id: str | None = None,
    ) -> None:
        now = now_ms()
        self._enqueue(
            build_message(
                "group",
                now,
                user_id=user_id,
                anonymous_id=anonymous_id,
                group_id=group_id,
                traits=traits,
                context=context,
                integrations=integrations,
                timestamp=timestamp,
                message_id=message_id,
            ),
            now,
        )

    def alias(
        self,
        previous_id: str | int | None = None,
        user_id: str | int | None = None,
        *,
        context: Mapping[str, Any] | None = None,
        integrations: Mapping[str, Any] | None = None,
        timestamp: datetime | str | None = None,
        message_id: str | None = None,
    ) -> None:
        now = now_ms()
        self._enqueue(
            build_message(
                "alias",
                now,
                user_id=user_id,
                previous_id=previous_id,
                context=context,
                integrations=integrations,
                timestamp=timestamp,
                message_id=message_id,
            ),
            now,
        )
