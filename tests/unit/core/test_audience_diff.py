"""Audiences and computed traits: input files, value typing and the diff. Pure logic."""

from __future__ import annotations

import pytest

from pipeline.core.audience import (
    MAX_PROBLEMS_SHOWN,
    Change,
    ChangeKind,
    StateEntry,
    SyncInputError,
    TraitKind,
    TraitSpec,
    diff,
    message_id_for,
    parse_value,
    read_members,
    read_values,
)
from pipeline.core.calls import MAX_ID_CHARS


def lines(text: str) -> list[bytes]:
    return text.encode().splitlines(keepends=True)


def by_user(changes: list[Change]) -> dict[str, tuple[str, ChangeKind]]:
    return {c.user_id: (c.value, c.kind) for c in changes}


# ---- the diff ------------------------------------------------------------------------------------


def test_first_sync_adds_every_member() -> None:
    changes, counts = diff({"a": "true", "b": "true", "c": "true"}, {}, absent="false")
    assert by_user(changes) == {u: ("true", ChangeKind.ADDED) for u in "abc"}
    assert (counts.added, counts.removed, counts.unchanged, counts.sends) == (3, 0, 0, 3)


def test_later_sync_sends_only_membership_changes() -> None:
    state = {u: StateEntry("true") for u in "abc"}
    changes, counts = diff({"b": "true", "c": "true", "d": "true"}, state, absent="false")
    assert by_user(changes) == {"a": ("false", ChangeKind.REMOVED), "d": ("true", ChangeKind.ADDED)}
    assert changes[0].previous is None and changes[1].previous == "true"
    assert (counts.added, counts.removed, counts.unchanged) == (1, 1, 2)


def test_same_list_again_sends_nothing() -> None:
    state = {u: StateEntry("true") for u in "abc"}
    changes, counts = diff({u: "true" for u in "abc"}, state, absent="false")
    assert changes == []
    assert counts.unchanged == 3 and counts.sends == 0


def test_removed_users_are_not_sent_twice() -> None:
    # After a removal is confirmed the state holds nothing (a tombstone) or, at worst, "false".
    changes, counts = diff({}, {"a": StateEntry("false")}, absent="false")
    assert changes == [] and counts.sends == 0


def test_computed_trait_changes_keep_json_types() -> None:
    state = {"a": StateEntry("12"), "b": StateEntry('"gold"'), "c": StateEntry("true")}
    desired = {"a": "12", "b": '"silver"', "c": "true", "d": "3.5"}
    changes, counts = diff(desired, state, absent="null")
    assert by_user(changes) == {
        "b": ('"silver"', ChangeKind.CHANGED),
        "d": ("3.5", ChangeKind.ADDED),
    }
    assert (counts.added, counts.changed, counts.unchanged) == (1, 1, 2)


def test_computed_trait_user_left_out_is_cleared_with_null() -> None:
    changes, counts = diff({}, {"a": StateEntry("12")}, absent="null")
    assert by_user(changes) == {"a": ("null", ChangeKind.REMOVED)}


def test_a_number_becoming_a_string_is_a_change() -> None:
    changes, _ = diff({"a": '"12"'}, {"a": StateEntry("12")}, absent="null")
    assert by_user(changes) == {"a": ('"12"', ChangeKind.CHANGED)}


# ---- crashed syncs: pending marks ----------------------------------------------------------------


def test_rerun_with_the_same_file_resends_pending_users_with_their_message_id() -> None:
    # The sync of time 111 marked "a" pending true and crashed; its call may or may not be out.
    state = {"a": StateEntry(None, "true", 111), "b": StateEntry("true")}
    changes, counts = diff({"a": "true", "b": "true"}, state, absent="false")
    assert changes == [Change("a", "true", None, ChangeKind.ADDED, 111)]
    assert counts.uncertain == 1 and counts.unchanged == 1


def test_rerun_with_a_different_file_never_leaves_a_wrong_value() -> None:
    # "a" may have received true from the crashed sync; the new file drops it: it must get false.
    state = {"a": StateEntry(None, "true", 111)}
    changes, counts = diff({}, state, absent="false")
    assert changes == [Change("a", "false", None, ChangeKind.RESENT, None)]
    assert counts.resent == 1


def test_pending_removal_then_member_again_is_resent_true() -> None:
    # Confirmed true, a crashed sync was removing it: receivers may hold false now.
    state = {"a": StateEntry("true", "false", 222)}
    changes, counts = diff({"a": "true"}, state, absent="false")
    assert changes == [Change("a", "true", "true", ChangeKind.RESENT, None)]
    # ... and marking it pending with pending == value still counts as uncertain.
    again, _ = diff({"a": "true"}, {"a": StateEntry("true", "true", 333)}, absent="false")
    assert again == [Change("a", "true", "true", ChangeKind.RESENT, 333)]


def test_pending_removal_finished_by_rerun_reuses_message_id() -> None:
    state = {"a": StateEntry("true", "false", 222)}
    changes, _ = diff({}, state, absent="false")
    assert changes == [Change("a", "false", "true", ChangeKind.REMOVED, 222)]


def test_message_ids_derive_from_key_value_and_sync_time() -> None:
    first = message_id_for(b"web/vip/a", "true", 111)
    assert first == message_id_for(b"web/vip/a", "true", 111)
    others = {
        message_id_for(b"web/vip/b", "true", 111),
        message_id_for(b"web/vip/a", "false", 111),
        message_id_for(b"web/vip/a", "true", 112),
    }
    assert first not in others and len(others) == 3


