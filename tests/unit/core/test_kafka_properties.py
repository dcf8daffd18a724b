"""Unit tests for pipeline.core.kafka_properties: a client.properties file, overrides, checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.kafka_properties import (
    ClientProperties,
    KafkaPropertiesError,
    Sourced,
    is_secret,
    mask,
    read_properties,
)

#: What Confluent Cloud hands out for a Python (librdkafka) client, filled in.
CONFLUENT_CLOUD = """\
# Required connection configs for Kafka producer, consumer, and admin
bootstrap.servers=pkc-abc12.eu-west-1.aws.confluent.cloud:9092
security.protocol=SASL_SSL
sasl.mechanisms=PLAIN
sasl.username=ABCDEFG
sasl.password=cflt-secret/with=equals

# Best practice for higher availability in librdkafka clients prior to 1.7
session.timeout.ms=45000

# Required connection configs for Confluent Cloud Schema Registry
schema.registry.url=https://psrc-xyz.eu-west-1.aws.confluent.cloud
basic.auth.credentials.source=USER_INFO
basic.auth.user.info=SRKEY:SRSECRET
"""


def write(tmp_path: Path, text: str, name: str = "client.properties") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def build(tmp_path: Path, text: str, **overrides: str) -> ClientProperties:
    return ClientProperties.build(read_properties(write(tmp_path, text)), overrides)


def problems(tmp_path: Path, text: str, **overrides: str) -> list[str]:
    with pytest.raises(KafkaPropertiesError) as info:
        build(tmp_path, text, **overrides)
    return info.value.problems


def test_a_confluent_cloud_file_gives_every_client_its_security_and_the_registry(
    tmp_path: Path,
) -> None:
    props = build(tmp_path, CONFLUENT_CLOUD)
    assert props.common == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "ABCDEFG",
        "sasl.password": "cflt-secret/with=equals",
    }
    assert props.consumer == {"session.timeout.ms": "45000"}
    assert props.producer == {}
    assert props.bootstrap_servers is not None
    assert props.bootstrap_servers.value == "pkc-abc12.eu-west-1.aws.confluent.cloud:9092"
    assert props.registry["schema_registry_url"].value.startswith("https://psrc-xyz")
    assert props.registry["schema_registry_basic_auth"].value == "SRKEY:SRSECRET"
    assert props.origins["sasl.username"].endswith("client.properties line 5")
    assert any("basic.auth.credentials.source is not used" in note for note in props.notes)


def test_the_java_properties_format_is_read_whole(tmp_path: Path) -> None:
    read = read_properties(
        write(tmp_path, "! comment\nsasl.username : alice\nsasl.password   p\\\n    w\nclient.id\n")
    )
    assert read["sasl.username"] == Sourced("alice", f"{tmp_path}/client.properties line 2")
    assert read["sasl.password"].value == "pw"  # a continued line
    assert read["client.id"].origin.endswith("line 5")


def test_a_key_given_twice_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(KafkaPropertiesError, match="sasl.username is set twice"):
        read_properties(write(tmp_path, "sasl.username=a\nsasl.username=b\n"))


def test_a_missing_file_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(KafkaPropertiesError, match="PIPELINE_KAFKA_CONFIG: cannot read"):
        read_properties(tmp_path / "nope.properties")


def test_a_typo_is_an_error_naming_the_line_and_the_closest_property(tmp_path: Path) -> None:
    found = problems(tmp_path, "security.protocol=SSL\nsasl.usernme=alice\n")
    assert found == [
        f"{tmp_path}/client.properties line 2: sasl.usernme is not a librdkafka property; "
        "did you mean sasl.username?"
    ]


def test_properties_the_pipeline_sets_itself_are_refused(tmp_path: Path) -> None:
    found = problems(tmp_path, "enable.idempotence=false\nisolation.level=read_uncommitted\n")
    assert "enable.idempotence: the pipeline sets this itself" in found[0]
    assert "isolation.level: the pipeline sets this itself" in found[1]


def test_acks_all_is_accepted_and_another_acks_refused(tmp_path: Path) -> None:
    assert build(tmp_path, "acks=all\n").producer == {}
    assert "acks: the pipeline sets this itself" in problems(tmp_path, "acks=1\n")[0]


def test_java_only_settings_say_what_librdkafka_uses_instead(tmp_path: Path) -> None:
    found = problems(tmp_path, "ssl.truststore.location=/etc/kafka/truststore.jks\n")
    assert "is a Java client setting; librdkafka uses ssl.ca.location" in found[0]


def test_a_java_jaas_line_becomes_the_user_name_and_password(tmp_path: Path) -> None:
    props = build(
        tmp_path,
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        "username='bob' password=\"b0b\";\n",
    )
    assert props.common["sasl.username"] == "bob"
    assert props.common["sasl.password"] == "b0b"
    assert props.common["sasl.mechanism"] == "SCRAM-SHA-512"


def test_an_oauthbearer_jaas_line_becomes_oidc_client_credentials(tmp_path: Path) -> None:
    props = build(
        tmp_path,
        "security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\n"
        "sasl.oauthbearer.token.endpoint.url=https://idp.example.com/token\n"
        "sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule "
        "required clientId='cid' clientSecret='csecret' scope='kafka' "
        "extension_logicalCluster='lkc-1';\n",
    )
    assert props.common["sasl.oauthbearer.method"] == "oidc"
    assert props.common["sasl.oauthbearer.client.id"] == "cid"
    assert props.common["sasl.oauthbearer.client.secret"] == "csecret"
    assert props.common["sasl.oauthbearer.extensions"] == "logicalCluster=lkc-1"


def test_the_environment_wins_over_the_file_and_is_noted(tmp_path: Path) -> None:
    props = build(tmp_path, CONFLUENT_CLOUD, **{"sasl.password": "from-env"})
    assert props.common["sasl.password"] == "from-env"
    assert props.origins["sasl.password"] == "PIPELINE_KAFKA_SASL_PASSWORD"
    note = next(n for n in props.notes if n.startswith("sasl.password"))
    assert "PIPELINE_KAFKA_SASL_PASSWORD overrides the value in" in note
    assert "from-env" not in note and "cflt-secret" not in note


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"security.protocol": "SASL_TLS"}, "'SASL_TLS' is not one of PLAINTEXT, SSL"),
        ({"security.protocol": "SASL_SSL"}, "needs sasl.mechanism"),
        (
            {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-1"},
            "'SCRAM-SHA-1' is not one of PLAIN, SCRAM-SHA-256",
        ),
        (
            {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256"},
            "needs sasl.username (PIPELINE_KAFKA_SASL_USERNAME)",
        ),
        ({"sasl.username": "a", "sasl.password": "b"}, "does not authenticate with SASL"),
        ({"ssl.ca.location": "/etc/hosts"}, "which does not use TLS"),
        (
            {"security.protocol": "SSL", "ssl.ca.location": "/no/such/ca.pem"},
            "PIPELINE_KAFKA_SSL_CA_LOCATION: ssl.ca.location: /no/such/ca.pem does not exist",
        ),
        (
            {"security.protocol": "SSL", "ssl.certificate.location": "/etc/hosts"},
            "ssl.certificate.location is set without ssl.key.location",
        ),
        (
            {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "OAUTHBEARER",
                "sasl.oauthbearer.method": "oidc",
            },
            "needs sasl.oauthbearer.client.id",
        ),
        ({"sasl.oauthbearer.method": "magic"}, "'magic' is not one of default, oidc"),
    ],
)
def test_settings_that_cannot_work_are_errors_naming_the_source(
    overrides: dict[str, str], expected: str
) -> None:
    with pytest.raises(KafkaPropertiesError) as info:
        ClientProperties.build({}, overrides)
    assert any(expected in problem for problem in info.value.problems), info.value.problems


def test_a_missing_ca_file_in_the_file_names_the_file_and_line(tmp_path: Path) -> None:
    found = problems(tmp_path, "security.protocol=SSL\nssl.ca.location=/nowhere/ca.pem\n")
    assert found == [
        f"{tmp_path}/client.properties line 2: ssl.ca.location: /nowhere/ca.pem does not exist"
    ]


def test_lower_case_enumerations_are_accepted_as_librdkafka_does() -> None:
    props = ClientProperties.build(
        {},
        {
            "security.protocol": "sasl_ssl",
            "sasl.mechanism": "scram-sha-256",
            "sasl.username": "u",
            "sasl.password": "p",
        },
    )
    assert props.common["security.protocol"] == "SASL_SSL"
    assert props.common["sasl.mechanism"] == "SCRAM-SHA-256"


def test_secrets_are_told_apart_and_masked() -> None:
    for name in (
        "sasl.password",
        "ssl.key.password",
        "sasl.oauthbearer.client.secret",
        "sasl.jaas.config",
        "basic.auth.user.info",
    ):
        assert is_secret(name), name
        assert mask(name, "x") == "********"
    for name in ("sasl.username", "ssl.ca.location", "security.protocol"):
        assert not is_secret(name)
        assert mask(name, "x") == "x"
    shown = ClientProperties.build(
        {},
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "u",
            "sasl.password": "hunter2",
        },
    ).describe()
    assert ("sasl.password", "********", "PIPELINE_KAFKA_SASL_PASSWORD") in shown
    assert "hunter2" not in repr(shown)
