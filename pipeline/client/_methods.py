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

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from .._timestamps import now_ms
from ._messages import build_message

__all__ = ["CallMethods"]


class CallMethods:
    def _enqueue(self, message: dict[str, Any], now: int) -> None:
        """Validate, encode and queue ``message``, made at ``now`` (epoch ms)."""
        raise NotImplementedError

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
