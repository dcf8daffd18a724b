"""Unit tests for pipeline.core.config: config file rules (seed §2.1, §8) and the live ConfigTable."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pipeline import ConfigError
from pipeline.core.config import (
    MAX_WEBHOOKS,
    RESERVED_HEADERS,
    Batch,
    ConfigTable,
    Destination,
    Ordering,
    PipelineConfig,
    RetryPolicy,
    Source,
    check_url,
    validate_config,
)

VALID: dict[str, Any] = {
    "sources": [
        {
            "id": "web",
            "name": "Website",
            "write_keys": ["wk_live_1"],
            "blocked_events": ["Debug Event"],
        },
        {"id": "ios", "name": "iOS app", "write_keys": ["wk_ios_1", "wk_ios_2"]},
    ],
    "destinations": [
        {
            "id": "hooks-1",
            "name": "Webhooks",
            "enabled": True,
            "sources": ["web"],
            "shared_secret": "s3cret",
            "webhooks": [
                {"url": "https://example.com/hook", "headers": {"Authorization": "Bearer abc"}}
            ],
        }
    ],
}


def config(**destination: Any) -> dict[str, Any]:
    """VALID with the first destination's fields replaced."""
    data = copy.deepcopy(VALID)
    data["destinations"][0].update(destination)
    return data


def problems(data: object) -> list[str]:
    with pytest.raises(ConfigError) as info:
        validate_config(data)
    assert info.value.problems, "a ConfigError lists at least one problem"
    for problem in info.value.problems:
        assert problem in str(info.value)
    return info.value.problems


def only_problem(data: object) -> str:
    found = problems(data)
    assert len(found) == 1, found
    return found[0]


# ---- valid configs ---------------------------------------------------------------------------------


def test_the_documented_example_is_valid() -> None:
    result = validate_config(VALID)
    assert isinstance(result, PipelineConfig)
    web = result.sources[0]
    assert (web.id, web.name, web.write_keys, web.blocked_events) == (
        "web",
        "Website",
        ["wk_live_1"],
        ["Debug Event"],
    )
    dest = result.destinations[0]
    assert (dest.id, dest.name, dest.enabled, dest.sources, dest.shared_secret) == (
        "hooks-1",
        "Webhooks",
        True,
        ["web"],
        "s3cret",
    )
    assert dest.webhooks[0].url == "https://example.com/hook"
    assert dest.webhooks[0].headers == {"Authorization": "Bearer abc"}


def test_defaults() -> None:
    result = validate_config(
        {
            "sources": [{"id": "web"}],
            "destinations": [
                {"id": "d", "sources": ["web"], "webhooks": [{"url": "http://10.0.0.1:8080/x"}]}
            ],
        }
    )
    dest = result.destinations[0]
    assert dest.name == "Webhooks"  # seed §1.3: the destination's integrations key
    assert dest.enabled is True
    assert dest.shared_secret is None
    assert dest.webhooks[0].headers == {}
    assert result.sources[0].write_keys == []
    assert result.sources[0].blocked_events == []


@pytest.mark.parametrize("data", [None, {}, {"sources": [], "destinations": []}])
def test_empty_config_is_valid(data: object) -> None:
    result = validate_config(data)
    assert result.sources == [] and result.destinations == []


def test_models_are_frozen() -> None:
    result = validate_config(VALID)
    with pytest.raises(Exception, match="frozen"):
        result.destinations[0].enabled = False  # type: ignore[misc]


@pytest.mark.parametrize("count", range(1, MAX_WEBHOOKS + 1))
def test_one_to_five_webhooks(count: int) -> None:
    hooks = [{"url": f"https://example.com/{i}"} for i in range(count)]
    assert len(validate_config(config(webhooks=hooks)).destinations[0].webhooks) == count


# ---- webhooks list ---------------------------------------------------------------------------------


def test_six_webhooks_is_an_error_mentioning_5() -> None:
    assert MAX_WEBHOOKS == 5
    hooks = [{"url": f"https://example.com/{i}"} for i in range(6)]
    problem = only_problem(config(webhooks=hooks))
    assert problem == (
        "destinations[0] (hooks-1).webhooks: at most 5 webhooks per destination, got 6"
    )


