"""Delivery safety: SSRF guard, endpoint isolation, replay-protected signatures, secrets.

Only loopback addresses are ever connected to; "blocked" cases make no connection at all.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import orjson

from tests.support import (
    ROOT,
    apply,
    dead_letters,
    run_cli,
    send_calls,
    settings_env,
    simple_config,
    stays,
    wait_for,
    wait_or_tell,
)

TRACK = {"type": "track", "userId": "u1", "event": "Guarded"}


def test_loopback_is_blocked_by_default_and_delivered_when_allowed(
    settings, receiver_factory, worker_factory
):
    receiver = receiver_factory()
    guarded = settings.replace(allowed_networks=())
    apply(guarded, simple_config(receiver.url))
    worker = worker_factory(guarded, ("router", "deliver"))
    send_calls(guarded, [TRACK], "wk")

    [letter] = dead_letters(guarded, 1)
    assert letter["reason"] == "blocked_address"
    assert (
        "127.0.0.1 is in a blocked range (loopback)" in letter["delivery"]["attempts"][0]["error"]
    )
    assert receiver.count() == 0
    worker.stop()

    worker_factory(settings, ("retry",))  # loopback allowed: the replay goes through
    assert "replayed 1;" in run_cli(settings, "dlq", "replay").stdout
    wait_for(lambda: receiver.count() == 1)


def test_a_host_name_resolving_to_a_blocked_address_is_refused(
    settings, receiver_factory, worker_factory
):
    receiver = receiver_factory()
    by_name = receiver.url.replace("127.0.0.1", "localhost")
    guarded = settings.replace(allowed_networks=())
    apply(guarded, simple_config(by_name))
    worker_factory(guarded, ("router", "deliver"))
    send_calls(guarded, [TRACK], "wk")

    [letter] = dead_letters(guarded, 1)
    assert letter["reason"] == "blocked_address"
    assert (
        "localhost resolves only to blocked addresses" in letter["delivery"]["attempts"][0]["error"]
    )
    assert receiver.count() == 0


def test_config_apply_warns_about_urls_in_blocked_ranges(settings, tmp_path):
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(simple_config("http://169.254.169.254/latest/meta-data")))
    guarded = settings.replace(allowed_networks=())
    result = run_cli(guarded, "config", "apply", str(path))
    assert result.returncode == 0, result.stderr
    assert (
        "warning: destinations[0] (hooks).webhooks[0].url: 169.254.169.254 resolves to blocked "
        "addresses (169.254.169.254 is in a blocked range (link-local))" in result.stderr
    )


def test_circuit_breaker_opens_and_recovers(settings, receiver_factory, worker_factory):
    settings = settings.replace(
        circuit_failures=3,
        circuit_cool_down=2.0,
        retry_delays=(1.0,),
        # Room for a slow machine: records that reach the deliverer after the circuit opened
        # meet the leftover 500s one half-open probe (2 s cool-down) at a time.
        retry_deadline=90.0,
    )
    receiver = receiver_factory(200)
    receiver.responses = [500] * 20
    apply(settings, simple_config(receiver.url))
    worker_factory(settings)
    send_calls(settings, [dict(TRACK, messageId=f"c-{i}") for i in range(20)], "wk")

    wait_for(lambda: len({b["messageId"] for b in receiver.delivered()}) == 20, timeout=90)
    # 20 failures opened the circuit; the retries due while it was open were not sent at all
    # (1 s tier, 2 s cool-down), then one probe closed it and every record went through once.
    assert receiver.count() == 40
    assert stays(lambda: receiver.count() == 40, 1.0)


def test_a_hanging_endpoint_does_not_hold_up_a_healthy_one(
    settings, receiver_factory, worker_factory
):
    hanging, healthy = receiver_factory("hang"), receiver_factory(200)
    config = simple_config(hanging.url)
    config["destinations"].append(
        {"id": "healthy", "sources": ["web"], "webhooks": [{"url": healthy.url}]}
    )
    apply(settings, config)
    worker_factory(settings)
    started = time.monotonic()
    send_calls(settings, [dict(TRACK, messageId=f"h-{i}") for i in range(300)], "wk")

    wait_or_tell(
        lambda: len(healthy.delivered()) == 300,
        30,
        {},
        lambda: (
            f"healthy: {len(healthy.delivered())} of 300 delivered, "
            f"{healthy.count()} requests; hanging: {hanging.count()} requests"
        ),
    )
    elapsed = time.monotonic() - started
    print(
        f"\nhealthy destination: 300 delivered in {elapsed:.1f} s beside a hanging one; "
        f"the hanging one saw {hanging.count()} requests"
    )
    # The circuit opened after 5 timeouts: most records for the hanging endpoint were never sent.
    assert hanging.count() < 300


def _independent_standard_webhooks_check(request, secret: str) -> bool:
    """Standard Webhooks v1, computed from the spec with hmac/base64 (not our signer)."""
    headers = {k.lower(): v for k, v in request.headers.items()}
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + request.body
    expected = base64.b64encode(hmac.new(secret.encode(), signed, hashlib.sha256).digest()).decode()
    return f"v1,{expected}" in headers["webhook-signature"].split()


def test_standard_webhooks_headers_verify_independently(settings, receiver_factory, worker_factory):
    receiver = receiver_factory()
    secret = "standard-secret"
    apply(settings, simple_config(receiver.url, secret=secret, standard_webhooks=True))
    worker_factory(settings)
    send_calls(settings, [dict(TRACK, messageId="sw-1")], "wk")

    wait_for(lambda: receiver.count() == 1)
    [request] = receiver.requests
    headers = {k.lower(): v for k, v in request.headers.items()}
    assert headers["webhook-id"] == "sw-1"
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 30
    assert _independent_standard_webhooks_check(request, secret)
    assert (
        headers["x-signature"] == hmac.new(secret.encode(), request.body, hashlib.sha1).hexdigest()
    )


def test_receiver_command_rejects_stale_and_forged_standard_webhooks(settings):
    import httpx

    from pipeline.core.signing import sign, standard_webhooks_headers

    # Two secrets, as during a rotation: either verifies.
    with receiver_command(settings, "--secret", "s", "--secret", "t") as port:
        body = b'{"type":"track"}'

        def post(timestamp: int, secret: str = "s", signed_with: str = "s") -> int:
            headers = {
                "X-Signature": sign(body, signed_with),
                **standard_webhooks_headers("m1", timestamp, body, secret),
            }
            return httpx.post(
                f"http://127.0.0.1:{port}/h", content=body, headers=headers
            ).status_code

        assert post(int(time.time())) == 200
        assert post(int(time.time()) - 240) == 200, "inside the 5-minute tolerance"
        assert post(int(time.time()) - 310) == 401, "older than the 5-minute tolerance: a replay"
        assert post(int(time.time()) + 310) == 401
        assert post(int(time.time()), secret="other") == 401
        assert post(int(time.time()), secret="t", signed_with="t") == 200  # the other secret
        assert post(int(time.time()), secret="t", signed_with="u") == 401
        assert (
            httpx.post(
                f"http://127.0.0.1:{port}/h", content=body, headers={"X-Signature": "00"}
            ).status_code
            == 401
        )


@contextlib.contextmanager
def receiver_command(settings: Any, *args: str) -> Iterator[int]:
    """``pipeline receiver ARGS`` on a free port, up; its port. Killed afterwards."""
    from pipeline.runtime.net import free_port

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "receiver", "--port", str(port), *args],
        cwd=ROOT,
        env=settings_env(settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: _up(port))
        yield port
    finally:
        process.kill()
        process.wait(10)
        assert process.stdout is not None
        process.stdout.close()


def _up(port: int) -> bool:
    from pipeline.runtime.net import port_open

    return port_open("127.0.0.1", port)


def test_secrets_never_appear_in_logs_listings_or_config_show(
    settings, receiver_factory, process_factory
):
    secret, token = "sekrit-hmac-key-0042", "Bearer tok-9f8e7d6c"
    failing = receiver_factory(500)
    failing.responses = [503]
    config = simple_config(failing.url, secret=secret)
    config["destinations"][0]["webhooks"][0]["headers"] = {"Authorization": token}
    apply(settings, config)
    worker = process_factory(settings, "worker", "--verbose")
    send_calls(settings, [TRACK, dict(TRACK, userId="u2")], "wk")
    dead_letters(settings, 2, timeout=40)
    worker.terminate()
    _, logs = worker.communicate(timeout=30)

    outputs = {
        "worker log": logs.decode(),
        "dlq list": run_cli(settings, "dlq", "list").stdout,
        "dlq list --json": run_cli(settings, "dlq", "list", "--json").stdout,
        "config show": run_cli(settings, "config", "show").stdout,
        "config show --json": run_cli(settings, "config", "show", "--json").stdout,
    }
    assert "retry" in outputs["worker log"].lower()  # the log did capture a run with failures
    for name, text in outputs.items():
        assert secret not in text, name
        assert "tok-9f8e7d6c" not in text, name
    shown = orjson.loads(outputs["config show --json"])["destinations"][0]
    assert shown["shared_secret"].startswith("••••")
    assert shown["webhooks"][0]["headers"]["Authorization"].startswith("••••")


def test_receiver_command_verifies_ed25519_with_the_public_key(settings):
    import httpx

    from pipeline.core.signing import new_signing_key, public_key_of, standard_webhooks_headers

    key = new_signing_key()
    with receiver_command(settings, "--public-key", public_key_of(key)) as port:
        body = b'{"type":"track"}'

        def post(signing_key: str, timestamp: int) -> int:
            headers = standard_webhooks_headers("m1", timestamp, body, signing_key=signing_key)
            return httpx.post(
                f"http://127.0.0.1:{port}/h", content=body, headers=headers
            ).status_code

        assert post(key, int(time.time())) == 200
        assert post(new_signing_key(), int(time.time())) == 401  # another key's signature
        assert post(key, int(time.time()) - 310) == 401  # a replay
