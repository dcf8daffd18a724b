"""Unit tests for pipeline.core.settings_sources: file, environment, flags, and origins."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.settings import SettingsError
from pipeline.core.settings_sources import load_settings


def write(tmp_path: Path, text: str, name: str = "pipeline.env") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_flags_win_over_the_environment_which_wins_over_the_file(tmp_path: Path) -> None:
    file = write(
        tmp_path,
        "# staging\nPIPELINE_TOPIC_PREFIX=file.\nPIPELINE_PARTITIONS=12\n"
        "export PIPELINE_RETRY_DELAYS=1s,2s\nPIPELINE_BOOTSTRAP_SERVERS=file:9092\n",
    )
    loaded = load_settings(
        {
            "PIPELINE_SETTINGS_FILE": file,
            "PIPELINE_PARTITIONS": "3",
            "PIPELINE_TOPIC_PREFIX": "env.",
        },
        flags={"topic_prefix": "flag."},
    )
    s = loaded.settings
    assert (s.topic_prefix, s.partitions, s.retry_delays) == ("flag.", 3, (1.0, 2.0))
    assert s.bootstrap_servers == "file:9092"
    assert loaded.origins["topic_prefix"] == "flag"
    assert loaded.origins["partitions"] == "environment"
    assert loaded.origins["retry_delays"] == f"file {file}"
    assert loaded.origins["max_in_flight"] == "default"
    assert loaded.file == file


def test_the_file_may_be_given_as_an_argument(tmp_path: Path) -> None:
    file = write(tmp_path, "PIPELINE_MAX_IN_FLIGHT=250\n")
    assert load_settings({}, file=file).settings.max_in_flight == 250


def test_a_typo_in_the_file_names_the_line_and_the_closest_setting(tmp_path: Path) -> None:
    file = write(tmp_path, "PIPELINE_PARTITIONS=12\n\nPIPELINE_RETRY_DELAY=1s\n")
    with pytest.raises(SettingsError) as info:
        load_settings({}, file=file)
    assert info.value.problems == [
        f"{file} line 3: PIPELINE_RETRY_DELAY is not a setting; did you mean PIPELINE_RETRY_DELAYS?"
    ]


def test_a_bad_value_in_the_file_names_the_variable_the_file_and_what_is_allowed(
    tmp_path: Path,
) -> None:
    file = write(tmp_path, "PIPELINE_TRANSACTIONS=maybe\n")
    with pytest.raises(SettingsError) as info:
        load_settings({}, file=file)
    assert info.value.problems == [
        f"PIPELINE_TRANSACTIONS (from file {file}): 'maybe' is not on or off "
        "(on, off, true, false, yes, no, 1, 0)"
    ]


def test_every_problem_is_listed_at_once() -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(
            {"PIPELINE_PARTITIONS": "six", "PIPELINE_RETRY_DEADLINE": "soon", "PIPELINE_LOG": "x"}
        )
    assert [p.split(":")[0] for p in info.value.problems] == [
        "PIPELINE_PARTITIONS",
        "PIPELINE_RETRY_DEADLINE",
        "PIPELINE_LOG",
    ]
    assert "'soon' is not a duration; use a number with a unit" in info.value.problems[1]


def test_a_missing_settings_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="PIPELINE_SETTINGS_FILE: .* does not exist"):
        load_settings({"PIPELINE_SETTINGS_FILE": str(tmp_path / "nope.env")})


def test_a_line_without_a_value_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="PIPELINE_LOG has no value"):
        load_settings({}, file=write(tmp_path, "PIPELINE_LOG\n"))


def test_secrets_are_secret_types_and_never_in_the_repr() -> None:
    loaded = load_settings(
        {
            "PIPELINE_KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
            "PIPELINE_KAFKA_SASL_MECHANISM": "scram-sha-512",
            "PIPELINE_KAFKA_SASL_USERNAME": "alice",
            "PIPELINE_KAFKA_SASL_PASSWORD": "hunter2",
            "PIPELINE_SCHEMA_REGISTRY_BASIC_AUTH": "sr:topsecret",
            "PIPELINE_ADMIN_TOKEN": "admintoken",
            "PIPELINE_CONSOLE_PASSWORD": "consolepw",
        }
    )
    s = loaded.settings
    for secret in ("hunter2", "topsecret", "admintoken", "consolepw"):
        assert secret not in repr(s)
        assert secret not in str(s)
    assert s.secret("kafka_sasl_password") == "hunter2"
    assert s.kafka_client.common["sasl.password"] == "hunter2"
    assert s.kafka_client.common["security.protocol"] == "SASL_SSL"


def test_a_kafka_properties_file_names_the_cluster_and_registry_unless_given(
    tmp_path: Path,
) -> None:
    props = write(
        tmp_path,
        "bootstrap.servers=kafka-1:9093\nschema.registry.url=https://registry:8081\n"
        "basic.auth.user.info=u:p\n",
        "client.properties",
    )
    loaded = load_settings({"PIPELINE_KAFKA_CONFIG": props})
    assert loaded.settings.bootstrap_servers == "kafka-1:9093"
    assert loaded.settings.schema_registry_url == "https://registry:8081"
    assert loaded.settings.secret("schema_registry_basic_auth") == "u:p"
    assert loaded.origins["bootstrap_servers"] == f"{props} line 1"
    given = load_settings(
        {"PIPELINE_KAFKA_CONFIG": props, "PIPELINE_BOOTSTRAP_SERVERS": "other:9092"}
    )
    assert given.settings.bootstrap_servers == "other:9092"
    assert given.origins["bootstrap_servers"] == "environment"


def test_a_bad_kafka_properties_file_is_a_settings_error_before_any_connection(
    tmp_path: Path,
) -> None:
    props = write(tmp_path, "security.protocol=SSL\nssl.ca.locaton=/x\n", "client.properties")
    with pytest.raises(SettingsError, match="did you mean ssl.ca.location"):
        load_settings({"PIPELINE_KAFKA_CONFIG": props})


def test_replace_keeps_what_was_given_and_adds_the_change() -> None:
    s = load_settings({"PIPELINE_PARTITIONS": "4"}).settings
    assert s.model_fields_set == {"partitions"}
    changed = s.replace(transactions=False)
    assert changed.model_fields_set == {"partitions", "transactions"}
    assert changed.partitions == 4
