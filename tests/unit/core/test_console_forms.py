"""The console's pure logic: a destination form to the config file's mapping, problems next to
their fields, what a change changed, masked keys, chart bars."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from pipeline.core.config import (
    Batch,
    ConfigTable,
    Destination,
    Ordering,
    Signing,
    Source,
    Webhook,
    validate_config,
)
from pipeline.core.console import (
    FormError,
    bars,
    changed_fields,
    destination_data,
    destination_form,
    mask_key,
    problems_by_field,
    webhook_rows,
)
from pipeline.core.exceptions import ConfigError

from ._config_tables import config_tables

CURRENT = Destination(
    id="hooks",
    name="Webhooks",
    sources=["web"],
    shared_secret="s3cret",
    webhooks=[Webhook(url="https://a.example/hook", headers={"Authorization": "Bearer x"})],
)


def form(**fields: str) -> dict[str, str]:
    return {"name": "Webhooks", "enabled": "on", "url_0": "https://a.example/hook", **fields}


def test_a_form_becomes_the_config_files_mapping():
    data = destination_data(
        form(
            headers_0="Authorization: Bearer x\n\nX-Team:growth\nX-Spaced:  kept ",
            url_1="https://b.example/hook",
            retry_delays="10s, 1m",
            retry_deadline="2h",
            max_in_flight="50",
            rate_limit="12.5",
            disable_after="1d",
        ),
        ["web"],
        CURRENT,
    )
    assert data == {
        "id": "hooks",
        "name": "Webhooks",
        "enabled": True,
        "sources": ["web"],
        "webhooks": [
            {
                "url": "https://a.example/hook",
                "headers": {"Authorization": "Bearer x", "X-Team": "growth", "X-Spaced": " kept "},
            },
            {"url": "https://b.example/hook", "headers": {}},
        ],
        "shared_secret": "s3cret",  # kept: the form never holds it
        "retry": {"delays": ["10s", "1m"], "deadline": "2h"},
        "max_in_flight": 50,
        "rate_limit": 12.5,
        "disable_after": "1d",
    }


def test_the_secret_is_kept_set_or_cleared():
    assert destination_data(form(), ["web"], CURRENT)["shared_secret"] == "s3cret"
    changed = destination_data(form(secret_action="set", secret="new"), ["web"], CURRENT)
    assert changed["shared_secret"] == "new"
    assert "shared_secret" not in destination_data(form(secret_action="clear"), ["web"], CURRENT)
    with pytest.raises(FormError, match="shared_secret: type the new secret"):
        destination_data(form(secret_action="set", secret=""), ["web"], CURRENT)


def test_an_unticked_box_disables_and_an_empty_url_removes_a_webhook():
    data = destination_data({"url_0": "", "url_1": "https://b.example/x"}, [], CURRENT)
    assert data["enabled"] is False
    assert [w["url"] for w in data["webhooks"]] == ["https://b.example/x"]


def test_a_header_line_without_a_colon_names_its_webhook_and_line():
    with pytest.raises(FormError) as caught:
        destination_data(form(headers_0="Authorization Bearer"), ["web"], CURRENT)
    assert caught.value.field == "webhooks[0].headers"
    assert "line 1 'Authorization Bearer' is not 'Name: value'" in str(caught.value)


def test_a_number_that_is_not_one_reaches_the_model_as_typed():
    data = destination_data(form(max_in_flight="many"), ["web"], CURRENT)
    with pytest.raises(ConfigError) as caught:
        validate_config({"sources": [{"id": "web"}], "destinations": [data]})
    assert caught.value.problems == [
        "destinations[0] (hooks).max_in_flight: must be a whole number, got 'many'"
    ]


def validated(data: dict[str, object]) -> Destination:
    return validate_config({"sources": [{"id": "web"}], "destinations": [data]}).destinations[0]


def test_the_ordering_select_sets_the_field():
    per_user = destination_data(form(ordering="per_user"), ["web"], CURRENT)
    assert per_user["ordering"] == "per_user"
    assert validated(per_user).ordering is Ordering.PER_USER
    # none is the default: left out of the mapping, as config export leaves it out
    ordered = CURRENT.model_copy(update={"ordering": Ordering.PER_USER})
    back = destination_data(form(ordering="none"), ["web"], ordered)
    assert "ordering" not in back
    assert validated(back).ordering is Ordering.NONE


def test_a_form_without_the_ordering_keeps_the_current_one():
    ordered = CURRENT.model_copy(update={"ordering": Ordering.PER_USER})
    assert destination_data(form(), ["web"], ordered)["ordering"] == "per_user"
    assert "ordering" not in destination_data(form(), ["web"], CURRENT)
    assert "ordering" not in destination_data({**form(), "id": "new"}, ["web"], None)


def test_the_form_preselects_the_destinations_ordering():
    assert destination_form(CURRENT)["ordering"] == "none"
    ordered = CURRENT.model_copy(update={"ordering": Ordering.PER_USER})
    assert destination_form(ordered)["ordering"] == "per_user"
    assert changed_fields(CURRENT, ordered) == ["ordering"]


def test_the_batch_fields_set_the_batch():
    on = form(batch="on", batch_max_events="50", batch_max_bytes="64KB", batch_max_wait="250ms")
    data = destination_data(on, ["web"], CURRENT)
    assert data["batch"] == {"max_events": 50, "max_bytes": "64KB", "max_wait": "250ms"}
    assert validated(data).batch == Batch(max_events=50, max_bytes=64_000, max_wait=0.25)
    defaults = destination_data(form(batch="on"), ["web"], CURRENT)
    assert validated(defaults).batch == Batch()  # empty fields: the batch's defaults
    batched = CURRENT.model_copy(update={"batch": Batch()})
    off = destination_data(form(batch="off", batch_max_events="50"), ["web"], batched)
    assert "batch" not in off and validated(off).batch is None


def test_a_form_without_the_batch_keeps_the_current_one():
    batched = CURRENT.model_copy(update={"batch": Batch(max_events=7, max_wait=0.5)})
    assert validated(destination_data(form(), ["web"], batched)).batch == batched.batch
    assert "batch" not in destination_data(form(), ["web"], CURRENT)


def test_the_form_shows_the_destinations_batch_and_round_trips():
    assert destination_form(CURRENT)["batch"] == "off"
    batched = CURRENT.model_copy(update={"batch": Batch(max_bytes="2MB", max_wait=0.25)})
    shown = destination_form(batched)
    assert (shown["batch"], shown["batch_max_events"]) == ("on", "100")
    assert (shown["batch_max_bytes"], shown["batch_max_wait"]) == ("2MB", "250ms")
    again = destination_data({**shown, "secret_action": "keep"}, ["web"], batched)
    assert validated(again).batch == batched.batch


def test_the_signing_select_keeps_the_key_and_never_shows_it():
    from pipeline.core.signing import new_signing_key

    asked = destination_data(form(signing="ed25519"), ["web"], CURRENT)
    assert asked["signing"] == "ed25519" and "signing_key" not in asked  # made when saved
    key = new_signing_key()
    signed = CURRENT.model_copy(update={"signing": Signing.ED25519, "signing_key": key})
    shown = destination_form(signed)
    assert shown["signing"] == "ed25519" and key not in shown.values()
    kept = destination_data({**shown, "secret_action": "keep"}, ["web"], signed)
    assert validated(kept).signing_key == key
    assert "signing" not in destination_data(form(signing="none"), ["web"], signed)
    with pytest.raises(FormError) as refused:
        destination_data(form(signing="rsa"), ["web"], CURRENT)
    assert refused.value.field == "signing"


def test_a_bad_batch_is_refused_next_to_its_field():
    data = destination_data(form(batch="on", batch_max_bytes="<i>lots</i>"), ["web"], CURRENT)
    with pytest.raises(ConfigError) as caught:
        validated(data)
    assert list(problems_by_field(caught.value.problems, "hooks")) == ["batch.max_bytes"]
    with pytest.raises(FormError) as refused:
        destination_data(form(batch="maybe"), ["web"], CURRENT)
    assert refused.value.field == "batch"


def test_an_ordering_that_is_not_one_is_refused_next_to_its_field():
    data = destination_data(form(ordering="<b>fifo</b>"), ["web"], CURRENT)
    with pytest.raises(ConfigError) as caught:
        validated(data)
    problem = "destinations[0] (hooks).ordering: must be 'none' or 'per_user', got '<b>fifo</b>'"
    assert caught.value.problems == [problem]
    assert problems_by_field(caught.value.problems, "hooks") == {"ordering": [problem]}


def test_problems_go_next_to_the_field_they_name():
    problems = [
        "destinations[2] (hooks).webhooks: at most 5 webhooks per destination, got 6",
        "destinations[2] (hooks).webhooks[1].url: 'x' has no host",
        "destinations[2] (hooks).retry.delays[0]: 'soon' is not a duration",
        "destinations[2] (hooks).sources: unknown source 'app'; known: web",
        "destinations[0] (other).name: something about another destination",
        "config: must be a mapping",
    ]
    assert problems_by_field(problems, "hooks") == {
        "webhooks": [problems[0]],
        "webhooks[1].url": [problems[1]],
        "retry.delays[0]": [problems[2]],
        "sources": [problems[3]],
        "": [problems[4], problems[5]],
    }


def test_changed_fields_name_what_changed_never_a_value():
    toggled = CURRENT.model_copy(update={"enabled": False, "shared_secret": "other"})
    assert changed_fields(CURRENT, toggled) == ["enabled", "shared_secret"]
    assert changed_fields(CURRENT, CURRENT) == []
    assert changed_fields(None, Source(id="web")) == ["created"]


def test_the_form_offers_one_more_webhook_row_than_there_are():
    assert webhook_rows(None) == 1
    assert webhook_rows(CURRENT) == 2
    five = CURRENT.model_copy(update={"webhooks": CURRENT.webhooks * 5})
    assert webhook_rows(five) == 6  # a sixth can be typed, and is refused as config apply would


def test_masked_keys_show_only_their_ends():
    assert mask_key("wk_live_abcdefgh12") == "wk_l••••••••12"
    assert mask_key("tiny") == "••••••••"


def test_bars_scale_to_the_busiest_hour_and_fill_empty_hours():
    hour = 3_600_000
    drawn = bars([(hour, 3, 1), (3 * hour, 1, 0)], hour, count=3, height=20)  # hours 0 and 2
    assert [(b.x, b.delivered, b.failed) for b in drawn] == [
        (0, 15.0, 5.0),
        (1, 0.0, 0.0),
        (2, 5.0, 0.0),
    ]
    assert drawn[0].title == "3 delivered, 1 failed"
    assert all(b.delivered == b.failed == 0 for b in bars([], 0))


@settings(max_examples=150, deadline=None)
@given(config_tables())
def test_a_destinations_form_saved_unchanged_gives_the_same_destination(table: ConfigTable):
    """The form a page shows for a destination, posted back as it is, validates (as ``config
    apply`` would) to that destination; the pipeline's own disable marks are kept by the view."""
    for dest in table.destinations.values():
        data = destination_data(destination_form(dest), dest.sources, dest)
        sources = [{"id": s} for s in table.sources]
        rebuilt = validate_config({"sources": sources, "destinations": [data]}).destinations[0]
        assert rebuilt == dest.model_copy(update={"disabled_reason": None, "disabled_at": None})


def test_a_new_destinations_form_starts_enabled():
    assert destination_form(None) == {"enabled": "on", "name": "Webhooks"}


def test_problems_of_an_id_with_a_colon_go_next_to_their_field():
    problem = "destinations[0] (team:hooks).webhooks[0].url: 'x' has no host"
    assert problems_by_field([problem], "team:hooks") == {"webhooks[0].url": [problem]}
    assert problems_by_field([problem], "team") == {"": [problem]}


def test_what_only_the_config_file_sets_is_kept_by_a_save():
    from pipeline.core.config import ClientTls, OAuth2

    configured = CURRENT.model_copy(
        update={
            "mtls": ClientTls(certificate="/etc/c.pem", key="/etc/k.pem"),
            "proxy": "http://egress:pw@proxy.internal:3128",
            "oauth2": OAuth2(
                token_url="https://auth.example/token", client_id="id", client_secret="s"
            ),
        }
    )
    saved = validated(destination_data(form(name="Renamed"), ["web"], configured))
    assert (saved.mtls, saved.proxy, saved.oauth2) == (
        configured.mtls,
        configured.proxy,
        configured.oauth2,
    )
    assert saved.name == "Renamed"
