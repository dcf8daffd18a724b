"""Secured Kafka for real: TLS, mTLS and SASL, against the embedded broker behind a TLS proxy
(stunnel, with a trustme CA) or with SASL required.

The embedded broker serves no TLS itself, so each test that needs it puts stunnel in front and
has the broker advertise the proxy's port. Its SASL (SCRAM only) knows no user: the product is
tested to complete the real exchange and say the login was refused.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx
import pytest
import yaml

from pipeline.client import Client
from pipeline.core.settings import Settings
from pipeline.runtime.net import free_port
from tests.support import CallsTopic, SecuredBroker, run_cli, wait_for, wait_until_ready

WRITE_KEY = "wk_tls"
#: A TLS or login failure must be told within this (an unreachable broker takes 30 s).
FAST = 10.0


def secured_settings(where: SecuredBroker, tmp_path: Path, **security: str) -> Settings:
    return Settings(
        bootstrap_servers=where.bootstrap_servers,
        topic_prefix=f"s{uuid.uuid4().hex[:10]}.",
        partitions=2,
        retry_partitions=1,
        retry_delays=(1.0,),
        retry_deadline=8.0,
        delivery_timeout=2.0,
        allowed_networks=("127.0.0.0/8",),
        log_store_url=f"sqlite:///{tmp_path / 'log.sqlite3'}",
        state_dir=str(tmp_path / "state"),
        **security,
    )


def tls(
    where: SecuredBroker, *, client_cert: bool = False, ca: str | None = None
) -> dict[str, str]:
    security = {
        "kafka_security_protocol": "SSL",
        "kafka_ssl_ca_location": ca or where.certs.ca,
    }
    if client_cert:
        security["kafka_ssl_certificate_location"] = where.certs.client_cert
        security["kafka_ssl_key_location"] = where.certs.client_key
    return security


def config_file(tmp_path: Path, receiver_url: str) -> str:
    path = tmp_path / "pipeline.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "sources": [{"id": "web", "write_keys": [WRITE_KEY]}],
                "destinations": [
                    {
                        "id": "hooks",
                        "sources": ["web"],
                        "shared_secret": "s3cret",
                        "webhooks": [{"url": receiver_url}],
                    }
                ],
            }
        )
    )
    return str(path)


def timed(settings: Settings, *args: str) -> tuple[float, object]:
    started = time.monotonic()
    done = run_cli(settings, *args, timeout=60)
    return time.monotonic() - started, done


def test_topics_config_ingest_worker_replay_and_console_work_over_tls(
    secured_broker_factory, receiver_factory, process_factory, tmp_path
):
    where = secured_broker_factory()
    settings = secured_settings(where, tmp_path, **tls(where))
    receiver = receiver_factory()

    created = run_cli(settings, "topics", "create")
    assert created.returncode == 0, created.stderr
    applied = run_cli(settings, "config", "apply", config_file(tmp_path, receiver.url))
    assert applied.returncode == 0, applied.stderr

    port, console_port = free_port(), free_port()
    process_factory(settings, "ingest", "--port", str(port))
    process_factory(settings, "worker", "--no-log-store")
    process_factory(
        settings, "console", "--port", str(console_port), env={"PIPELINE_CONSOLE_PASSWORD": "pw"}
    )
    url = f"http://127.0.0.1:{port}"
    wait_until_ready(url)
    answer = httpx.post(
        url + "/v1/track",
        json={"userId": "u-tls", "event": "Over TLS"},
        auth=(WRITE_KEY, ""),
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    wait_for(lambda: receiver.count() >= 1, timeout=60)
    assert receiver.bodies()[0]["event"] == "Over TLS"

    replayed = run_cli(
        settings, "replay", "--destination", "hooks", "--since", "1h", "--yes", timeout=90
    )
    assert replayed.returncode == 0, replayed.stderr
    wait_for(lambda: receiver.count() >= 2, timeout=60)
    assert [b["messageId"] for b in receiver.bodies()][0] == receiver.bodies()[1]["messageId"]

    console = f"http://127.0.0.1:{console_port}"
    wait_until_ready(console)
    with httpx.Client(base_url=console, timeout=10) as browser:
        form = browser.get("/login").text
        token = form.split('name="login_token" value="', 1)[1].split('"', 1)[0]
        browser.post("/login", data={"login_token": token, "next": "/", "password": "pw"})
        page = browser.get("/destinations/hooks")
    assert page.status_code == 200
    assert "hooks" in page.text and receiver.url in page.text  # read from Kafka, over TLS


def test_the_client_librarys_kafka_transport_works_over_tls(secured_broker_factory, tmp_path):
    where = secured_broker_factory()
    settings = secured_settings(where, tmp_path, **tls(where))
    assert run_cli(settings, "topics", "create").returncode == 0
    calls = CallsTopic(settings)
    try:
        client = Client(
            "",
            bootstrap_servers=where.bootstrap_servers,
            source_id="web",
            topic_prefix=settings.topic_prefix,
            kafka_config={"security.protocol": "SSL", "ssl.ca.location": where.certs.ca},
        )
        client.track(user_id="u-client", event="Via Kafka over TLS")
        assert client.flush(timeout=20)
        client.close()
        [record] = calls.wait(1, timeout=30)
        assert record["userId"] == "u-client" and record["sourceId"] == "web"
    finally:
        calls.close()


def test_mtls_works_with_the_client_certificate_and_fails_fast_without_it(
    secured_broker_factory, tmp_path
):
    where = secured_broker_factory(client_cert=True)
    with_cert = secured_settings(where, tmp_path, **tls(where, client_cert=True))
    created = run_cli(with_cert, "topics", "create")
    assert created.returncode == 0, created.stderr
    shown = run_cli(with_cert, "config", "show")
    assert shown.returncode == 0, shown.stderr

    without = secured_settings(where, tmp_path, **tls(where))
    took, done = timed(without, "config", "show")
    assert done.returncode == 3, done.stderr
    assert "TLS handshake with" in done.stderr and "certificate required" in done.stderr
    assert "PIPELINE_KAFKA_SSL_CERTIFICATE_LOCATION" in done.stderr  # what to do
    assert took < FAST


def test_a_wrong_ca_is_a_tls_error_within_seconds(secured_broker_factory, tmp_path):
    where = secured_broker_factory()
    wrong = secured_settings(where, tmp_path, **tls(where, ca=where.certs.other_ca))
    took, done = timed(wrong, "topics", "create")
    assert done.returncode == 3
    assert "TLS handshake with" in done.stderr and "certificate verify failed" in done.stderr
    assert f"the CA in {where.certs.other_ca}" in done.stderr
    assert took < FAST


@pytest.mark.parametrize(
    ("tls_too", "mechanism"), [(False, "SCRAM-SHA-256"), (True, "SCRAM-SHA-512")]
)
def test_a_refused_scram_login_is_said_plainly_within_seconds(
    secured_broker_factory, tmp_path, tls_too, mechanism
):
    where = secured_broker_factory(tls=tls_too, authentication=True)
    security = {
        **(tls(where) if tls_too else {}),
        "kafka_security_protocol": "SASL_SSL" if tls_too else "SASL_PLAINTEXT",
        "kafka_sasl_mechanism": mechanism,
        "kafka_sasl_username": "alice",
        "kafka_sasl_password": "wonderland",
    }
    settings = secured_settings(where, tmp_path, **security)
    took, done = timed(settings, "topics", "create")
    assert done.returncode == 3
    assert f"authentication failed: {where.bootstrap_servers} refused the {mechanism} login" in (
        done.stderr
    )
    assert "unknown-user" in done.stderr
    assert "wonderland" not in done.stderr
    assert took < FAST

    doctor = run_cli(settings, "doctor", timeout=60)
    assert doctor.returncode == 1
    assert (
        "FAIL brokers         authentication failed" in doctor.stdout
        and "user 'alice' (sasl.username from PIPELINE_KAFKA_SASL_USERNAME)" in doctor.stdout
    ), doctor.stdout
    assert "wonderland" not in doctor.stdout + doctor.stderr


def test_settings_show_the_security_settings_masked(secured_broker_factory, tmp_path):
    where = secured_broker_factory(tls=False)
    props = tmp_path / "client.properties"
    props.write_text(
        "security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.username=bob\n"
        "sasl.password=from-file\nssl.ca.location=" + where.certs.ca + "\n"
    )
    settings = secured_settings(where, tmp_path)
    env = {"PIPELINE_KAFKA_CONFIG": str(props), "PIPELINE_KAFKA_SASL_PASSWORD": "from-env"}
    done = run_cli(settings, "settings", "--no-broker", timeout=30, env=env)
    assert done.returncode == 0, done.stderr
    assert "from-file" not in done.stdout + done.stderr
    assert "from-env" not in done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any(
        line.split()[:3] == ["sasl.password", "********", "PIPELINE_KAFKA_SASL_PASSWORD"]
        for line in lines
    ), done.stdout
    assert any(line.split()[:2] == ["sasl.username", "bob"] for line in lines)
    # The environment wins over the file, and the note names both (never the values).
    assert f"sasl.password: PIPELINE_KAFKA_SASL_PASSWORD overrides the value in {props}" in (
        done.stderr
    )


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"PIPELINE_KAFKA_SECURITY_PROTOCOL": "TLS"},
            "PIPELINE_KAFKA_SECURITY_PROTOCOL: security.protocol: 'TLS' is not one of "
            "PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL",
        ),
        (
            {
                "PIPELINE_KAFKA_SECURITY_PROTOCOL": "SSL",
                "PIPELINE_KAFKA_SSL_CA_LOCATION": "/nowhere/ca.pem",
            },
            "PIPELINE_KAFKA_SSL_CA_LOCATION: ssl.ca.location: /nowhere/ca.pem does not exist",
        ),
        (
            {"PIPELINE_KAFKA_CONFIG": "TYPO"},
            "line 2: ssl.ca.locaton is not a librdkafka property; did you mean ssl.ca.location?",
        ),
        ({"PIPELINE_PARTITIONS": "six"}, "PIPELINE_PARTITIONS: 'six' is not a whole number"),
    ],
)
def test_bad_settings_are_one_clear_error_before_any_connection(tmp_path, env, expected):
    typo = tmp_path / "client.properties"
    typo.write_text("security.protocol=SSL\nssl.ca.locaton=/etc/ssl/ca.pem\n")
    env = {k: str(typo) if v == "TYPO" else v for k, v in env.items()}
    # Nothing listens there: the error comes before any attempt to connect.
    nowhere = Settings(bootstrap_servers=f"127.0.0.1:{free_port()}")
    started = time.monotonic()
    done = run_cli(nowhere, "topics", "create", env=env, timeout=30)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: settings:")
    assert expected in done.stderr, done.stderr
    assert time.monotonic() - started < 5