def test_no_webhooks_is_an_error() -> None:
    assert only_problem(config(webhooks=[])) == (
        "destinations[0] (hooks-1).webhooks: needs at least one entry"
    )
    problem = only_problem(
        {"sources": [{"id": "web"}], "destinations": [{"id": "d", "sources": ["web"]}]}
    )
    assert problem == "destinations[0] (d).webhooks: is required"


def test_webhooks_must_be_a_list() -> None:
    assert only_problem(config(webhooks="https://example.com/hook")).startswith(
        "destinations[0] (hooks-1).webhooks: "
    )


# ---- URLs ------------------------------------------------------------------------------------------

GOOD_URLS = [
    "https://example.com/hook",
    "http://example.com",
    "https://example.com:8443/a/b?c=d&e=f#frag",
    "http://127.0.0.1:8090/hook",
    "http://[::1]:8090/hook",
    "https://sub.domain.example.co.uk/path%20with%20escapes",
]

BAD_URLS = {
    "ftp://example.com/hook": "must use http:// or https://",
    "ws://example.com/hook": "must use http:// or https://",
    "file:///etc/passwd": "must use http:// or https://",
    "example.com/hook": "must use http:// or https://",
    "//example.com/hook": "must use http:// or https://",
    "": "must use http:// or https://",
    "https://": "has no host",
    "http:///hook": "has no host",
    "https://:8080/hook": "has no host",
    "https://example.com/a hook": "whitespace",
    " https://example.com/hook": "whitespace",
    "https://example.com/hook\n": "whitespace",
    "https://example.com/\thook": "whitespace",
    "https://exa\x00mple.com/": "whitespace or control",
    "https://user:pass@example.com/hook": "credentials",
    "https://token@example.com/hook": "credentials",
    "https://example.com:99999/hook": "not a valid URL",
    "https://example.com:port/hook": "not a valid URL",
    "https://[::1/hook": "not a valid URL",
    "https://example.com:0/hook": "port 0",
    "https://example.com/" + "a" * 2100: "over the limit",
}


@pytest.mark.parametrize("url", GOOD_URLS)
def test_good_urls(url: str) -> None:
    assert check_url(url) == url
    assert validate_config(config(webhooks=[{"url": url}])).destinations[0].webhooks[0].url == url


