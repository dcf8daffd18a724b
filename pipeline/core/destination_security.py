"""What a destination's config says about trust between it and its receivers: its signing
secrets being rotated out (``PreviousSecret``), its Ed25519 signatures (``Signing``,
``SigningKey``), TLS to its receivers (``ClientTls``), the proxy it reaches them through
(``check_proxy_url``), and the OAuth2 client credentials it logs in with (``OAuth2``). Part of
``pipeline.core.config``, which re-exports them; apart only to keep that module readable."""

from __future__ import annotations

import enum
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from pipeline.core.signing import check_signing_key

__all__ = [
    "ClientTls",
    "ConfigModel",
    "PemOrPath",
    "OAuth2",
    "PreviousSecret",
    "ProxyUrl",
    "Secret",
    "Signing",
    "SigningKey",
    "check_proxy_url",
    "is_pem",
    "tls_text",
    "shown_proxy",
]


class ConfigModel(BaseModel):
    """The base of every config model: unknown fields refused, immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=False)


Secret = Annotated[str, Field(min_length=1, max_length=1024)]


class PreviousSecret(ConfigModel):
    """A shared secret being rotated out (``previous_secrets`` in the config file): it still
    signs until ``until`` (``docs``: X-Signature keeps it to the end of the oldest window;
    Standard Webhooks' ``webhook-signature`` carries a signature for it beside the current one).

        PreviousSecret(secret="old-s3cret", until="2026-12-01T00:00:00Z")
    """

    secret: Secret
    until: AwareDatetime

    @property
    def until_ms(self) -> int:
        return int(self.until.timestamp() * 1000)


#: A file's path on the workers, or the PEM text itself (``-----BEGIN ...``).
PemOrPath = Annotated[str, Field(min_length=1, max_length=65_536)]


def is_pem(value: str) -> bool:
    """Whether a ``ClientTls`` field holds PEM text rather than a file's path."""
    return "-----BEGIN" in value


def tls_text(mtls: ClientTls) -> str:
    """``certificate /etc/pipeline/client.pem, ca (PEM)``: where a destination's TLS files
    are, as ``config show`` and the console say it (PEM text is never shown)."""
    parts = []
    for name, value in (("certificate", mtls.certificate), ("ca", mtls.ca)):
        if value is not None:
            parts.append(f"{name} {'(PEM)' if is_pem(value) else value}")
    return ", ".join(parts)


class ClientTls(ConfigModel):
    """TLS to a destination's receivers (``mtls`` in the config file): a client certificate and
    its key (mutual TLS), and a CA bundle to verify the receivers with instead of the system's
    trust store (a private CA). Each a file's path on the workers or the PEM text; a key given
    as PEM is a secret (masked by ``config show``). ``config apply`` and the console read each
    one before anything is applied (``pipeline.runtime.client_tls``).

        ClientTls(certificate="/etc/pipeline/client.pem", key="/etc/pipeline/client.key")
    """

    certificate: PemOrPath | None = None
    key: PemOrPath | None = None
    ca: PemOrPath | None = None

    @model_validator(mode="after")
    def _pairs(self) -> ClientTls:
        if (self.certificate is None) != (self.key is None):
            raise ValueError("certificate and key go together: give both, or neither")
        if self.certificate is None and self.ca is None:
            raise ValueError("needs a certificate and key, or a ca, or both")
        return self


class Signing(enum.StrEnum):
    """Asymmetric signatures a destination's requests carry (``signing`` in the config file)."""

    ED25519 = "ed25519"
    """Standard Webhooks ``v1a``: Ed25519 with the destination's ``signing_key``; its receivers
    verify with the public key (``config show``, the console) and hold no secret."""


SigningKey = Annotated[str, AfterValidator(check_signing_key)]


def check_proxy_url(url: str) -> str:
    """A forward proxy's URL: ``http://`` or ``https://``, a host, a port if any, no path; a
    login (``http://user:password@proxy:3128``) is allowed, and masked where shown
    (``shown_proxy``). ``ValueError`` naming the problem, never the password."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError as exc:
        raise ValueError(f"{shown_proxy(url)!r} is not a valid proxy URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{shown_proxy(url)!r} must be an http:// or https:// proxy")
    if not parts.hostname:
        raise ValueError(f"{shown_proxy(url)!r} has no host")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"{shown_proxy(url)!r} must be only scheme, host and port")
    return url


def shown_proxy(url: str) -> str:
    """A proxy URL with its password masked: ``http://user:••••@proxy:3128``."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url.split("@")[-1]
    if not password:
        return url
    return url.replace(f":{password}@", ":••••@", 1)


ProxyUrl = Annotated[str, Field(max_length=2048), AfterValidator(check_proxy_url)]


class OAuth2(ConfigModel):
    """OAuth2 client credentials (``oauth2`` in the config file): a bearer token from
    ``token_url`` rides on every request (``Authorization: Bearer …``), fetched once per worker,
    refreshed before it expires and once on a 401. ``client_secret`` is a secret.

        OAuth2(token_url="https://auth.example.com/token", client_id="id", client_secret="s")
    """

    token_url: Annotated[str, Field(max_length=2048)]
    client_id: Annotated[str, Field(min_length=1, max_length=1024)]
    client_secret: Secret
    scope: Annotated[str, Field(min_length=1, max_length=1024)] | None = None

    @field_validator("token_url")
    @classmethod
    def _token_url(cls, url: str) -> str:
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 (raises on a bad port)
        except ValueError as exc:
            raise ValueError(f"{url!r} is not a valid URL ({exc})") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r} must be an https:// URL with a host")
        if parts.username or parts.password:
            raise ValueError(f"{url!r} carries credentials; give client_id and client_secret")
        return url
