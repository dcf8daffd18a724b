"""``pipeline.core.records``: typed records survive the codec unchanged, and what the router writes
still takes the compiled Avro writer's fast path."""

from __future__ import annotations

import pytest

from pipeline import parse_call
from pipeline.core.dead_letters import dead_letter, replay
from pipeline.core.records import (
    Attempt,
    DeadLetter,
    DeletionNotification,
    DeletionRequest,
    DeletionRequestEvent,
    Delivery,
    Replay,
    TraitState,
    dead_letter_from_record,
    dead_letter_to_record,
    deletion_request_from_record,
    deletion_request_to_record,
    delivery_from_record,
    delivery_to_record,
    new_delivery,
    replay_from_record,
    replay_to_record,
    trait_state_from_record,
    trait_state_to_record,
)
from pipeline.kafka.codec import Codec

DELIVERY = Delivery(
    "m1",
    "hooks",
    "web",
    "track",
    b'{"x":1}',
    5,
    6,
    7,
    8,
    1,
    2,
    (
        Attempt(6, "https://a/h", 503, "server_error", 12),
        Attempt(6, "https://b/h", None, "timeout", 5000),
    ),
)
LETTER = DeadLetter("dl-1", "client_error", "404", 9, "t", 3, 42, DELIVERY, None)
CASES = [
    ("Delivery", DELIVERY, delivery_to_record, delivery_from_record),
    ("DeadLetter", LETTER, dead_letter_to_record, dead_letter_from_record),
    (
        "DeadLetter",
        LETTER._replace(delivery=None, raw=b"\x00junk"),
        dead_letter_to_record,
        dead_letter_from_record,
    ),
    ("Replay", Replay("dl-1", 9, "m1", "hooks"), replay_to_record, replay_from_record),
    (
        "TraitState",
        TraitState("true", None, None, 9),
        trait_state_to_record,
        trait_state_from_record,
    ),
    (
        "DeletionRequest",
        DeletionRequest(
            "u1",
            (DeletionRequestEvent(5, "gdpr", True, (DeletionNotification("web", "m", 5, False),)),),
        ),
        deletion_request_to_record,
        deletion_request_from_record,
    ),
]


@pytest.mark.parametrize(("name", "value", "to_record", "from_record"), CASES)
def test_round_trip_through_the_codec(name, value, to_record, from_record) -> None:  # type: ignore[no-untyped-def]
    codec = Codec.default()
    assert from_record(codec.decode(name, codec.encode(name, to_record(value)))) == value


def test_delivery_records_take_the_compiled_writers_fast_path() -> None:
    """The compiled writer takes only exact types (lists, not tuples): no fastavro fallback."""
    codec = Codec.default()
    write = codec._compiled["Delivery"]
    assert write is not None
    write(bytearray(), delivery_to_record(DELIVERY))  # raises on anything it does not expect


def test_new_delivery_is_the_codec_dict_of_delivery_for_call() -> None:
    call = parse_call({"type": "identify", "userId": "u"}, source_id="web", received_at=3)
    record = new_delivery(call, "hooks", b"{}")
    assert delivery_from_record(record) == Delivery.for_call(call, "hooks", b"{}")
    assert record["tier"] == -1 and record["attempts"] == [] and record["firstAttemptAt"] is None


def test_stamped_and_attempted_change_only_their_fields() -> None:
    assert DELIVERY.stamped(1, 2) == DELIVERY._replace(first_attempt_at=1, deadline=2)
    extra = (Attempt(10, "u"),)
    assert DELIVERY.attempted(extra) == DELIVERY._replace(attempts=DELIVERY.attempts + extra)
    assert DELIVERY.attempted(extra, 3, 99) == DELIVERY._replace(
        attempts=DELIVERY.attempts + extra, tier=3, not_before=99
    )


def test_dead_letter_keeps_the_delivery_or_else_the_raw_bytes() -> None:
    kept = dead_letter(
        "internal_error", topic="t", partition=1, offset=2, raw=b"v", delivery=DELIVERY, at=5
    )
    assert kept._replace(id="x") == DeadLetter(
        "x", "internal_error", "", 5, "t", 1, 2, DELIVERY, None
    )
    raw = dead_letter("undecodable", topic="t", partition=1, offset=2, raw=b"v", detail="why")
    assert (raw.delivery, raw.raw, raw.detail) == (None, b"v", "why")
    assert raw.id != kept.id


def test_replay_clears_the_deadline_and_counts_up() -> None:
    delivery, marker = replay(LETTER, now=1000)
    assert delivery == DELIVERY._replace(
        first_attempt_at=None, deadline=None, not_before=1000, tier=0, replays=3
    )
    assert delivery.attempts == DELIVERY.attempts  # its earlier life is kept
    assert marker == Replay("dl-1", 1000, "m1", "hooks")
    with pytest.raises(ValueError, match="no delivery"):
        replay(LETTER._replace(delivery=None), now=1000)
