"""Rotating a destination's shared secret: which secrets sign when, a rotation's new window,
and the sweep of ended windows."""

from __future__ import annotations

import pytest

from pipeline.core.config import Destination, validate_config
from pipeline.core.secret_rotation import (
    keyed,
    new_secret,
    rotated,
    signing_secrets,
    without_ended_secrets,
)

from .test_config import NOW, ROTATING, config


def test_a_rotation_signs_x_signature_with_the_oldest_open_window_until_it_ends() -> None:
    dest = validate_config(config(**ROTATING), now=NOW).destinations[0]
    # Both windows open: X-Signature keeps the first secret rotated out (listed first).
    assert signing_secrets(dest, NOW) == ("older", ["new-s3cret", "older", "old"])
    # One window ended: it signs nothing; then the current secret alone.
    assert signing_secrets(dest, NOW + 12 * 3600) == ("older", ["new-s3cret", "older"])
    assert signing_secrets(dest, NOW + 24 * 3600) == ("new-s3cret", ["new-s3cret"])
    assert without_ended_secrets(dest, NOW + 13 * 3600).previous_secrets == [
        dest.previous_secrets[0]
    ]
    assert without_ended_secrets(dest, NOW) is dest


def test_a_rotation_keeps_the_old_secret_for_its_window_and_drops_ended_ones() -> None:
    dest = validate_config(config(**ROTATING), now=NOW).destinations[0]
    later = NOW + 13 * 3600  # "old" ended; "older" still open
    turned = rotated(dest, "newest", 3600.0, later)
    assert turned.shared_secret == "newest"
    assert [(p.secret, p.until_ms) for p in turned.previous_secrets] == [
        ("older", dest.previous_secrets[0].until_ms),
        ("new-s3cret", int((later + 3600) * 1000)),
    ]
    # X-Signature keeps the first secret rotated out while its window is open, whichever
    # window ends first: a receiver that never switched still has that one.
    assert signing_secrets(turned, later) == ("older", ["newest", "older", "new-s3cret"])
    assert signing_secrets(turned, later + 11 * 3600 + 1) == ("newest", ["newest"])


@pytest.mark.parametrize(
    ("changes", "window", "message"),
    [
        ({"shared_secret": None}, 3600.0, "has no shared_secret to rotate"),
        ({}, 30.0, "window: 30s is outside 1m..7d"),
        ({}, 8 * 86_400.0, "window: 8d is outside 1m..7d"),
    ],
)
def test_a_rotation_that_cannot_be_is_refused(
    changes: dict[str, object], window: float, message: str
) -> None:
    dest = Destination(
        id="hooks", sources=["web"], webhooks=[{"url": "https://a.example/"}], shared_secret="s"
    ).model_copy(update=changes)
    with pytest.raises(ValueError, match=message):
        rotated(dest, "next", window, NOW)


def test_at_most_five_windows_are_open() -> None:
    dest = Destination(
        id="hooks", sources=["web"], webhooks=[{"url": "https://a.example/"}], shared_secret="s0"
    )
    for n in range(5):
        dest = rotated(dest, f"s{n + 1}", 3600.0, NOW + n)
    with pytest.raises(ValueError, match="already has 5 rotation windows open"):
        rotated(dest, "s6", 3600.0, NOW + 5)
    assert len(rotated(dest, "s6", 3600.0, NOW + 3605).previous_secrets) == 1


def test_a_destination_asking_for_ed25519_keeps_its_live_key_or_gets_a_new_one() -> None:
    from pipeline.core.config import Signing
    from pipeline.core.signing import new_signing_key

    plain = Destination(id="hooks", sources=["web"], webhooks=[{"url": "https://a.example/"}])
    asking = plain.model_copy(update={"signing": Signing.ED25519})
    live_key = new_signing_key()
    live = asking.model_copy(update={"signing_key": live_key})
    assert keyed(asking, live).signing_key == live_key  # applied again: the same key
    fresh = keyed(asking, None).signing_key
    assert fresh is not None and fresh != live_key  # a new destination: a new key
    assert keyed(asking, plain).signing_key not in (None, live_key)  # signing just turned on
    given = asking.model_copy(update={"signing_key": new_signing_key()})
    assert keyed(given, live) is given  # a file with a key: that key
    assert keyed(plain, live) is plain  # no signing: nothing to do


def test_a_new_secret_is_random_and_in_the_standard_webhooks_form() -> None:
    import base64

    first, second = new_secret(), new_secret()
    assert first != second
    assert first.startswith("whsec_") and len(base64.b64decode(first[6:])) == 24


def test_a_rotation_window_ends_on_a_whole_millisecond() -> None:
    """As the config topic keeps it: the destination written reads back equal."""
    dest = Destination(
        id="hooks", sources=["web"], webhooks=[{"url": "https://a.example/"}], shared_secret="s"
    )
    [previous] = rotated(dest, "t", 3600.0, 1_795_000_000.123456).previous_secrets
    assert previous.until.microsecond % 1000 == 0
    assert previous.until_ms == 1_795_003_600_123
