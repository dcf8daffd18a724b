"""Unit tests for pipeline.core.settings: every knob, read from the environment."""

from __future__ import annotations

import pydantic
import pytest

from pipeline import Settings


def test_defaults() -> None:
    s = Settings()
    assert s.bootstrap_servers == "127.0.0.1:9092"
    assert s.topic_prefix == ""
    assert s.retry_delays == (10.0, 60.0, 300.0, 1800.0, 3600.0)
    assert s.retry_deadline == 4 * 3600.0
    assert s.delivery_timeout == 5.0  # seed §4.1
    assert s.session_timeout is None
    assert s.schema_registry_url is None
    assert s.transactions is True
    assert s.commit_interval == 0.1
    assert Settings.from_env({}) == s


def test_from_env_reads_every_variable() -> None:
    s = Settings.from_env(
        {
            "PIPELINE_BOOTSTRAP_SERVERS": "kafka-1:9092,kafka-2:9092",
            "PIPELINE_TOPIC_PREFIX": "staging.",
            "PIPELINE_SCHEMA_REGISTRY_URL": "http://registry:8081",
            "PIPELINE_PARTITIONS": "12",
            "PIPELINE_RETRY_PARTITIONS": "4",
            "PIPELINE_REPLICATION_FACTOR": "3",
            "PIPELINE_MAX_IN_FLIGHT": "250",
            "PIPELINE_MAX_CONNECTIONS_PER_HOST": "20",
            "PIPELINE_RETRY_DELAYS": "1s,2s,500ms",
            "PIPELINE_RETRY_DEADLINE": "8s",
            "PIPELINE_DELIVERY_TIMEOUT": "1500ms",
            "PIPELINE_SESSION_TIMEOUT": "6s",
            "PIPELINE_TRANSACTIONS": "off",
            "PIPELINE_COMMIT_INTERVAL": "250ms",
            "UNRELATED": "x",
        }
    )
    assert s == Settings(
        bootstrap_servers="kafka-1:9092,kafka-2:9092",
        topic_prefix="staging.",
        schema_registry_url="http://registry:8081",
        partitions=12,
        retry_partitions=4,
        replication_factor=3,
        max_in_flight=250,
        max_connections_per_host=20,
        retry_delays=(1.0, 2.0, 0.5),
        retry_deadline=8.0,
        delivery_timeout=1.5,
        session_timeout=6.0,
        transactions=False,
        commit_interval=0.25,
    )


@pytest.mark.parametrize(
    ("word", "value"),
    [("on", True), ("ON", True), ("true", True), ("1", True), ("off", False), ("No", False)],
)
def test_transactions_take_on_and_off(word: str, value: bool) -> None:
    assert Settings.from_env({"PIPELINE_TRANSACTIONS": word}).transactions is value


@pytest.mark.parametrize(
    ("word", "value"),
    [("", 24 * 3600.0), ("1h", 3600.0), ("90", 90.0), ("off", None), ("No", None)],
)
def test_the_dedupe_window_is_a_duration_or_off(word: str, value: float | None) -> None:
    assert Settings.from_env({"PIPELINE_DEDUPE_WINDOW": word}).dedupe_window == value


def test_design_examples() -> None:
    s = Settings.from_env(
        {
            "PIPELINE_RETRY_DELAYS": "10s,1m,5m,30m,1h",
            "PIPELINE_RETRY_DEADLINE": "4h",
            "PIPELINE_DELIVERY_TIMEOUT": "5s",
        }
    )
    assert s.retry_delays == (10.0, 60.0, 300.0, 1800.0, 3600.0)
    assert s.retry_deadline == 14400.0
    assert s.delivery_timeout == 5.0


def test_empty_values_keep_the_defaults() -> None:
    s = Settings.from_env(
        {"PIPELINE_RETRY_DELAYS": "", "PIPELINE_PARTITIONS": "", "PIPELINE_TOPIC_PREFIX": ""}
    )
    assert s == Settings()


