"""Unit tests for pipeline.core.signing: X-Signature = lowercase hex HMAC-SHA1 of the body (seed §5.1)."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline import sign, verify
from pipeline.core.signing import SIGNATURE_HEADER

BODY = '{"version":1,"type":"identify","userId":"Zoë","traits":{}}'.encode()


def expected(body: bytes, secret: str) -> str:
    return hmac.new(secret.encode("utf-8"), body, hashlib.sha1).hexdigest()


def test_header_name() -> None:
    assert SIGNATURE_HEADER == "X-Signature"


def test_known_vector() -> None:
    # HMAC-SHA1("key", "The quick brown fox jumps over the lazy dog"), RFC 2104 / Wikipedia
    assert sign(b"The quick brown fox jumps over the lazy dog", "key") == (
        "de7c9b85b8b78aa6bc8a7a36f70a90701c9db4d9"
    )


def test_sign_matches_hmac_sha1_over_the_exact_bytes() -> None:
    signature = sign(BODY, "s3cret")
    assert signature == expected(BODY, "s3cret")
    assert len(signature) == 40
    assert signature == signature.lower()
    assert all(ch in "0123456789abcdef" for ch in signature)


def test_non_ascii_secret_is_utf8() -> None:
    assert sign(BODY, "sécret-🔑") == expected(BODY, "sécret-🔑")


def test_signature_depends_on_every_byte() -> None:
    other = BODY.replace(b'"traits":{}', b'"traits": {}')
    assert sign(other, "s3cret") != sign(BODY, "s3cret")
    assert sign(BODY, "s3cret2") != sign(BODY, "s3cret")


@given(st.binary(max_size=200), st.text(min_size=1, max_size=20))
def test_sign_equals_independent_hmac(body: bytes, secret: str) -> None:
    assert sign(body, secret) == expected(body, secret)
    assert verify(body, secret, expected(body, secret))


def test_verify_accepts_the_right_signature() -> None:
    good = expected(BODY, "s3cret")
    assert verify(BODY, "s3cret", good) is True
    # tolerant of header spelling: upper-case hex and surrounding whitespace
    assert verify(BODY, "s3cret", good.upper()) is True
    assert verify(BODY, "s3cret", f" {good}\t") is True


@pytest.mark.parametrize(
    "signature",
    [
        None,
        "",
        "0" * 40,
        "not-a-signature",
        "sha1=" + expected(BODY, "s3cret"),
        expected(BODY, "s3cret")[:-1],
        expected(BODY, "s3cret") + "0",
        expected(BODY, "other"),
        hashlib.sha1(BODY).hexdigest(),  # noqa: S324 - a plain hash is not a valid signature
        hmac.new(b"s3cret", BODY, hashlib.sha256).hexdigest(),
    ],
)
def test_verify_rejects_wrong_or_missing(signature: str | None) -> None:
    assert verify(BODY, "s3cret", signature) is False


def test_verify_rejects_a_changed_body() -> None:
    good = expected(BODY, "s3cret")
    assert verify(BODY + b" ", "s3cret", good) is False
    assert verify(BODY.replace(b"Zo", b"Jo"), "s3cret", good) is False


@pytest.mark.parametrize(
    "signature", ["zé", "ß" * 40, "\udcff" * 40], ids=["e-acute", "sharp-s", "lone-surrogate"]
)
def test_verify_rejects_non_ascii_signature_instead_of_raising(signature: str) -> None:
    # A receiver passes the header value straight in; garbage must mean "rejected", not a crash.
    assert verify(BODY, "s3cret", signature) is False


# ---- Standard Webhooks: several secrets, and Ed25519 (v1a) ----------------------------------------


def test_each_secret_of_a_rotation_adds_a_v1_signature() -> None:
    from pipeline.core.signing import standard_webhooks_headers, verify_standard_webhooks

    headers = standard_webhooks_headers("m1", 1_795_000_000, b"{}", "new", "old")
    assert [s.split(",")[0] for s in headers["webhook-signature"].split()] == ["v1", "v1"]
    for secret in ("new", "old"):
        assert verify_standard_webhooks(headers, b"{}", secret, now=1_795_000_000)
    assert not verify_standard_webhooks(headers, b"{}", "other", now=1_795_000_000)


def test_an_ed25519_signature_verifies_with_the_public_key_alone() -> None:
    import base64

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from pipeline.core.signing import (
        new_signing_key,
        public_key_of,
        standard_webhooks_headers,
        verify_ed25519,
    )

    key = new_signing_key()
    public = public_key_of(key)
    assert key.startswith("whsk_") and public.startswith("whpk_") and key != public
    body = b'{"type":"track"}'
    headers = standard_webhooks_headers("m1", 1_795_000_000, body, "s3cret", signing_key=key)
    v1, v1a = headers["webhook-signature"].split()
    assert v1.startswith("v1,") and v1a.startswith("v1a,")
    # Checked with cryptography itself, as a receiver would, not with our verify_ed25519.
    receiver_key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public[5:]))
    receiver_key.verify(base64.b64decode(v1a[4:]), b"m1.1795000000." + body)  # raises if wrong
    assert verify_ed25519(headers, body, public, now=1_795_000_000)
    assert not verify_ed25519(headers, body + b" ", public, now=1_795_000_000)
    assert not verify_ed25519(headers, body, public, now=1_795_000_000 + 301)  # a replay
    assert not verify_ed25519(headers, body, public_key_of(new_signing_key()), now=1_795_000_000)
    only = standard_webhooks_headers("m1", 1_795_000_000, body, signing_key=key)
    assert only["webhook-signature"].startswith("v1a,")  # no shared secret: v1a alone


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("whpk_" + "A" * 43 + "=", "it must start with 'whsk_'"),
        ("whsk_not base64!", "whsk_ must be followed by base64"),
        ("whsk_" + "AAAA", "it must hold 32 bytes, not 3"),
    ],
)
def test_a_bad_signing_key_is_named_not_shown(key: str, message: str) -> None:
    from pipeline.core.signing import check_signing_key

    with pytest.raises(ValueError, match=message) as caught:
        check_signing_key(key)
    assert key not in str(caught.value)
