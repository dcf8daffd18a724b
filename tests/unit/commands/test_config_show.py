"""Unit tests for ``pipeline config show``'s output (``format_config``), without a broker."""

from __future__ import annotations

import orjson

from pipeline.commands.config import format_config
from pipeline.core.config import (
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

SECRET = "sekrit-hmac-key-0042"
TOKEN = "Bearer tok-9f8e7d6c"

POLICY = Destination(
    id="hooks",
    sources=["web"],
    shared_secret=SECRET,
    webhooks=[Webhook(url="https://example.com/h", headers={"Authorization": TOKEN})],
    retry=RetryPolicy(delays=[10.0, 60.0, 300.0, 1800.0, 3600.0], deadline=4 * 3600.0),
    max_in_flight=200,
    rate_limit=50.0,
    disable_after=86_400.0,
    disabled_reason="every attempt failed for 24h",
    disabled_at=1_795_273_500_000,
)
PLAIN = Destination(id="plain", sources=["web"], webhooks=[Webhook(url="https://example.org/")])
TABLE = ConfigTable.build([Source(id="web", write_keys=["wk_live_1"])], [POLICY, PLAIN])


def test_text_shows_the_policy_under_each_destination() -> None:
    lines = format_config(TABLE).splitlines()
    hooks = next(i for i, line in enumerate(lines) if line.startswith("hooks "))
    assert lines[hooks + 1] == (
        "  retry 10s,1m,5m,30m,1h deadline 4h; max in flight 200; rate limit 50/s; disable after 1d"
    )
    assert lines[hooks + 2] == (
        "  disabled: every attempt failed for 24h since 2026-11-21T15:05:00.000Z"
    )
    plain = next(i for i, line in enumerate(lines) if line.startswith("plain "))
    assert lines[plain + 1] == (
        "  retry default deadline default; max in flight -; rate limit -; disable after -"
    )
    assert lines[plain + 2 :] == []


def test_the_ordering_is_shown_when_it_is_not_the_default() -> None:
    ordered = PLAIN.model_copy(update={"ordering": Ordering.PER_USER})
    lines = format_config(ConfigTable.build([Source(id="web")], [ordered])).splitlines()
    plain = next(i for i, line in enumerate(lines) if line.startswith("plain "))
    assert lines[plain + 1] == (
        "  retry default deadline default; max in flight -; rate limit -; disable after -; "
        "ordering per_user"
    )
    assert "ordering" not in format_config(TABLE)  # none, the default, goes without saying
    shown = orjson.loads(
        format_config(ConfigTable.build([Source(id="web")], [ordered]), as_json=True)
    )
    assert shown["destinations"][0]["ordering"] == "per_user"
    assert orjson.loads(format_config(TABLE, as_json=True))["destinations"][1]["ordering"] == "none"


def test_a_partial_retry_policy_shows_the_default_for_the_rest() -> None:
    dest = PLAIN.model_copy(update={"retry": RetryPolicy(deadline=7200.0)})
    text = format_config(ConfigTable.build([Source(id="web")], [dest]))
    assert "  retry default deadline 2h; " in text


def test_json_has_the_config_file_keys_with_durations_as_text() -> None:
    shown = orjson.loads(format_config(TABLE, as_json=True))["destinations"]
    hooks, plain = shown
    assert hooks["retry"] == {"delays": ["10s", "1m", "5m", "30m", "1h"], "deadline": "4h"}
    assert hooks["max_in_flight"] == 200
    assert hooks["rate_limit"] == 50.0
    assert hooks["disable_after"] == "1d"
    assert hooks["disabled_reason"] == "every attempt failed for 24h"
    assert hooks["disabled_at"] == 1_795_273_500_000
    assert plain["retry"] is None
    assert plain["disable_after"] is None
    assert plain["disabled_reason"] is None


def test_secrets_stay_masked() -> None:
    for text in (format_config(TABLE), format_config(TABLE, as_json=True)):
        assert SECRET not in text
        assert "tok-9f8e7d6c" not in text
        assert "wk_live_1" not in text
    hooks = orjson.loads(format_config(TABLE, as_json=True))["destinations"][0]
    assert hooks["shared_secret"].startswith("••••")
    assert hooks["webhooks"][0]["headers"]["Authorization"].startswith("••••")
    unmasked = orjson.loads(format_config(TABLE, show_secrets=True, as_json=True))
    assert unmasked["destinations"][0]["shared_secret"] == SECRET


def test_a_batch_is_shown_with_its_limits() -> None:
    batched = PLAIN.model_copy(update={"batch": Batch(max_events=50, max_wait=0.25)})
    table = ConfigTable.build([Source(id="web")], [batched])
    lines = format_config(table).splitlines()
    plain = next(i for i, line in enumerate(lines) if line.startswith("plain "))
    assert lines[plain + 1].endswith("; batches of 50 / 500KB / 250ms")
    assert "batches" not in format_config(TABLE)
    shown = orjson.loads(format_config(table, as_json=True))["destinations"][0]["batch"]
    assert shown == {"max_events": 50, "max_bytes": "500KB", "max_wait": "250ms"}


def test_the_public_key_is_shown_and_the_signing_key_never() -> None:
    from pipeline.core.signing import new_signing_key, public_key_of

    key = new_signing_key()
    signed = PLAIN.model_copy(update={"signing": Signing.ED25519, "signing_key": key})
    table = ConfigTable.build([Source(id="web")], [signed])
    text = format_config(table)
    assert f"  signing ed25519: public key {public_key_of(key)}" in text
    assert key not in text and key not in format_config(table, as_json=True)
    shown = orjson.loads(format_config(table, as_json=True))["destinations"][0]
    assert shown["signing_public_key"] == public_key_of(key)
    assert shown["signing_key"].startswith("••••")


def test_a_rotation_window_is_shown_and_its_secret_masked() -> None:
    rotating = POLICY.model_copy(
        update={
            "previous_secrets": [
                PreviousSecret(secret="old-secret-value-77", until="2026-11-30T12:00:00Z")
            ]
        }
    )
    table = ConfigTable.build([Source(id="web")], [rotating])
    text = format_config(table)
    assert "  rotating: the previous secret signs until 2026-11-30T12:00:00.000Z" in text
    assert "old-secret-value" not in text
    shown = orjson.loads(format_config(table, as_json=True))["destinations"][0]
    assert shown["previous_secrets"] == [{"secret": "••••77", "until": "2026-11-30T12:00:00.000Z"}]
    unmasked = orjson.loads(format_config(table, as_json=True, show_secrets=True))
    assert unmasked["destinations"][0]["previous_secrets"][0]["secret"] == "old-secret-value-77"


def test_tls_files_are_shown_and_a_pem_key_masked() -> None:
    from pipeline.core.config import ClientTls

    pem_key = "-----BEGIN PRIVATE KEY-----\nMIIEv\n-----END PRIVATE KEY-----\n"
    tls = ClientTls(certificate="/etc/pipeline/client.pem", key=pem_key, ca="/etc/pipeline/ca.pem")
    table = ConfigTable.build([Source(id="web")], [PLAIN.model_copy(update={"mtls": tls})])
    text = format_config(table)
    assert "  tls: certificate /etc/pipeline/client.pem, ca /etc/pipeline/ca.pem" in text
    shown = orjson.loads(format_config(table, as_json=True))["destinations"][0]["mtls"]
    assert shown == {
        "certificate": "/etc/pipeline/client.pem",
        "key": "•••• (PEM)",
        "ca": "/etc/pipeline/ca.pem",
    }
    assert "MIIEv" not in format_config(table, as_json=True)


def test_a_proxy_is_shown_with_its_password_masked() -> None:
    proxied = PLAIN.model_copy(update={"proxy": "http://egress:pa55word@proxy.internal:3128"})
    table = ConfigTable.build([Source(id="web")], [proxied])
    assert "  proxy: http://egress:••••@proxy.internal:3128" in format_config(table)
    assert "pa55word" not in format_config(table) + format_config(table, as_json=True)
    shown = format_config(table, as_json=True, show_secrets=True)
    assert "pa55word" in shown
