"""OAuth2 client credentials (``oauth2`` in a destination's config): a real token endpoint and a
real receiver that takes only its current tokens, on 127.0.0.1."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from pipeline.kafka.config_store import load_table
from tests.support import (
    ServerThread,
    apply,
    dead_letters,
    run_cli,
    send_calls,
    serve,
    simple_config,
    stays,
    wait_for,
)


class Authority:
    """A token endpoint (``/token``) and a receiver (``/hook``) that accepts a request only with
    a token it issued and has not revoked."""

    def __init__(self, server: ServerThread) -> None:
        self.lock = threading.Lock()
        self.issued: list[str] = []
        self.revoked: set[str] = set()
        self.lifetime = 3600
        self.failing = False
        self.delivered: list[str] = []
        self.refused = 0

        async def token(request: web.Request) -> web.Response:
            form = await request.post()
            assert form["grant_type"] == "client_credentials"
            with self.lock:
                if self.failing:
                    return web.json_response({"error": "temporarily_unavailable"}, status=500)
                issued = f"tok-{len(self.issued) + 1}"
                self.issued.append(issued)
            return web.json_response({"access_token": issued, "expires_in": self.lifetime})

        async def hook(request: web.Request) -> web.Response:
            body = await request.json()
            bearer = request.headers.get("Authorization", "").removeprefix("Bearer ")
            with self.lock:
                if bearer not in self.issued or bearer in self.revoked:
                    self.refused += 1
                    return web.Response(status=401)
                self.delivered.append(body["messageId"])
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_post("/token", token)
        app.router.add_post("/hook", hook)
        self.base = f"http://127.0.0.1:{serve(server, app)}"

    def count(self) -> int:
        with self.lock:
            return len(self.delivered)


@pytest.fixture
def server() -> Iterator[ServerThread]:
    thread = ServerThread()
    yield thread
    thread.close()


def calls(prefix: str, count: int) -> list[dict[str, Any]]:
    return [
        {"type": "track", "event": "Authorized", "userId": f"u{n}", "messageId": f"{prefix}{n}"}
        for n in range(count)
    ]


def test_a_token_is_fetched_once_refreshed_on_expiry_and_on_a_401(
    settings, server, worker_factory, tmp_path: Path
):
    authority = Authority(server)
    oauth = {
        "token_url": authority.base + "/token",
        "client_id": "pipeline",
        "client_secret": "client-s3cret-77",
        "scope": "hooks",
    }
    apply(settings, simple_config(authority.base + "/hook", oauth2=oauth))
    worker_factory(settings)

    # 100 calls, one token.
    send_calls(settings, calls("a", 100), "wk")
    wait_for(lambda: authority.count() == 100)
    assert authority.issued == ["tok-1"]

    # The receiver revokes it: the 401 brings a new token, and the call is delivered at once.
    authority.revoked.add("tok-1")
    send_calls(settings, calls("b", 1), "wk")
    wait_for(lambda: authority.count() == 101)
    assert authority.issued == ["tok-1", "tok-2"] and authority.refused == 1

    # A token endpoint answering 500: attempts fail as auth_error and are retried, not
    # dead-lettered; once it answers again, the calls are delivered.
    with authority.lock:
        authority.revoked.add("tok-2")
        authority.failing = True
    send_calls(settings, calls("c", 3), "wk")
    assert stays(lambda: authority.count() == 101, 1.5)
    with authority.lock:
        authority.failing = False
    wait_for(lambda: authority.count() == 104, timeout=30)
    assert dead_letters(settings, 0, timeout=0.5) == []

    # A short-lived token is refreshed before it expires.
    with authority.lock:
        authority.lifetime = 2
        authority.revoked.add(authority.issued[-1])
    send_calls(settings, calls("d", 1), "wk")
    wait_for(lambda: authority.count() == 105)
    before = len(authority.issued)
    time.sleep(2.0)  # the 2 s token's life: the next request needs a new one
    send_calls(settings, calls("e", 1), "wk")
    wait_for(lambda: authority.count() == 106)
    assert len(authority.issued) == before + 1

    # The secret is masked by config show, and no token appears in its output.
    shown = run_cli(settings, "config", "show", "--json")
    assert "client-s3cret" not in shown.stdout and "tok-" not in shown.stdout

    # A plain-http token URL outside PIPELINE_ALLOWED_NETWORKS is refused, nothing applied.
    before_table = load_table(settings)
    bad = simple_config(
        authority.base + "/hook", oauth2={**oauth, "token_url": "http://auth.example/token"}
    )
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    refused = run_cli(settings, "config", "apply", str(tmp_path / "bad.yaml"))
    assert refused.returncode != 0
    assert "(hooks).oauth2.token_url: 'http://auth.example/token' must be https://" in (
        refused.stderr
    )
    assert load_table(settings) == before_table
