"""``parse_call`` agrees with its first, plainer version on every input.

``parse_call`` is written out field by field for speed (it runs for every call on every path);
``_reference_calls.reference_parse_call`` is the version it replaced, one helper per field. For
arbitrary JSON objects, mostly call-shaped, both must return the same ``Call`` or raise the same
error naming the same field.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import CallTooLarge, InvalidCall
from pipeline.core.calls import parse_call

from ._reference_calls import reference_parse_call

RECEIVED = 1_795_273_470_123

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(["", "2026-11-21T15:04:30.123Z", "2026-11-21T15:04:30+01:00", "yesterday"]),
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
_FIELDS = [
    "type",
    "userId",
    "anonymousId",
    "messageId",
    "timestamp",
    "sentAt",
    "event",
    "name",
    "category",
    "groupId",
    "previousId",
    "properties",
    "traits",
    "context",
    "integrations",
]
_PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "type": st.sampled_from(["identify", "track", "page", "screen", "group", "alias", "delete"]),
    "userId": st.one_of(
        st.text(max_size=8), st.integers(0, 10**6), st.text(min_size=1025, max_size=1030)
    ),
    "anonymousId": st.text(max_size=8),
    "messageId": st.text(max_size=8),
    "groupId": st.text(max_size=8),
    "previousId": st.text(max_size=8),
    "event": st.text(max_size=8),
    "properties": st.dictionaries(st.text(max_size=5), _SCALARS, max_size=3),
    "context": st.dictionaries(st.text(max_size=5), _SCALARS, max_size=3),
    "integrations": st.dictionaries(
        st.text(max_size=5), st.one_of(st.booleans(), st.just({}), _SCALARS), max_size=2
    ),
}
calls = st.fixed_dictionaries(
    {},
    optional={field: st.one_of(_PLAUSIBLE.get(field, _SCALARS), _JSON) for field in _FIELDS},
)


def outcome(parse: Any, raw: Any, **kwargs: Any) -> Any:
    try:
        call = parse(raw, source_id="web", received_at=RECEIVED, **kwargs)
    except (InvalidCall, CallTooLarge) as exc:
        return type(exc).__name__, str(exc)
    if not raw.get("messageId"):  # generated at random by both: compare its shape only
        assert len(call.message_id) == 36
        call = call._replace(message_id="generated")
    return call


@settings(max_examples=600, deadline=None)
@given(raw=calls)
def test_parse_call_agrees_with_the_reference(raw: dict[str, Any]) -> None:
    assert outcome(parse_call, raw) == outcome(reference_parse_call, raw)


@settings(max_examples=200, deadline=None)
@given(raw=calls, call_type=st.sampled_from(["track", "page", "alias"]))
def test_parse_call_agrees_with_the_reference_given_the_type(
    raw: dict[str, Any], call_type: str
) -> None:
    assert outcome(parse_call, raw, call_type=call_type) == outcome(
        reference_parse_call, raw, call_type=call_type
    )
