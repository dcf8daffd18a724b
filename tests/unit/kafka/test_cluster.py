"""Unit tests for pipeline.kafka.cluster: telling failures apart, and the embedded broker's fit.

The error texts are librdkafka 2.16's, as seen against the embedded broker behind a TLS proxy
(tests/integration/test_secured_kafka.py meets them for real).
"""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError

from pipeline.core.settings import Settings
from pipeline.kafka.cluster import Cluster, _kind, fit_to_cluster

WRONG_CA = (
    "ssl://127.0.0.1:21293/bootstrap: SSL handshake failed: error:0A000086:SSL routines::"
    "certificate verify failed: broker certificate could not be verified (after 1ms in state "
    "SSL_HANDSHAKE)"
)
NO_CLIENT_CERT = (
    "ssl://127.0.0.1:21293/bootstrap: Receive failed: error:0A00045C:SSL routines::tlsv13 alert "
    "certificate required: SSL alert number 116 (after 0ms in state APIVERSION_QUERY)"
)
UNKNOWN_USER = (
    "sasl_plaintext://127.0.0.1:21392/bootstrap: SASL authentication error: SASL SCRAM "
    "authentication failed: broker responded with unknown-user (after 22ms in state AUTH_REQ)"
)
REFUSED = (
    "127.0.0.1:21999/bootstrap: Connect to ipv4#127.0.0.1:21999 failed: Connection refused "
    "(after 0ms in state CONNECT)"
)


@pytest.mark.parametrize(
    ("code", "text", "kind"),
    [
        (KafkaError._SSL, WRONG_CA, "tls"),
        (KafkaError._TRANSPORT, WRONG_CA.replace("SSL handshake failed: ", ""), "tls"),
        (KafkaError._TRANSPORT, NO_CLIENT_CERT, "tls"),
        (KafkaError._AUTHENTICATION, UNKNOWN_USER, "login"),
        (KafkaError._TRANSPORT, REFUSED, "other"),
        (KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down", "other"),
    ],
)
def test_a_tls_failure_a_refused_login_and_an_unreachable_broker_are_told_apart(
    code: int, text: str, kind: str
) -> None:
    assert _kind(KafkaError(code, text)) == kind


def test_the_embedded_broker_gets_no_transactions_and_a_short_session_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="pipeline.kafka"):
        fitted = fit_to_cluster(Settings(partitions=3), Cluster("pipeline-embedded", 1))
    assert fitted.transactions is False
    assert fitted.session_timeout == 6.0
    assert fitted.worker_processes == 1  # one machine's broker: one worker process
    assert fitted.partitions == 3
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    assert "embedded broker (cluster id pipeline-embedded): router transactions off" in lines[0]
    # Fitted once: fitting again changes and says nothing.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pipeline.kafka"):
        assert fit_to_cluster(fitted, Cluster("pipeline-embedded", 1)) == fitted
    assert not caplog.records


def test_tansus_own_default_cluster_id_is_the_embedded_broker_too() -> None:
    assert Cluster("tansu_cluster", 1).embedded
    assert not Cluster("lkc-abc123", 3).embedded
    assert not Cluster(None, 3).embedded


def test_what_a_setting_chose_is_kept_on_the_embedded_broker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    chosen = Settings(transactions=True, session_timeout=10.0, worker_processes=2)
    with caplog.at_level(logging.WARNING, logger="pipeline.kafka"):
        fitted = fit_to_cluster(chosen, Cluster("pipeline-embedded", 1))
    assert fitted.transactions is True and fitted.session_timeout == 10.0
    assert fitted.worker_processes == 2
    assert "router transactions are on (PIPELINE_TRANSACTIONS)" in caplog.text


def test_production_clusters_keep_the_defaults() -> None:
    settings = Settings()
    assert fit_to_cluster(settings, Cluster("lkc-abc123", 3)) is settings
    assert settings.transactions is True and settings.session_timeout is None
    assert settings.worker_processes is None  # one a core