@pytest.mark.parametrize(("url", "why"), list(BAD_URLS.items()), ids=list(range(len(BAD_URLS))))
def test_bad_urls(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        check_url(url)
    problem = only_problem(config(webhooks=[{"url": "https://example.com/ok"}, {"url": url}]))
    assert problem.startswith("destinations[0] (hooks-1).webhooks[1].url: ")
    assert why in problem


def test_url_is_required() -> None:
    assert only_problem(config(webhooks=[{"headers": {}}])) == (
        "destinations[0] (hooks-1).webhooks[0].url: is required"
    )


# ---- headers ---------------------------------------------------------------------------------------


def hook_headers(headers: Any) -> dict[str, Any]:
    return config(webhooks=[{"url": "https://example.com/hook", "headers": headers}])


def test_good_headers() -> None:
    headers = {
        "Authorization": "Bearer abc",
        "X-Api-Key": "k-123",
        "x_custom.header~1": "tab\tinside and spaces",
        "X-Empty": "",
        "X-Unicode": "Zoë",
    }
    assert validate_config(hook_headers(headers)).destinations[0].webhooks[0].headers == headers


@pytest.mark.parametrize("value", ["a\r\nX-Injected: 1", "a\nb", "a\rb", "a\x00b"])
def test_header_values_that_break_http(value: str) -> None:
    problem = only_problem(hook_headers({"X-Token": value}))
    assert problem.startswith("destinations[0] (hooks-1).webhooks[0].headers: ")
    assert "'X-Token'" in problem
    assert "line break or NUL" in problem


@pytest.mark.parametrize(
    "name", ["Bad Header", "", "X-Ünïcode", "X:Colon", "X-Token\r\n", "(x)", "a/b"]
)
def test_bad_header_names(name: str) -> None:
    problem = only_problem(hook_headers({name: "v"}))
    assert problem.startswith("destinations[0] (hooks-1).webhooks[0].headers: ")
    assert "not a valid HTTP header name" in problem


@pytest.mark.parametrize(
    "name",
    [
        "Content-Length",
        "content-length",
        "Content-Type",
        "Host",
        "HOST",
        "Transfer-Encoding",
        "Connection",
        "X-Signature",
        "x-signature",
        "Webhook-Signature",
    ],
)
def test_reserved_headers(name: str) -> None:
    assert name.lower() in RESERVED_HEADERS
    problem = only_problem(hook_headers({name: "v"}))
    assert problem.startswith("destinations[0] (hooks-1).webhooks[0].headers: ")
    assert "set by the pipeline" in problem


@pytest.mark.parametrize("value", [5, True, None, ["a"], {"a": "b"}])
def test_header_values_must_be_strings(value: Any) -> None:
    problem = only_problem(hook_headers({"X-Num": value}))
    assert problem.startswith("destinations[0] (hooks-1).webhooks[0].headers.X-Num: ")


def test_headers_must_be_a_mapping() -> None:
    assert only_problem(hook_headers(["Authorization: x"])).startswith(
        "destinations[0] (hooks-1).webhooks[0].headers: "
    )


def test_too_many_headers_and_too_long_values() -> None:
    many = {f"X-H{i}": "v" for i in range(51)}
    assert "over the limit of 50" in only_problem(hook_headers(many))
    assert "over the limit" in only_problem(hook_headers({"X-Long": "v" * 9000}))


# ---- ids, references, unknown keys -----------------------------------------------------------------


def test_unknown_source_is_rejected() -> None:
    assert only_problem(config(sources=["web", "nope"])) == (
        "destinations[0] (hooks-1).sources: unknown source 'nope'; known: ios, web"
    )
    problem = only_problem(
        {"destinations": [{"id": "d", "sources": ["x"], "webhooks": [{"url": "https://e.com"}]}]}
    )
    assert problem == "destinations[0] (d).sources: unknown source 'x'; known: none"


def test_destination_needs_a_source() -> None:
    assert only_problem(config(sources=[])) == (
        "destinations[0] (hooks-1).sources: needs at least one entry"
    )


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({**VALID, "extra": 1}, "extra"),
        (config(secret="s"), "destinations[0] (hooks-1).secret"),
        (
            config(webhooks=[{"url": "https://e.com", "method": "PUT"}]),
            "destinations[0] (hooks-1).webhooks[0].method",
        ),
        ({"sources": [{"id": "web", "writeKeys": ["k"]}]}, "sources[0] (web).writeKeys"),
    ],
)
def test_unknown_keys_are_rejected(data: dict[str, Any], where: str) -> None:
    assert only_problem(data) == f"{where}: is not a known field"


@pytest.mark.parametrize("ident", ["bad id", "", "-starts-with-dash", "a" * 129, "ü"])
def test_bad_ids(ident: str) -> None:
    problem = only_problem(config(id=ident))
    assert problem.startswith("destinations[0]")
    assert ".id: must be 1-128 letters" in problem


def test_duplicate_ids() -> None:
    data = copy.deepcopy(VALID)
    data["sources"].append({"id": "web"})
    data["destinations"].append(copy.deepcopy(data["destinations"][0]))
    found = problems(data)
    assert "sources: the id 'web' is used more than once" in found
    assert "destinations: the id 'hooks-1' is used more than once" in found
    assert len(found) == 2


def test_duplicate_write_keys_across_sources() -> None:
    data = copy.deepcopy(VALID)
    data["sources"][1]["write_keys"].append("wk_live_1")
    problem = only_problem(data)
    assert problem.startswith("sources")
    assert "(ios).write_keys" in problem
    assert "'web'" in problem
    assert "unique" in problem


def test_repeated_write_key_within_one_source_is_allowed() -> None:
    data = copy.deepcopy(VALID)
    data["sources"][0]["write_keys"] = ["k", "k"]
    validate_config(data)


def test_empty_write_key_is_rejected() -> None:
    data = copy.deepcopy(VALID)
    data["sources"][0]["write_keys"] = [""]
    assert only_problem(data).startswith("sources[0] (web).write_keys[0]: ")


