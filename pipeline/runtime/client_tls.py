"""TLS contexts for a destination's receivers (``mtls`` in its config, ``ClientTls``): its client
certificate (mutual TLS) and its CA bundle, read from files on this machine or from PEM text.

``client_tls_context`` builds the context the webhook sender uses for the destination;
``client_tls_problems`` tries it for every destination of a config file, so that ``config
apply`` and the console refuse a missing or unreadable file, naming the field, before anything
is applied. A CA bundle replaces the system's trust store for that destination (a receiver
behind a private CA is verified against that CA alone); certificates are still verified, so a
self-signed receiver without a configured CA is refused as ever.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import ssl
import tempfile
from collections.abc import Iterator, Sequence
from urllib.parse import urlsplit

from pipeline.core.config import ClientTls, PipelineConfig, is_pem

__all__ = [
    "ClientTlsError",
    "client_tls_context",
    "client_tls_problems",
    "receiver_auth_problems",
]


class ClientTlsError(ValueError):
    """A ``ClientTls`` field that cannot be used; ``field`` names it (``mtls.key``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def client_tls_context(mtls: ClientTls) -> ssl.SSLContext:
    """The TLS context for receivers of a destination with ``mtls``; ``ClientTlsError`` naming
    the field that cannot be read or used (never its content: a key is a secret)."""
    if mtls.ca is None:
        context = ssl.create_default_context()
    else:
        # Verifies certificates and host names, as the default does, without the system store.
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        try:
            if is_pem(mtls.ca):
                context.load_verify_locations(cadata=mtls.ca)
            else:
                context.load_verify_locations(cafile=mtls.ca)
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise ClientTlsError("mtls.ca", _why(mtls.ca, exc, "a CA bundle")) from None
    if mtls.certificate is not None and mtls.key is not None:
        with (
            _file("mtls.certificate", mtls.certificate) as certificate,
            _file("mtls.key", mtls.key) as key,
        ):
            try:
                context.load_cert_chain(certificate, key)
            except (OSError, ssl.SSLError, ValueError) as exc:
                field = "mtls.key" if "key" in str(exc).lower() else "mtls.certificate"
                raise ClientTlsError(
                    field, _why(mtls.certificate, exc, "a certificate and its key")
                ) from None
    return context


def client_tls_problems(config: PipelineConfig) -> list[str]:
    """``config apply``'s problems with the files and PEM text of every destination's ``mtls``
    (``destinations[0] (hooks).mtls.key: cannot read /etc/x.key: No such file or directory``)."""
    problems = []
    for index, destination in enumerate(config.destinations):
        if destination.mtls is None:
            continue
        try:
            client_tls_context(destination.mtls)
        except ClientTlsError as exc:
            problems.append(f"destinations[{index}] ({destination.id}).{exc.field}: {exc.message}")
    return problems


@contextlib.contextmanager
def _file(field: str, value: str) -> Iterator[str]:
    """A path to ``value``: the file it names, or a private temporary copy of its PEM text
    (``load_cert_chain`` reads files only), removed at once."""
    if not is_pem(value):
        # A key is a secret: its value is named only when it looks like a path.
        shown = value if "\n" not in value and len(value) <= 1024 else "the value given"
        try:
            readable = os.access(value, os.R_OK)
            exists = os.path.exists(value)
        except ValueError:  # a NUL in it: no path at all
            raise ClientTlsError(field, "is neither a file's path nor PEM text") from None
        if not readable:
            reason = "no such file" if not exists else "not readable by this user"
            raise ClientTlsError(field, f"cannot read {shown}: {reason}")
        yield value
        return
    handle, path = tempfile.mkstemp(prefix="pipeline-tls-", suffix=".pem")  # mode 0600
    try:
        with os.fdopen(handle, "w") as out:
            out.write(value)
        yield path
    finally:
        os.unlink(path)


def _why(value: str, exc: BaseException, what: str) -> str:
    where = "the PEM text given" if is_pem(value) else value
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return f"{where} is not usable as {what}: {reason}"


def receiver_auth_problems(config: PipelineConfig, allowed_networks: Sequence[str]) -> list[str]:
    """What ``config apply`` and the console check beyond the file's rules, on this machine:
    every ``mtls`` file (``client_tls_problems``), and that an OAuth2 ``token_url`` is https,
    or http only to an address inside ``PIPELINE_ALLOWED_NETWORKS`` (its client secret goes in
    that request)."""
    problems = client_tls_problems(config)
    networks = [ipaddress.ip_network(cidr, strict=False) for cidr in allowed_networks]
    for index, destination in enumerate(config.destinations):
        oauth = destination.oauth2
        if oauth is None or oauth.token_url.startswith("https://"):
            continue
        host = urlsplit(oauth.token_url).hostname or ""
        try:
            inside = any(ipaddress.ip_address(host) in net for net in networks)
        except ValueError:
            inside = False
        if not inside:
            problems.append(
                f"destinations[{index}] ({destination.id}).oauth2.token_url: "
                f"{oauth.token_url!r} must be https:// (http:// only to an address in "
                "PIPELINE_ALLOWED_NETWORKS: the client secret travels in it)"
            )
    return problems
