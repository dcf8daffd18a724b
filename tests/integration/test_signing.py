"""Signing secrets a receiver can rotate (issue: receivers' keys and auth).

Real broker, a real worker, a real HTTP receiver on 127.0.0.1; the Standard Webhooks signatures
are checked with the ``standardwebhooks`` library, as a receiver would, not with our own code.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from pipeline.core.secret_rotation import new_secret
from pipeline.core.signing import SIGNATURE_HEADER, verify
from pipeline.kafka.config_store import load_table
from pipeline.roles import delivery_outcomes
from tests.support import Request, apply, run_cli, send_calls, simple_config, wait_for


def standard_ok(request: Request, secret: str) -> bool:
    try:
        Webhook(secret).verify(request.body, request.headers)
    except WebhookVerificationError:
        return False
    return True


def x_signature_ok(request: Request, secret: str) -> bool:
    return verify(request.body, secret, request.headers.get(SIGNATURE_HEADER))


def iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def call(message_id: str) -> list[dict[str, Any]]:
    return [{"type": "track", "event": "Rotated", "userId": "u1", "messageId": message_id}]


def test_a_rotated_secret_signs_on_through_its_window_then_only_the_new_one(
    settings, receiver_factory, worker_factory, monkeypatch: pytest.MonkeyPatch
):
    """During the window X-Signature keeps the old secret and webhook-signature verifies with
    either; after it only the new one signs, and the old one leaves the config topic. Then
    ``config rotate-secret`` starts a window of its own without printing the new secret."""
    monkeypatch.setattr(delivery_outcomes, "SECRETS_SWEEP", 0.2)  # the worker runs in-process
    old, new = new_secret(), new_secret()
    receiver = receiver_factory()
    ends = time.time() + 6.0
    config = simple_config(
        receiver.url,
        secret=new,
        standard_webhooks=True,
        previous_secrets=[{"secret": old, "until": iso(ends)}],
    )
    apply(settings, config)
    worker_factory(settings)

    send_calls(settings, call("during"), "wk")
    wait_for(lambda: receiver.count() == 1)
    during = receiver.requests[0]
    assert during.at < ends
    assert x_signature_ok(during, old) and not x_signature_ok(during, new)
    assert standard_ok(during, old) and standard_ok(during, new)
    assert len(during.headers["webhook-signature"].split()) == 2

    wait_for(lambda: time.time() > ends + 0.1, timeout=15)
    send_calls(settings, call("after"), "wk")
    wait_for(lambda: receiver.count() == 2)
    after = receiver.requests[1]
    assert x_signature_ok(after, new) and not x_signature_ok(after, old)
    assert standard_ok(after, new) and not standard_ok(after, old)
    # The ended window's secret is gone from the live config (the deliver role's sweep).
    wait_for(lambda: load_table(settings).destinations["hooks"].previous_secrets == [])

    rotated = run_cli(settings, "config", "rotate-secret", "hooks", "--window", "1h")
    assert rotated.returncode == 0, rotated.stderr
    assert "rotated the shared secret of hooks" in rotated.stdout
    hooks = load_table(settings).destinations["hooks"]
    newest = hooks.shared_secret
    assert newest not in (old, new) and newest is not None
    assert newest not in rotated.stdout + rotated.stderr  # a secret never reaches the output
    [previous] = hooks.previous_secrets
    assert previous.secret == new
    assert abs(previous.until.timestamp() - (time.time() + 3600)) < 60

    def signed_by_newest_too() -> bool:
        send_calls(settings, call(f"later-{time.monotonic_ns()}"), "wk")
        wait_for(lambda: receiver.count() >= 3)
        return standard_ok(receiver.requests[-1], newest)

    wait_for(signed_by_newest_too, timeout=20, interval=0.3)  # once the worker has the rotation
    last = receiver.requests[-1]
    assert x_signature_ok(last, new) and standard_ok(last, new)

    too_long = run_cli(settings, "config", "rotate-secret", "hooks", "--window", "8d")
    assert too_long.returncode == 1
    assert "window: 8d is outside 1m..7d" in too_long.stderr
    assert load_table(settings).destinations["hooks"] == hooks  # nothing applied


def test_ed25519_signatures_verify_with_the_published_public_key(
    settings, receiver_factory, worker_factory
):
    """``signing: ed25519`` without a key in the file: apply makes one, applying the file again
    keeps it, ``config show`` publishes its public key and never the key, and every request
    carries a v1a signature that verifies with that public key (checked with ``cryptography``)."""
    import base64

    import orjson
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    receiver = receiver_factory()
    config = simple_config(receiver.url, signing="ed25519")
    apply(settings, config)
    key = load_table(settings).destinations["hooks"].signing_key
    assert key is not None and key.startswith("whsk_")
    apply(settings, config)  # the same file again: the key receivers know stays
    assert load_table(settings).destinations["hooks"].signing_key == key

    shown = run_cli(settings, "config", "show", "--json")
    assert shown.returncode == 0, shown.stderr
    assert key not in shown.stdout
    public = orjson.loads(shown.stdout)["destinations"][0]["signing_public_key"]
    assert public.startswith("whpk_")

    worker_factory(settings)
    send_calls(settings, call("signed"), "wk")
    wait_for(lambda: receiver.count() == 1)
    [request] = receiver.requests
    assert SIGNATURE_HEADER not in request.headers  # no shared secret: no HMAC
    [signature] = request.headers["webhook-signature"].split()
    version, _, value = signature.partition(",")
    assert version == "v1a"
    signed = f"{request.headers['webhook-id']}.{request.headers['webhook-timestamp']}.".encode()
    verifier = Ed25519PublicKey.from_public_bytes(base64.b64decode(public.removeprefix("whpk_")))
    verifier.verify(base64.b64decode(value), signed + request.body)  # raises when it does not
    assert request.headers["webhook-id"] == "signed"
