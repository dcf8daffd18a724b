"""Which pending deliveries a deletion request suppresses (``pipeline.core.suppression``)."""

from __future__ import annotations

from pipeline.core.records import DeletionRequest, DeletionRequestEvent, Delivery
from pipeline.core.suppression import deleted_at, suppressed_by

DELETED = {"u1": 1_000}


def delivery(**changes: object) -> Delivery:
    fresh = Delivery("m1", "hooks", "web", "track", b'{"userId":"u1"}', 999, user_id="u1")
    return fresh._replace(**changes)


def test_a_call_received_before_the_request_is_suppressed_by_it() -> None:
    assert suppressed_by(delivery(), DELETED) == 1_000
    assert suppressed_by(delivery(tier=1, replays=2), DELETED) == 1_000  # wherever it waits


def test_a_call_received_at_or_after_the_request_is_delivered() -> None:
    assert suppressed_by(delivery(received_at=1_000), DELETED) is None
    assert suppressed_by(delivery(received_at=5_000), DELETED) is None


def test_other_users_anonymous_calls_and_delete_calls_are_delivered() -> None:
    assert suppressed_by(delivery(user_id="u2"), DELETED) is None
    assert suppressed_by(delivery(user_id="", body=b'{"userId":null}'), DELETED) is None
    assert suppressed_by(delivery(call_type="delete"), DELETED) is None


def test_a_record_written_before_deliveries_carried_the_user_is_judged_by_its_body() -> None:
    assert suppressed_by(delivery(user_id=None), DELETED) == 1_000
    assert suppressed_by(delivery(user_id=None, body=b'{"userId":"u2"}'), DELETED) is None
    assert suppressed_by(delivery(user_id=None, body=b'{"userId":null}'), DELETED) is None
    assert suppressed_by(delivery(user_id=None, body=b"not json"), DELETED) is None


def test_the_latest_request_counts() -> None:
    request = DeletionRequest("u1", (DeletionRequestEvent(5), DeletionRequestEvent(9)))
    assert deleted_at(request) == 9
    assert deleted_at(DeletionRequest("u1")) is None
