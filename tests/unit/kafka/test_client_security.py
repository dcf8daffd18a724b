"""The librdkafka configs every client gets, for each security mode: what reaches librdkafka.

Each config is also handed to a real librdkafka client (without bootstrap servers, so nothing
connects): librdkafka itself accepts every property name and value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trustme
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from pipeline.core.settings import Settings
from pipeline.kafka.clients import admin_config, consumer_config, producer_config


@pytest.fixture(scope="module")
def pems(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    ca = trustme.CA()
    client = ca.issue_cert("client@example")
    folder = tmp_path_factory.mktemp("pems")
    paths = {name: str(folder / f"{name}.pem") for name in ("ca", "cert", "key")}
    ca.cert_pem.write_to_path(paths["ca"])
    client.cert_chain_pems[0].write_to_path(paths["cert"])
    client.private_key_pem.write_to_path(paths["key"])
    return paths


def modes(pems: dict[str, str]) -> dict[str, tuple[dict[str, Any], dict[str, str]]]:
    """Mode → (settings, the properties every client must carry)."""
    scram = {"kafka_sasl_username": "alice", "kafka_sasl_password": "pw"}
    return {
        "PLAINTEXT": ({}, {}),
        "SSL": (
            {"kafka_security_protocol": "SSL", "kafka_ssl_ca_location": pems["ca"]},
            {"security.protocol": "SSL", "ssl.ca.location": pems["ca"]},
        ),
        "mTLS": (
            {
                "kafka_security_protocol": "SSL",
                "kafka_ssl_ca_location": pems["ca"],
                "kafka_ssl_certificate_location": pems["cert"],
                "kafka_ssl_key_location": pems["key"],
            },
            {
                "security.protocol": "SSL",
                "ssl.certificate.location": pems["cert"],
                "ssl.key.location": pems["key"],
            },
        ),
        "SASL_SSL PLAIN": (
            {"kafka_security_protocol": "SASL_SSL", "kafka_sasl_mechanism": "PLAIN", **scram},
            {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "PLAIN",
                "sasl.username": "alice",
                "sasl.password": "pw",
            },
        ),
        "SASL_PLAINTEXT SCRAM-SHA-256": (
            {
                "kafka_security_protocol": "SASL_PLAINTEXT",
                "kafka_sasl_mechanism": "SCRAM-SHA-256",
                **scram,
            },
            {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256"},
        ),
        "SASL_SSL SCRAM-SHA-512": (
            {
                "kafka_security_protocol": "SASL_SSL",
                "kafka_sasl_mechanism": "SCRAM-SHA-512",
                **scram,
            },
            {"sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice"},
        ),
        "SASL_SSL OAUTHBEARER oidc": (
            {
                "kafka_security_protocol": "SASL_SSL",
                "kafka_sasl_mechanism": "OAUTHBEARER",
                "kafka_sasl_oauthbearer_method": "oidc",
                "kafka_sasl_oauthbearer_client_id": "cid",
                "kafka_sasl_oauthbearer_client_secret": "csecret",
                "kafka_sasl_oauthbearer_token_endpoint_url": "https://idp.example.com/token",
                "kafka_sasl_oauthbearer_scope": "kafka",
            },
            {
                "sasl.mechanism": "OAUTHBEARER",
                "sasl.oauthbearer.method": "oidc",
                "sasl.oauthbearer.client.id": "cid",
                "sasl.oauthbearer.client.secret": "csecret",
                "sasl.oauthbearer.token.endpoint.url": "https://idp.example.com/token",
                "sasl.oauthbearer.scope": "kafka",
            },
        ),
    }


MODES = [
    "PLAINTEXT",
    "SSL",
    "mTLS",
    "SASL_SSL PLAIN",
    "SASL_PLAINTEXT SCRAM-SHA-256",
    "SASL_SSL SCRAM-SHA-512",
    "SASL_SSL OAUTHBEARER oidc",
]


@pytest.mark.parametrize("mode", MODES)
def test_every_client_kind_carries_the_security_settings(mode: str, pems: dict[str, str]) -> None:
    values, expected = modes(pems)[mode]
    settings = Settings(**values)
    configs = {
        "producer": producer_config(settings),
        "consumer": consumer_config(settings, "g"),
        "admin": admin_config(settings),
    }
    for kind, config in configs.items():
        for key, value in expected.items():
            assert config.get(key) == value, (kind, key)
        if not expected:
            assert not any(k.startswith(("sasl.", "ssl.", "security.")) for k in config), kind


@pytest.mark.parametrize("mode", MODES)
def test_librdkafka_accepts_every_config(mode: str, pems: dict[str, str]) -> None:
    settings = Settings(**modes(pems)[mode][0])

    def offline(config: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in config.items() if k != "bootstrap.servers"}

    Producer(offline(producer_config(settings))).flush(0)
    Consumer(offline(consumer_config(settings, "g"))).close()
    AdminClient(offline(admin_config(settings)))


def test_consumer_and_producer_properties_go_only_to_their_kind(tmp_path: Path) -> None:
    props = tmp_path / "client.properties"
    props.write_text("session.timeout.ms=45000\nlinger.ms=20\nclient.id=acme\n")
    settings = Settings(kafka_config=str(props))
    producer, consumer = producer_config(settings), consumer_config(settings, "g")
    assert producer["linger.ms"] == "20" and "session.timeout.ms" not in producer
    assert consumer["session.timeout.ms"] == "45000" and "linger.ms" not in consumer
    assert producer["client.id"] == consumer["client.id"] == admin_config(settings)["client.id"]
    # The pipeline's own guarantees stay whatever the file says.
    assert producer["enable.idempotence"] is True and producer["acks"] == "all"
    assert consumer["isolation.level"] == "read_committed"


def test_the_session_timeout_setting_wins_over_the_files(tmp_path: Path) -> None:
    props = tmp_path / "client.properties"
    props.write_text("session.timeout.ms=45000\n")
    settings = Settings(kafka_config=str(props), session_timeout=6.0)
    assert consumer_config(settings, "g")["session.timeout.ms"] == 6000
