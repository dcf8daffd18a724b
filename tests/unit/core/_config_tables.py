"""A hypothesis strategy for any valid live config (``ConfigTable``): every field of every
entity, in any combination ``validate_config`` accepts. Shared by the export tests."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from hypothesis import strategies as st

from pipeline.core.config import (
    RESERVED_HEADERS,
    Batch,
    ConfigTable,
    Destination,
    Ordering,
    PreviousSecret,
    RetryPolicy,
    Signing,
    Source,
    Webhook,
)
from pipeline.core.signing import new_signing_key

__all__ = ["config_tables"]

ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,15}", fullmatch=True)
#: Any text a YAML file can hold (no lone surrogates: they cannot be written as UTF-8).
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
header_values = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=20)
header_names = st.from_regex(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,16}", fullmatch=True).filter(
    lambda name: name.lower() not in RESERVED_HEADERS
)
urls = st.builds(
    "{}://{}{}".format,
    st.sampled_from(["http", "https"]),
    st.sampled_from(["example.com", "127.0.0.1:8090", "[::1]:443", "hooks.example.org"]),
    st.from_regex(r"(/[A-Za-z0-9._~%-]{0,10}){0,3}", fullmatch=True),
)


def durations(low: float, high: float) -> st.SearchStrategy[float]:
    """Round durations as people write them, and any float in range."""
    nice = st.sampled_from([1.0, 1.5, 10.0, 60.0, 90.0, 300.0, 3600.0, 14_400.0, 86_400.0])
    return nice.filter(lambda s: low <= s <= high) | st.floats(low, high)


retry_policies = st.builds(
    RetryPolicy,
    delays=st.none() | st.lists(durations(1.0, 7 * 86_400.0), min_size=1, max_size=5),
    deadline=st.none() | durations(60.0, 7 * 86_400.0),
)
#: Ed25519 signing keys: a few made once (making one per example is slow).
signing_keys = st.sampled_from([new_signing_key() for _ in range(3)])
batches = st.builds(
    Batch,
    max_events=st.integers(1, 1000),
    max_bytes=st.integers(1024, 5_000_000),
    max_wait=durations(0.01, 60.0),
)


@st.composite
def config_tables(draw: st.DrawFn) -> ConfigTable:
    source_ids = draw(st.lists(ids, min_size=1, max_size=3, unique=True))
    keys = iter(draw(st.lists(texts.filter(bool), max_size=6, unique=True)))
    sources = [
        Source(
            id=source_id,
            name=draw(texts),
            write_keys=[key for key, _ in zip(keys, range(draw(st.integers(0, 2))), strict=False)],
            blocked_events=draw(st.lists(texts, max_size=2)),
        )
        for source_id in source_ids
    ]
    destinations = []
    for dest_id in draw(st.lists(ids, max_size=3, unique=True)):
        secret = draw(st.none() | texts.filter(bool))
        previous = []
        if secret is not None:  # windows that end within the next six days (or have ended)
            for old in draw(st.lists(texts.filter(bool), max_size=2, unique=True)):
                if old != secret:
                    ms = draw(st.integers(-86_400_000, 6 * 86_400_000)) + int(time.time() * 1000)
                    until = datetime.fromtimestamp(ms / 1000, UTC)
                    previous.append(PreviousSecret(secret=old, until=until))
        signed = draw(st.booleans())
        ordering = draw(st.sampled_from(Ordering))
        batch = None if ordering is Ordering.PER_USER else draw(st.none() | batches)
        max_in_flight = draw(st.none() | st.integers(1, 100_000))
        if batch is not None and max_in_flight is not None:
            max_in_flight = max(max_in_flight, batch.max_events)
        destinations.append(
            Destination(
                id=dest_id,
                name=draw(texts),
                enabled=draw(st.booleans()),
                sources=draw(st.lists(st.sampled_from(source_ids), min_size=1, max_size=3)),
                shared_secret=secret,
                previous_secrets=previous,
                signing=Signing.ED25519 if signed else None,
                signing_key=draw(signing_keys) if signed else None,
                standard_webhooks=secret is not None and draw(st.booleans()),
                rate_limit=draw(st.none() | st.floats(0, 100_000, exclude_min=True)),
                retry=draw(st.none() | retry_policies),
                max_in_flight=max_in_flight,
                disable_after=draw(st.none() | durations(60.0, 30 * 86_400.0)),
                ordering=ordering,
                batch=batch,
                webhooks=draw(
                    st.lists(
                        st.builds(
                            Webhook,
                            url=urls,
                            headers=st.dictionaries(header_names, header_values, max_size=3),
                        ),
                        min_size=1,
                        max_size=5,
                    )
                ),
                disabled_reason=draw(st.none() | texts),
                disabled_at=draw(st.none() | st.integers(0, 2**62)),
            )
        )
    return ConfigTable.build(sources, destinations)