# ---- the spec ------------------------------------------------------------------------------------


def test_spec_keys_and_traits() -> None:
    audience = TraitSpec.of(TraitKind.AUDIENCE, "web", "Order Completed Last 30days")
    assert audience.property_name == "order_completed_last_30days"
    assert audience.key("u/1") == b"web/order_completed_last_30days/u/1"
    assert audience.absent == "false"
    assert audience.traits_json("true") == '{"order_completed_last_30days":true}'
    trait = TraitSpec.of(TraitKind.COMPUTED, "web", "Total Orders")
    assert trait.absent == "null"
    assert trait.traits_json("12") == '{"total_orders":12}'
    with pytest.raises(ValueError, match="--name"):
        TraitSpec.of(TraitKind.AUDIENCE, "web", "???")


# ---- value typing --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cell", "value"),
    [
        ("12", 12),
        ("-7", -7),
        ("0", 0),
        ("3.5", 3.5),
        ("-0.25", -0.25),
        ("1e3", 1000.0),
        ("true", True),
        ("FALSE", False),
        (" True ", True),
        ("007", "007"),  # leading zeros: an identifier, not a number
        ("+5", "+5"),
        ("1,5", "1,5"),
        (".5", ".5"),
        ("NaN", "NaN"),
        ("1e999", "1e999"),  # not finite
        (str(2**53 - 1), 2**53 - 1),
        (str(2**53), str(2**53)),  # would lose precision in a JavaScript receiver
        ("gold", "gold"),
        ("yes", "yes"),
        ("", None),
        ("   ", None),
    ],
)
def test_parse_value(cell: str, value: object) -> None:
    parsed = parse_value(cell)
    assert parsed == value and type(parsed) is type(value)


# ---- members files -------------------------------------------------------------------------------


def test_members_one_id_per_line() -> None:
    result = read_members(lines("\nu1\nu2\r\n  u3  \nu1\n\n u with space\nu,comma\n"))
    assert list(result.values) == ["u1", "u2", "u3", "u with space", "u,comma"]
    assert (result.rows, result.duplicates, result.blank) == (6, 1, 2)


def test_members_csv_with_user_id_column() -> None:
    text = '\ufeffemail,User_Id,plan\na@x,u1,pro\n"b,@x",u2,free\n\nc@x,u1,pro\n'
    result = read_members(lines(text))
    assert list(result.values) == ["u1", "u2"]
    assert (result.rows, result.duplicates, result.blank) == (3, 1, 1)


def test_members_problems_are_all_reported_by_line() -> None:
    long_id = "x" * (MAX_ID_CHARS + 1)
    with pytest.raises(SyncInputError) as caught:
        read_members([b"ok\n", long_id.encode() + b"\n", b"\xff\xfe\n", b"fine\n"], path="m.txt")
    message = str(caught.value)
    assert message.startswith("m.txt: 2 problem(s), nothing was sent")
    assert f"line 2: user_id is {MAX_ID_CHARS + 1:,} characters, over the limit of" in message
    assert "line 3: is not UTF-8 text" in message


def test_members_csv_rows_without_the_column_and_empty_ids() -> None:
    with pytest.raises(SyncInputError) as caught:
        read_members(lines("email,user_id\na@x\nb@x,\n"))
    assert caught.value.problems == [
        "line 2: has 1 column(s), no user_id (column 2)",
        "line 3: user_id is empty",
    ]


def test_many_problems_are_counted_but_only_some_shown() -> None:
    with pytest.raises(SyncInputError) as caught:
        read_members(lines("email,user_id\n" + "a@x,\n" * 50))
    assert caught.value.total == 50
    assert len(caught.value.problems) == MAX_PROBLEMS_SHOWN
    assert "... and 30 more" in str(caught.value)


def test_members_empty_file() -> None:
    result = read_members([])
    assert result.values == {} and result.rows == 0


# ---- values files --------------------------------------------------------------------------------


def test_values_with_header_in_any_order() -> None:
    text = "value,user_id\n12,u1\n3.5,u2\ntrue,u3\ngold,u4\n,u5\n12,u1\n"
    result = read_values(lines(text))
    assert result.values == {"u1": "12", "u2": "3.5", "u3": "true", "u4": '"gold"'}
    assert (result.rows, result.duplicates, result.empty_values) == (6, 1, 1)


def test_values_without_header() -> None:
    result = read_values(lines('u1,12\nu2,"a, quoted ""string"""\n'))
    assert result.values == {"u1": "12", "u2": '"a, quoted \\"string\\""'}


def test_values_problems() -> None:
    with pytest.raises(SyncInputError) as caught:
        read_values(lines("u1,1\nu1,2\nu2\nu3,1,2\n,5\n"))
    assert caught.value.problems == [
        "line 2: user 'u1' is listed again with a different value (2 after 1)",
        "line 3: has 1 column(s), expected 2 (user_id,value)",
        "line 4: has 3 column(s), expected 2 (user_id,value)",
        "line 5: user_id is empty",
    ]


def test_values_header_needs_a_value_column() -> None:
    with pytest.raises(SyncInputError, match="no value column"):
        read_values(lines("user_id,total\nu1,3\n"))
