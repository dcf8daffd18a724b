"""Deletion requests end to end: real broker, real worker, real receivers (seed §1.6, §2.2, §6)."""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Callable
from typing import Any

import pytest

from pipeline.core.settings import Settings
from tests.support import BODY, Receiver, apply, run_cli, three_sources, wait_for

pytestmark = pytest.mark.integration

#: How long "nothing more arrives" is watched: well over the few hundred ms a delivery takes here.
QUIET_SECONDS = 1.5


def test_delete_user_notifies_each_affected_source_once(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    worker_factory: Callable[..., Any],
) -> None:
    web, ios, batch = receivers = [receiver_factory() for _ in range(3)]
    three_sources(settings, receivers)
    worker_factory(settings)

    first = run_cli(settings, "delete-user", "user-42", "--reason", "GDPR ticket 7")
    assert first.returncode == 0, first.stderr
    assert "delete call sent for 2 source(s): ios, web" in first.stdout
    assert "not notified (no enabled destination): batch" in first.stdout
    wait_for(lambda: web.count() >= 1 and ios.count() >= 1, timeout=20)

    for receiver in (web, ios):
        (request,) = receiver.requests
        assert BODY.fullmatch(request.body), request.body
        assert list(request.json) == ["type", "userId", "timestamp"]
        assert request.headers["Content-Type"] == "application/json"
    signature = hmac.new(b"s3cret", ios.requests[0].body, hashlib.sha1).hexdigest()
    assert ios.requests[0].headers["X-Signature"] == signature
    assert "X-Signature" not in web.requests[0].headers

    # A repeat sends nothing: every affected source was already notified.
    repeat = run_cli(settings, "delete-user", "user-42")
    assert repeat.returncode == 0, repeat.stderr
    assert "no delete call sent" in repeat.stdout
    assert "web: already notified at" in repeat.stdout
    time.sleep(QUIET_SECONDS)
    assert (web.count(), ios.count(), batch.count()) == (1, 1, 0)

    status = run_cli(settings, "delete-user", "--status", "user-42")
    assert status.returncode == 0, status.stderr
    assert "user 'user-42': 2 deletion request(s)" in status.stdout
    assert "reason: 'GDPR ticket 7'" in status.stdout
    assert re.search(r"ios +delete sent at \S+Z messageId \S+", status.stdout)
    assert re.search(r"web +delete sent at \S+Z messageId \S+", status.stdout)
    assert "nothing sent" in status.stdout

    # --force notifies every affected source again, with new messageIds.
    forced = run_cli(settings, "delete-user", "user-42", "--force")
    assert forced.returncode == 0, forced.stderr
    assert "delete call sent for 2 source(s): ios, web" in forced.stdout
    wait_for(lambda: web.count() >= 2 and ios.count() >= 2, timeout=20)
    time.sleep(0.5)
    assert (web.count(), ios.count(), batch.count()) == (2, 2, 0)
    assert all(BODY.fullmatch(r.body) for r in web.requests + ios.requests)


def test_delete_user_status_and_bad_input(settings: Settings) -> None:
    apply(settings, {"sources": [{"id": "web"}]})
    unknown = run_cli(settings, "delete-user", "--status", "nobody")
    assert unknown.returncode == 1
    assert "no deletion request for user 'nobody'" in unknown.stdout

    too_long = run_cli(settings, "delete-user", "x" * 1025)
    assert too_long.returncode == 2
    assert "USER_ID: is 1,025 characters, over the limit of 1,024" in too_long.stderr

    mixed = run_cli(settings, "delete-user", "--status", "--force", "u1")
    assert mixed.returncode == 2 and "--status" in mixed.stderr

    # No source has an enabled destination: the request is recorded, nothing is sent.
    lonely = run_cli(settings, "delete-user", "u1")
    assert lonely.returncode == 0, lonely.stderr
    assert "no delete call sent" in lonely.stdout
    status = run_cli(settings, "delete-user", "--status", "u1")
    assert "1 deletion request(s)" in status.stdout and "nothing sent" in status.stdout