def test_empty_shared_secret_is_rejected() -> None:
    assert only_problem(config(shared_secret="")).startswith(
        "destinations[0] (hooks-1).shared_secret: "
    )


@pytest.mark.parametrize("data", [[1, 2], "sources: []", 5])
def test_config_must_be_a_mapping(data: object) -> None:
    assert only_problem(data) == "config: must be a mapping with 'sources' and 'destinations'"


def test_every_problem_is_reported_at_once() -> None:
    data = copy.deepcopy(VALID)
    data["destinations"][0]["webhooks"] = [
        {"url": "ftp://a"},
        {"url": "https://b", "headers": {"Host": "x"}},
    ]
    data["destinations"].append(
        {"id": "hooks-2", "sources": ["web"], "webhooks": [{"url": "https://c"}] * 6}
    )
    found = problems(data)
    assert len(found) == 3
    assert found[0].startswith("destinations[0] (hooks-1).webhooks[0].url: ")
    assert found[1].startswith("destinations[0] (hooks-1).webhooks[1].headers: ")
    assert (
        found[2] == "destinations[1] (hooks-2).webhooks: at most 5 webhooks per destination, got 6"
    )


def test_config_error_message_lists_problems() -> None:
    with pytest.raises(ConfigError) as info:
        validate_config(config(webhooks=[]))
    assert str(info.value).startswith("invalid config:\n  - destinations[0] (hooks-1).webhooks")


# ---- ConfigTable -----------------------------------------------------------------------------------


def dest(
    ident: str, sources: list[str], *, enabled: bool = True, name: str = "Webhooks"
) -> Destination:
    return Destination(
        id=ident,
        name=name,
        enabled=enabled,
        sources=sources,
        webhooks=[{"url": f"https://example.com/{ident}"}],  # type: ignore[list-item]
    )


def test_config_table_lookups() -> None:
    web = Source(id="web", write_keys=["wk1", "wk2"])
    ios = Source(id="ios", write_keys=["wk3"])
    table = ConfigTable.build(
        [web, ios],
        [
            dest("z-last", ["web"]),
            dest("a-first", ["web", "ios"]),
            dest("off", ["web", "ios"], enabled=False),
        ],
    )
    assert table.source_for_write_key("wk1") is web
    assert table.source_for_write_key("wk2") is web
    assert table.source_for_write_key("wk3") is ios
    assert table.source_for_write_key("nope") is None
    assert table.source_for_write_key("") is None
    assert [d.id for d in table.enabled_destinations("web")] == ["a-first", "z-last"]
    assert [d.id for d in table.enabled_destinations("ios")] == ["a-first"]
    assert table.enabled_destinations("unknown") == ()
    # a disabled destination is still known (for the delivery worker), just never chosen
    assert table.destinations["off"].enabled is False
    assert set(table.sources) == {"web", "ios"}


def test_config_table_from_validated_config() -> None:
    result = validate_config(VALID)
    table = ConfigTable.build(result.sources, result.destinations)
    source = table.source_for_write_key("wk_live_1")
    assert source is not None and source.id == "web"
    assert [d.id for d in table.enabled_destinations("web")] == ["hooks-1"]
    assert table.enabled_destinations("ios") == ()


def test_empty_config_table() -> None:
    table = ConfigTable()
    assert table.source_for_write_key("wk") is None
    assert table.enabled_destinations("web") == ()


# ---- delivery policy -------------------------------------------------------------------------------

POLICY: dict[str, Any] = {
    "retry": {"delays": ["10s", "1m", "5m", "30m", "1h"], "deadline": "4h"},
    "max_in_flight": 200,
    "rate_limit": 50,
    "disable_after": "24h",
    "ordering": "per_user",
}


def test_a_full_delivery_policy() -> None:
    dest = validate_config(config(**POLICY)).destinations[0]
    assert dest.retry == RetryPolicy(delays=[10.0, 60.0, 300.0, 1800.0, 3600.0], deadline=14400.0)
    assert dest.max_in_flight == 200
    assert dest.rate_limit == 50.0
    assert dest.disable_after == 86400.0
    assert (dest.ordering, dest.ordered) == (Ordering.PER_USER, True)
    assert (dest.disabled_reason, dest.disabled_at) == (None, None)