def test_from_env_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELINE_DELIVERY_TIMEOUT", "2s")
    monkeypatch.setenv("PIPELINE_TOPIC_PREFIX", "envtest.")
    s = Settings.from_env()
    assert s.delivery_timeout == 2.0
    assert s.topic_prefix == "envtest."


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("PIPELINE_RETRY_DELAYS", "10s,soon"),
        ("PIPELINE_RETRY_DELAYS", "10s,0s"),
        ("PIPELINE_RETRY_DELAYS", ","),
        ("PIPELINE_RETRY_DELAYS", "-1s"),
        ("PIPELINE_RETRY_DEADLINE", "four hours"),
        ("PIPELINE_RETRY_DEADLINE", "0"),
        ("PIPELINE_DELIVERY_TIMEOUT", "5 sec"),
        ("PIPELINE_DELIVERY_TIMEOUT", "0ms"),
        ("PIPELINE_SESSION_TIMEOUT", "x"),
        ("PIPELINE_PARTITIONS", "six"),
        ("PIPELINE_PARTITIONS", "1.5"),
        ("PIPELINE_RETRY_PARTITIONS", "3x"),
        ("PIPELINE_REPLICATION_FACTOR", "one"),
        ("PIPELINE_MAX_IN_FLIGHT", "lots"),
        ("PIPELINE_MAX_CONNECTIONS_PER_HOST", "100.0"),
        ("PIPELINE_TRANSACTIONS", "maybe"),
        ("PIPELINE_COMMIT_INTERVAL", "often"),
        ("PIPELINE_COMMIT_INTERVAL", "0s"),
        ("PIPELINE_DEDUPE_WINDOW", "a day"),
        ("PIPELINE_DEDUPE_WINDOW", "0s"),
    ],
)
def test_malformed_values_name_the_variable(variable: str, value: str) -> None:
    with pytest.raises(ValueError) as info:
        Settings.from_env({variable: value})
    assert variable in str(info.value)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("PIPELINE_PARTITIONS", "0"),
        ("PIPELINE_PARTITIONS", "-3"),
        ("PIPELINE_RETRY_PARTITIONS", "0"),
        ("PIPELINE_REPLICATION_FACTOR", "0"),
        ("PIPELINE_MAX_IN_FLIGHT", "0"),
    ],
)
def test_out_of_range_numbers_name_the_variable(variable: str, value: str) -> None:
    with pytest.raises(ValueError) as info:
        Settings.from_env({variable: value})
    assert variable in str(info.value)


@pytest.mark.parametrize("value", ["0", "-1"])
def test_max_connections_per_host_must_be_at_least_one(value: str) -> None:
    # aiohttp reads limit_per_host=0 as "no limit": a zero here must not silently lift the cap
    with pytest.raises(ValueError, match="PIPELINE_MAX_CONNECTIONS_PER_HOST"):
        Settings.from_env({"PIPELINE_MAX_CONNECTIONS_PER_HOST": value})
    with pytest.raises(ValueError, match="PIPELINE_MAX_CONNECTIONS_PER_HOST: must be at least 1"):
        Settings().replace(max_connections_per_host=int(value))


@pytest.mark.parametrize(
    "field", ["partitions", "retry_partitions", "replication_factor", "max_in_flight"]
)
def test_validated_rejects_counts_below_one(field: str) -> None:
    with pytest.raises(ValueError, match=f"^PIPELINE_{field.upper()}: must be at least 1"):
        Settings().replace(**{field: 0})


def test_replace_validates_and_keeps_the_rest() -> None:
    s = Settings().replace(retry_delays=(1.0, 2.0), retry_deadline=8.0)
    assert s.retry_delays == (1.0, 2.0)
    assert s.retry_deadline == 8.0
    assert s.delivery_timeout == 5.0
    with pytest.raises(ValueError, match="PIPELINE_RETRY_DELAYS: is empty"):
        Settings().replace(retry_delays=())


def test_settings_are_frozen() -> None:
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        Settings().partitions = 3  # type: ignore[misc]


def test_the_trace_url_template_is_an_http_url_with_the_trace_id_in_it() -> None:
    jaeger = "http://localhost:16686/trace/{trace_id}"
    assert Settings.from_env({"PIPELINE_TRACE_URL_TEMPLATE": jaeger}).trace_url_template == jaeger
    assert Settings.from_env({}).trace_url_template is None
    with pytest.raises(ValueError, match="PIPELINE_TRACE_URL_TEMPLATE.*must hold \\{trace_id\\}"):
        Settings.from_env({"PIPELINE_TRACE_URL_TEMPLATE": "http://localhost:16686/trace/"})
    with pytest.raises(ValueError, match="PIPELINE_TRACE_URL_TEMPLATE.*http:// or https://"):
        Settings.from_env({"PIPELINE_TRACE_URL_TEMPLATE": "javascript:alert('{trace_id}')"})
