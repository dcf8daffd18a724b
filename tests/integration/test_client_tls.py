"""Mutual TLS to a receiver (``mtls`` in a destination's config): real TLS on 127.0.0.1, a
receiver that requires a client certificate from a test CA (trustme)."""

from __future__ import annotations

import ssl
from pathlib import Path

import trustme
import yaml

from pipeline.kafka.config_store import load_table
from tests.support import apply, dead_letters, run_cli, send_calls, simple_config, wait_for


def test_a_receiver_requiring_a_client_certificate_takes_ours_and_refuses_none(
    settings, tmp_path: Path, receiver_factory, worker_factory
):
    authority = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(server)
    authority.configure_trust(server)
    server.verify_mode = ssl.CERT_REQUIRED  # no client certificate, no request
    receiver = receiver_factory(ssl_context=server)
    client = authority.issue_cert("pipeline-client")
    certificate, key, ca = tmp_path / "client.pem", tmp_path / "client.key", tmp_path / "ca.pem"
    certificate.write_bytes(b"".join(blob.bytes() for blob in client.cert_chain_pems))
    key.write_bytes(client.private_key_pem.bytes())
    ca.write_bytes(authority.cert_pem.bytes())

    # A missing key file is refused by config apply, naming the field; nothing is applied.
    bad = simple_config(
        receiver.url + "/with",
        mtls={"certificate": str(certificate), "key": str(tmp_path / "gone.key"), "ca": str(ca)},
    )
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    refused = run_cli(settings, "config", "apply", str(tmp_path / "bad.yaml"))
    assert refused.returncode != 0
    assert f"destinations[0] (hooks).mtls.key: cannot read {tmp_path}/gone.key" in refused.stderr
    assert load_table(settings).destinations == {}

    config = simple_config(
        receiver.url + "/with",
        mtls={"certificate": str(certificate), "key": str(key), "ca": str(ca)},
    )
    without = {**config["destinations"][0], "id": "bare", "mtls": {"ca": str(ca)}}
    without["webhooks"] = [{"url": receiver.url + "/without"}]
    config["destinations"].append(without)
    apply(settings, config)
    worker_factory(settings)
    send_calls(settings, [{"type": "track", "event": "Secured", "userId": "u1"}], "wk")

    wait_for(lambda: receiver.count() == 1)
    assert receiver.requests[0].path.endswith("/with")
    # Without a certificate the receiver refuses the connection: never a request reaches it;
    # retried as a connection failure until the deadline (8 s here), then dead-lettered.
    [letter] = dead_letters(settings, 1, timeout=40)
    assert letter["delivery"]["destinationId"] == "bare"
    assert letter["reason"] == "deadline_exceeded"
    errors = {attempt["error"].split(":")[0] for attempt in letter["delivery"]["attempts"]}
    assert errors == {"connection_error"}  # TLS 1.3: the refusal comes as a reset, after it
    assert [r.path.rsplit("/", 1)[1] for r in receiver.requests] == ["with"]