def test_policy_defaults_when_absent() -> None:
    dest = validate_config(VALID).destinations[0]
    assert dest.retry is None  # the global PIPELINE_RETRY_DELAYS and PIPELINE_RETRY_DEADLINE
    assert dest.max_in_flight is None
    assert dest.rate_limit is None
    assert dest.disable_after is None
    assert (dest.ordering, dest.ordered) == (Ordering.NONE, False)  # calls as they come
    assert (dest.disabled_reason, dest.disabled_at) == (None, None)


def test_ordering_none_written_out_is_the_default() -> None:
    assert validate_config(config(ordering="none")).destinations[0].ordering is Ordering.NONE


def test_a_batch_with_its_limits_in_the_files_units() -> None:
    batched = config(batch={"max_events": 50, "max_bytes": "64KiB", "max_wait": "250ms"})
    batch = validate_config(batched).destinations[0].batch
    assert batch == Batch(max_events=50, max_bytes=65536, max_wait=0.25)
    defaults = validate_config(config(batch={})).destinations[0].batch
    assert defaults == Batch(max_events=100, max_bytes=500_000, max_wait=1.0)
    assert validate_config(VALID).destinations[0].batch is None  # one call a request


@pytest.mark.parametrize(
    ("written", "message"),
    [
        ({"batch": {"max_events": 0}}, ".batch.max_events: must be at least 1, got 0"),
        ({"batch": {"max_events": 1001}}, ".batch.max_events: must be at most 1000, got 1001"),
        (
            {"batch": {"max_bytes": "lots"}},
            ".batch.max_bytes: must be a size such as 500KB, 1MB or a number of bytes, got 'lots'",
        ),
        ({"batch": {"max_bytes": 100}}, ".batch.max_bytes: must be at least 1024, got 100"),
        (
            {"batch": {"max_bytes": "6MB"}},
            ".batch.max_bytes: must be at most 5000000, got '6MB'",
        ),
        ({"batch": {"max_wait": "2m"}}, ".batch.max_wait: '2m' is over the maximum of 1m"),
        ({"batch": {"max_wait": "1ms"}}, ".batch.max_wait: '1ms' is under the minimum of 10ms"),
        ({"batch": {"size": 10}}, ".batch.size: is not a known field"),
        ({"batch": 100}, ".batch: must be a mapping (key: value)"),
        (
            {"batch": {}, "ordering": "per_user"},
            ": batch cannot be combined with ordering: per_user",
        ),
        (
            {"batch": {"max_events": 100}, "max_in_flight": 10},
            ": max_in_flight (10) is under batch.max_events (100): a batch could never fill",
        ),
    ],
)
def test_a_bad_batch_is_named(written: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        validate_config(config(**written))
    assert f"destinations[0] (hooks-1){message}" in str(caught.value)


NOW = 1_795_000_000.0  # 2026-11-18T08:26:40Z
ROTATING = {
    "shared_secret": "new-s3cret",
    "previous_secrets": [
        {"secret": "older", "until": "2026-11-19T08:26:40Z"},
        {"secret": "old", "until": "2026-11-18T20:26:40Z"},
    ],
}


@pytest.mark.parametrize(
    ("written", "message"),
    [
        (
            {"previous_secrets": [{"secret": "old", "until": "2026-11-26T08:26:41Z"}]},
            ".previous_secrets[0].until: 2026-11-26T08:26:41Z is more than 7d away; "
            "a rotation window is at most 7d",
        ),
        (
            {"previous_secrets": [{"secret": "old", "until": "2026-11-19T00:00:00"}]},
            ".previous_secrets[0].until: must be a time with its zone, e.g. "
            "2026-12-01T00:00:00Z, got '2026-11-19T00:00:00'",
        ),
        (
            {"previous_secrets": [{"secret": "old", "until": "soon"}]},
            ".previous_secrets[0].until: must be a time with its zone",
        ),
        (
            {"previous_secrets": [{"secret": "new-s3cret", "until": "2026-11-19T00:00:00Z"}]},
            ": previous_secrets repeats the shared_secret",
        ),
        (
            {
                "shared_secret": None,
                "previous_secrets": [{"secret": "old", "until": "2026-11-19T00:00:00Z"}],
            },
            ": previous_secrets needs a shared_secret",
        ),
        (
            {"previous_secrets": [{"until": "2026-11-19T00:00:00Z"}]},
            ".previous_secrets[0].secret: is required",
        ),
        ({"signing": "rsa"}, ".signing: must be 'ed25519', got 'rsa'"),
        (
            {"proxy": "socks5://p:1080"},
            ".proxy: 'socks5://p:1080' must be an http:// or https:// proxy",
        ),
        ({"proxy": "http://u:pw@p:3128/x"}, ".proxy: 'http://u:••••@p:3128/x' must be only scheme"),
        ({"signing_key": "whsk_" + "A" * 43 + "="}, ": signing_key needs signing: ed25519"),
        (
            {"signing": "ed25519", "signing_key": "whsk_AAAA"},
            ".signing_key: is not an Ed25519 signing key: it must hold 32 bytes, not 3",
        ),
    ],
)
def test_a_bad_rotation_is_named(written: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        validate_config(config(**{"shared_secret": "new-s3cret", **written}), now=NOW)
    assert f"destinations[0] (hooks-1){message}" in str(caught.value)


def test_retry_keys_are_optional_each() -> None:
    only_delays = validate_config(config(retry={"delays": ["30s"]})).destinations[0].retry
    assert only_delays == RetryPolicy(delays=[30.0], deadline=None)
    only_deadline = validate_config(config(retry={"deadline": "2h"})).destinations[0].retry
    assert only_deadline == RetryPolicy(delays=None, deadline=7200.0)
    # an empty policy says nothing: stored as no policy, so it compares equal after a Kafka trip
    assert validate_config(config(retry={})).destinations[0].retry is None


@pytest.mark.parametrize(
    ("written", "seconds"),
    [("1s", 1.0), ("1.5m", 90.0), ("7d", 604800.0), (30, 30.0), (2.5, 2.5), ("45", 45.0)],
)
def test_retry_delays_take_durations_or_seconds(written: Any, seconds: float) -> None:
    retry = validate_config(config(retry={"delays": [written]})).destinations[0].retry
    assert retry is not None and retry.delays == [seconds]


def test_disabled_state_is_accepted_in_yaml() -> None:
    dest = validate_config(
        config(disabled_reason="every attempt failed for 24h", disabled_at=1_795_273_500_000)
    ).destinations[0]
    assert dest.disabled_reason == "every attempt failed for 24h"
    assert dest.disabled_at == 1_795_273_500_000


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (
            {"retry": {"delays": ["10s", "1m", "10x"]}},
            "destinations[0] (hooks-1).retry.delays[2]: '10x' is not a duration; "
            "use a number with a unit, e.g. 500ms, 10s, 1m, 4h",
        ),
        (
            {"retry": {"delays": ["10s", 0]}},
            "destinations[0] (hooks-1).retry.delays[1]: 0s is under the minimum of 1s",
        ),
        (
            {"retry": {"delays": ["0s"]}},
            "destinations[0] (hooks-1).retry.delays[0]: '0s' is under the minimum of 1s",
        ),
        (
            {"retry": {"delays": ["500ms"]}},
            "destinations[0] (hooks-1).retry.delays[0]: '500ms' is under the minimum of 1s",
        ),
        (
            {"retry": {"delays": ["8d"]}},
            "destinations[0] (hooks-1).retry.delays[0]: '8d' is over the maximum of 7d",
        ),
        (
            {"retry": {"delays": [True]}},
            "destinations[0] (hooks-1).retry.delays[0]: True is not a duration; "
            "use a number with a unit, e.g. 500ms, 10s, 1m, 4h",
        ),
        (
            {"retry": {"delays": [float("nan")]}},
            "destinations[0] (hooks-1).retry.delays[0]: nan is not a duration; "
            "use a number with a unit, e.g. 500ms, 10s, 1m, 4h",
        ),
        (
            {"retry": {"delays": []}},
            "destinations[0] (hooks-1).retry.delays: needs at least one entry",
        ),
        (
            {"retry": {"delays": ["1m"] * 21}},
            "destinations[0] (hooks-1).retry.delays: has 21 entries, over the limit of 20",
        ),
        (
            {"retry": {"deadline": "30s"}},
            "destinations[0] (hooks-1).retry.deadline: '30s' is under the minimum of 1m",
        ),
        (
            {"retry": {"deadline": "8d"}},
            "destinations[0] (hooks-1).retry.deadline: '8d' is over the maximum of 7d",
        ),
        (
            {"retry": {"delay": ["10s"]}},
            "destinations[0] (hooks-1).retry.delay: is not a known field",
        ),
        (
            {"retry": "4h"},
            "destinations[0] (hooks-1).retry: must be a mapping (key: value)",
        ),
        (
            {"max_in_flight": 0},
            "destinations[0] (hooks-1).max_in_flight: must be at least 1, got 0",
        ),
        (
            {"max_in_flight": 100_001},
            "destinations[0] (hooks-1).max_in_flight: must be at most 100000, got 100001",
        ),
        (
            {"max_in_flight": "200"},
            "destinations[0] (hooks-1).max_in_flight: must be a whole number, got '200'",
        ),
        (
            {"disable_after": "30s"},
            "destinations[0] (hooks-1).disable_after: '30s' is under the minimum of 1m",
        ),
        (
            {"disable_after": "31d"},
            "destinations[0] (hooks-1).disable_after: '31d' is over the maximum of 30d",
        ),
        (
            {"disable_after": "soon"},
            "destinations[0] (hooks-1).disable_after: 'soon' is not a duration; "
            "use a number with a unit, e.g. 500ms, 10s, 1m, 4h",
        ),
        (
            {"rate_limit": 0},
            "destinations[0] (hooks-1).rate_limit: must be greater than 0, got 0",
        ),
        (
            {"disabled_at": -1},
            "destinations[0] (hooks-1).disabled_at: must be at least 0, got -1",
        ),
        (
            {"ordering": "fifo"},
            "destinations[0] (hooks-1).ordering: must be 'none' or 'per_user', got 'fifo'",
        ),
        (
            {"ordering": "PER_USER"},
            "destinations[0] (hooks-1).ordering: must be 'none' or 'per_user', got 'PER_USER'",
        ),
        (
            {"ordering": None},
            "destinations[0] (hooks-1).ordering: must be 'none' or 'per_user', got None",
        ),
    ],
    ids=[
        "delay-not-a-duration",
        "delay-zero-number",
        "delay-zero-text",
        "delay-under-1s",
        "delay-over-7d",
        "delay-bool",
        "delay-nan",
        "delays-empty",
        "delays-21",
        "deadline-under-1m",
        "deadline-over-7d",
        "retry-unknown-key",
        "retry-not-a-mapping",
        "max-in-flight-zero",
        "max-in-flight-too-big",
        "max-in-flight-text",
        "disable-after-under-1m",
        "disable-after-over-30d",
        "disable-after-not-a-duration",
        "rate-limit-zero",
        "disabled-at-negative",
        "ordering-unknown",
        "ordering-upper-case",
        "ordering-null",
    ],
)
def test_bad_delivery_policy(policy: dict[str, Any], expected: str) -> None:
    assert only_problem(config(**policy)) == expected


def test_every_bad_delay_is_reported() -> None:
    found = problems(config(retry={"delays": ["1x", "1m", 0], "deadline": "1s"}))
    assert found == [
        "destinations[0] (hooks-1).retry.delays[0]: '1x' is not a duration; "
        "use a number with a unit, e.g. 500ms, 10s, 1m, 4h",
        "destinations[0] (hooks-1).retry.delays[2]: 0s is under the minimum of 1s",
        "destinations[0] (hooks-1).retry.deadline: '1s' is under the minimum of 1m",
    ]


def test_trace_context_is_on_unless_turned_off_and_only_a_boolean() -> None:
    assert validate_config(config()).destinations[0].trace_context is True
    assert validate_config(config(trace_context=False)).destinations[0].trace_context is False
    problem = only_problem(config(trace_context="no"))
    assert "destinations[0] (hooks-1).trace_context: Input should be a valid boolean" in problem
