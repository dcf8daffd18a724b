"""TLS contexts for a destination's receivers (``mtls``): what each field may be, and the
problems ``config apply`` names before anything is applied."""

from __future__ import annotations

import os
import ssl
import tempfile
from pathlib import Path

import pytest
import trustme

from pipeline.core.config import ClientTls, validate_config
from pipeline.runtime.client_tls import ClientTlsError, client_tls_context, client_tls_problems

CA = trustme.CA()
CLIENT = CA.issue_cert("pipeline-client")


def files(tmp_path: Path) -> tuple[str, str, str]:
    certificate, key, ca = tmp_path / "client.pem", tmp_path / "client.key", tmp_path / "ca.pem"
    certificate.write_bytes(b"".join(blob.bytes() for blob in CLIENT.cert_chain_pems))
    key.write_bytes(CLIENT.private_key_pem.bytes())
    ca.write_bytes(CA.cert_pem.bytes())
    return str(certificate), str(key), str(ca)


def test_files_or_pem_text_make_a_verifying_context(tmp_path: Path) -> None:
    certificate, key, ca = files(tmp_path)
    from_files = client_tls_context(ClientTls(certificate=certificate, key=key, ca=ca))
    assert from_files.verify_mode is ssl.CERT_REQUIRED and from_files.check_hostname
    assert len(from_files.get_ca_certs()) == 1  # its CA alone, not the system's store
    inline = ClientTls(
        certificate=Path(certificate).read_text(),
        key=Path(key).read_text(),
        ca=CA.cert_pem.bytes().decode(),
    )
    assert len(client_tls_context(inline).get_ca_certs()) == 1
    scratch = tempfile.gettempdir()
    before = set(os.listdir(scratch))
    client_tls_context(inline)
    assert not {n for n in set(os.listdir(scratch)) - before if n.startswith("pipeline-tls-")}


def test_without_a_ca_the_system_store_verifies(tmp_path: Path) -> None:
    certificate, key, _ = files(tmp_path)
    context = client_tls_context(ClientTls(certificate=certificate, key=key))
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname


def test_a_missing_or_unusable_file_is_named_by_its_field(tmp_path: Path) -> None:
    certificate, key, ca = files(tmp_path)
    config = validate_config(
        {
            "sources": [{"id": "web"}],
            "destinations": [
                {
                    "id": "a",
                    "sources": ["web"],
                    "webhooks": [{"url": "https://a.example/"}],
                    "mtls": {"certificate": certificate, "key": str(tmp_path / "gone.key")},
                },
                {
                    "id": "b",
                    "sources": ["web"],
                    "webhooks": [{"url": "https://b.example/"}],
                    "mtls": {"ca": key},  # a key is no CA bundle
                },
                {
                    "id": "c",
                    "sources": ["web"],
                    "webhooks": [{"url": "https://c.example/"}],
                    "mtls": {"certificate": ca, "key": key},  # the CA's certificate, not the key's
                },
            ],
        }
    )
    problems = client_tls_problems(config)
    assert (
        problems[0]
        == f"destinations[0] (a).mtls.key: cannot read {tmp_path}/gone.key: no such file"
    )
    assert problems[1].startswith(
        f"destinations[1] (b).mtls.ca: {key} is not usable as a CA bundle"
    )
    assert problems[2].startswith("destinations[2] (c).mtls.")
    assert "is not usable as a certificate and its key" in problems[2]
    assert len(problems) == 3


def test_a_key_given_as_pem_is_never_in_an_error(tmp_path: Path) -> None:
    certificate, _, _ = files(tmp_path)
    other = trustme.CA().issue_cert("x").private_key_pem.bytes().decode()
    with pytest.raises(ClientTlsError) as caught:
        client_tls_context(ClientTls(certificate=certificate, key=other))
    assert "PRIVATE KEY" not in str(caught.value)
    assert "the PEM text given" in str(caught.value) or certificate in str(caught.value)


@pytest.mark.parametrize(
    ("mtls", "message"),
    [
        ({"certificate": "/c.pem"}, "certificate and key go together"),
        ({"key": "/k.pem", "ca": "/ca.pem"}, "certificate and key go together"),
        ({}, "needs a certificate and key, or a ca, or both"),
        ({"cert": "/c.pem"}, "mtls.cert: is not a known field"),
    ],
)
def test_an_incomplete_mtls_is_refused(mtls: dict[str, str], message: str) -> None:
    from pipeline.core.exceptions import ConfigError

    data = {
        "sources": [{"id": "web"}],
        "destinations": [
            {
                "id": "a",
                "sources": ["web"],
                "webhooks": [{"url": "https://a.example/"}],
                "mtls": mtls,
            }
        ],
    }
    with pytest.raises(ConfigError) as caught:
        validate_config(data)
    assert message in str(caught.value)


def test_a_key_that_is_no_path_is_never_echoed(tmp_path: Path) -> None:
    certificate, _, _ = files(tmp_path)
    secret = "Bag Attributes\nlocalKeyID: 01\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC"  # no BEGIN line
    with pytest.raises(ClientTlsError) as caught:
        client_tls_context(ClientTls(certificate=certificate, key=secret))
    assert "MIIEv" not in str(caught.value) and "the value given" in str(caught.value)
    with pytest.raises(ClientTlsError, match="neither a file's path nor PEM text"):
        client_tls_context(ClientTls(certificate=certificate, key="a\x00b"))
