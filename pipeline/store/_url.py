"""Store URLs: which backend a URL names, where its file is, and how to show it safely.

    sqlite:////var/lib/pipeline/log.sqlite3   an absolute path (the fourth slash starts it)
    sqlite:///log.sqlite3                     relative to the working directory
    /var/lib/pipeline/log.sqlite3             a bare file path: SQLite too
    postgresql://user:secret@db:5432/log      PostgreSQL (``postgres://`` as well)

The SQLite form is SQLAlchemy's: everything after ``sqlite:///`` is the path, so
``default_log_store_url`` (``sqlite:///`` + an absolute path) reads back as that absolute path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["StoreUrl", "parse_store_url", "masked_url", "ACCEPTED_SCHEMES"]

ACCEPTED_SCHEMES = ("sqlite", "postgresql", "postgres")
_SQLITE_PREFIX = "sqlite:///"


@dataclass(frozen=True, slots=True)
class StoreUrl:
    backend: Literal["sqlite", "postgresql"]
    url: str
    """For SQLite, the file's path; for PostgreSQL, the URL as given (libpq reads it)."""

    @property
    def shown(self) -> str:
        """The URL for messages and logs, password masked."""
        return masked_url(self.url)


def parse_store_url(url: str) -> StoreUrl:
    """The backend and location ``url`` names; ``ValueError`` for anything else.

    >>> parse_store_url("sqlite:////tmp/log.sqlite3")
    StoreUrl(backend='sqlite', url='/tmp/log.sqlite3')
    """
    text = url.strip()
    if not text:
        raise ValueError(
            "log store URL is empty; use sqlite:///PATH, a file path or postgresql://..."
        )
    if "://" not in text:
        return StoreUrl("sqlite", text)
    scheme = text.split("://", 1)[0].lower()
    if scheme in ("postgresql", "postgres"):
        return StoreUrl("postgresql", text)
    if scheme == "sqlite":
        if not text.startswith(_SQLITE_PREFIX) or len(text) == len(_SQLITE_PREFIX):
            raise ValueError(
                f"log store URL {masked_url(text)!r}: a SQLite URL is sqlite:///PATH "
                "(sqlite:////abs/path.sqlite3 for an absolute path)"
            )
        return StoreUrl("sqlite", text[len(_SQLITE_PREFIX) :])
    raise ValueError(
        f"log store URL {masked_url(text)!r}: unknown scheme {scheme!r}; accepted: "
        f"{', '.join(s + '://' for s in ACCEPTED_SCHEMES)} (or a bare file path for SQLite)"
    )


def masked_url(url: str) -> str:
    """``url`` with its password (in the authority or a ``password=`` parameter) as ``***``.

    >>> masked_url("sqlite:////var/lib/log.sqlite3")
    'sqlite:////var/lib/log.sqlite3'

    >>> masked_url("postgresql://app:s3cret@db:5432/log?sslmode=require&password=x")
    'postgresql://app:***@db:5432/log?sslmode=require&password=%2A%2A%2A'
    """
    if "://" not in url or ("@" not in url and "password" not in url.lower()):
        return url  # nothing to hide (and urlunsplit would drop sqlite:////'s empty host)
    try:
        parts = urlsplit(url)
    except ValueError:
        return url.split("://", 1)[0] + "://***"
    netloc = parts.netloc
    if "@" in netloc:
        credentials, host = netloc.rsplit("@", 1)
        if ":" in credentials:
            credentials = credentials.split(":", 1)[0] + ":***"
        netloc = f"{credentials}@{host}"
    query = parts.query
    if "password" in query.lower():
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, "***" if k.lower() == "password" else v) for k, v in pairs])
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
