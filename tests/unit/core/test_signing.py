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
