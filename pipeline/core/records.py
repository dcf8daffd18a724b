"""Conversions between our values and the Avro records of ``schemas/``."""

from __future__ import annotations

from typing import Any

from pipeline.core.calls import Call, CallType

__all__ = ["call_to_record", "call_from_record", "new_delivery"]


def call_to_record(call: Call) -> dict[str, Any]:
    return {
        "type": call.type.value,
        "messageId": call.message_id,
        "sourceId": call.source_id,
        "timestamp": call.timestamp,
        "receivedAt": call.received_at,
        "userId": call.user_id,
        "anonymousId": call.anonymous_id,
        "sentAt": call.sent_at,
        "event": call.event,
        "name": call.name,
        "category": call.category,
        "groupId": call.group_id,
        "previousId": call.previous_id,
        "properties": call.properties,
        "traits": call.traits,
        "context": call.context,
        "integrations": call.integrations,
    }


def call_from_record(record: dict[str, Any]) -> Call:
    return Call(
        type=CallType(record["type"]),
        message_id=record["messageId"],
        source_id=record["sourceId"],
        timestamp=record["timestamp"],
        received_at=record["receivedAt"],
        user_id=record["userId"],
        anonymous_id=record["anonymousId"],
        sent_at=record["sentAt"],
        event=record["event"],
        name=record["name"],
        category=record["category"],
        group_id=record["groupId"],
        previous_id=record["previousId"],
        properties=record["properties"],
        traits=record["traits"],
        context=record["context"],
        integrations=record["integrations"],
    )


def new_delivery(call: Call, destination_id: str, body: bytes) -> dict[str, Any]:
    """A fresh delivery record for the main topic: no attempt yet, due now."""
    return {
        "messageId": call.message_id,
        "destinationId": destination_id,
        "sourceId": call.source_id,
        "callType": call.type.value,
        "body": body,
        "receivedAt": call.received_at,
        "firstAttemptAt": None,
        "deadline": None,
        "notBefore": 0,
        "tier": -1,
        "replays": 0,
        "attempts": [],
    }
