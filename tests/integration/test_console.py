"""The web console in a real browser: Debian's headless Chromium, driven by Playwright, against
the console on 127.0.0.1, a real broker, an in-process worker (router, deliver, retry, log-store)
and real receivers.

One pipeline serves the module (it takes seconds to start); each test uses destinations and
user ids of its own. ``PIPELINE_CONSOLE_SCREENSHOTS=docs/console`` saves each page's screenshot
there (how the README's and docs' pictures are made).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import orjson
import pytest
from aiohttp import web
from confluent_kafka import Producer
from multidict import CIMultiDict

from pipeline.core.pace import Report, report_key
from pipeline.core.settings import Settings
from pipeline.core.signing import public_key_of, sign
from pipeline.http.console import make_console_app
from pipeline.kafka.broker import EmbeddedBroker
from pipeline.kafka.clients import create_topics, topics_for
from pipeline.kafka.config_store import load_table
from pipeline.ops.dlq import DlqFilter, list_dead_letters
from pipeline.runtime.net import free_port
from tests.support import (
    ROOT,
    SESSION_TIMEOUT,
    InProcessWorker,
    Receiver,
    Request,
    ServerThread,
    apply,
    require_system_tools,
    run_cli,
    send_calls,
    settings_env,
    stays,
    wait_for,
    wait_until_ready,
)

pytestmark = pytest.mark.integration

playwright_sync = pytest.importorskip("playwright.sync_api")

PASSWORD = "correct horse battery staple"
SECRET = "console-secret"
HOSTILE = "<img src=x onerror=alert(1)>"
TRACE_URL = "http://jaeger.test:16686/trace/{trace_id}"
SCREENSHOTS = os.environ.get("PIPELINE_CONSOLE_SCREENSHOTS")


class Pipeline:
    """The module's pipeline and console, and its receivers."""

    def __init__(self, settings: Settings, receivers: dict[str, Receiver], url: str) -> None:
        self.settings = settings
        self.receivers = receivers
        self.url = url

    def send(self, calls: list[dict[str, Any]], write_key: str = "wk_web") -> None:
        send_calls(self.settings, calls, write_key)


def _config(receivers: dict[str, Receiver]) -> dict[str, Any]:
    hook = receivers["hooks"].url
    return {
        "sources": [
            {"id": "web", "name": "Website", "write_keys": ["wk_web"]},
            {"id": "shop", "name": "Shop", "write_keys": ["wk_shop_0123456789"]},
            {"id": "jobs", "write_keys": ["wk_jobs"]},
        ],
        "destinations": [
            {
                "id": "hooks",
                "name": "Webhooks",
                "sources": ["web"],
                "shared_secret": SECRET,
                "webhooks": [{"url": hook, "headers": {"Authorization": "Bearer t"}}],
            },
            {
                "id": "five",
                "name": "Five",
                "sources": ["jobs"],
                "webhooks": [{"url": f"{hook}/{n}"} for n in range(5)],
            },
            {
                "id": "toggled",
                "name": "Toggled",
                "sources": ["shop"],
                "webhooks": [{"url": receivers["toggled"].url}],
            },
            {
                "id": "refusing",
                "name": "Refusing",
                "sources": ["jobs"],
                "webhooks": [{"url": receivers["refusing"].url}],
            },
        ],
    }


@pytest.fixture(scope="module")
def pipeline(
    broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pipeline]:
    require_system_tools("chromium")
    settings = Settings(
        bootstrap_servers=broker.bootstrap_servers,
        topic_prefix=f"c{uuid.uuid4().hex[:10]}.",
        partitions=2,
        retry_partitions=1,
        session_timeout=SESSION_TIMEOUT,
        retry_delays=(1.0,),
        retry_deadline=4.0,
        delivery_timeout=2.0,
        allowed_networks=("127.0.0.0/8",),
        transactions=False,
        log_store_url=f"sqlite:///{tmp_path_factory.mktemp('log') / 'log.sqlite3'}",
        state_dir=str(tmp_path_factory.mktemp("state")),
        trace_url_template=TRACE_URL,
    )
    create_topics(settings)
    servers = ServerThread()
    receivers = {name: _receiver(servers, name) for name in ("hooks", "toggled", "refusing")}
    receivers["refusing"].default = 400  # permanent: straight to the dead letters
    apply(settings, _config(receivers))
    worker = InProcessWorker(settings, ("router", "deliver", "retry", "log-store"))
    app = make_console_app(settings, password=PASSWORD)
    runner = web.AppRunner(app, access_log=None)

    async def start() -> str:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    url = servers.run(start())
    try:
        yield Pipeline(settings, receivers, url)
    finally:
        servers.run(runner.cleanup())
        worker.stop()
        servers.close()


def _receiver(servers: ServerThread, name: str) -> Receiver:
    """A receiver that records every request and answers ``receiver.default`` (changeable),
    with a body that holds markup (which the console must show as text)."""
    receiver = Receiver(url="", default=200)

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        with receiver.lock:
            answer = receiver.default
            receiver.requests.append(
                Request(request.path, CIMultiDict(request.headers), body, time.time(), answer)
            )
        return web.Response(
            status=answer,
            text=f"answer from {name}: <b>{answer}</b>",
            headers={"X-Receiver": name},
        )

    async def start() -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        servers.runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}/{name}"

    receiver.url = servers.run(start())
    return receiver


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_sync.sync_playwright() as p:
        launched = p.chromium.launch(
            executable_path="/usr/bin/chromium",
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any, pipeline: Pipeline) -> Iterator[Any]:
    """A fresh browser context (no cookies); any JavaScript dialog fails the test."""
    context = browser.new_context(base_url=pipeline.url, viewport={"width": 1300, "height": 900})
    context.set_default_timeout(20_000)
    tab = context.new_page()
    dialogs: list[str] = []
    tab.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    yield tab
    context.close()
    assert dialogs == [], f"a page ran script: {dialogs}"


def expect(locator: Any) -> Any:
    return playwright_sync.expect(locator)


def login(page: Any, then: str = "/") -> None:
    page.goto(then)
    page.fill("#password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(re.escape(then) + r"$"))


def screenshot(page: Any, name: str) -> None:
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"), full_page=True)


def track(user: str, event: str, n: int = 1) -> list[dict[str, Any]]:
    return [
        {"type": "track", "userId": user, "event": event, "properties": {"n": i}} for i in range(n)
    ]


def _seen_users(receiver: Receiver, user: str) -> int:
    return sum(1 for body in receiver.bodies() if body.get("userId") == user)


# ---- login and the page's armour ----------------------------------------------------------------


def test_a_page_that_needs_login_redirects_there(page: Any, pipeline: Pipeline):
    response = page.goto("/destinations")
    assert re.search(r"/login\?next=(%2F|/)destinations$", page.url)
    assert "script-src" not in response.headers["content-security-policy"]
    assert "default-src 'none'" in response.headers["content-security-policy"]
    screenshot(page, "login")
    page.fill("#password", "wrong")
    page.click("button[type=submit]")
    expect(page.get_by_role("alert")).to_have_text("wrong password")
    page.fill("#password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/destinations$"))
    cookie = next(c for c in page.context.cookies() if c["name"] == "pipeline_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    # A form posted without the session's CSRF token is refused, even with the cookie.
    answer = page.request.post(f"{pipeline.url}/destinations/hooks/toggle", form={"back": "/"})
    assert answer.status == 403 and "CSRF" in answer.text()
    assert load_table(pipeline.settings).destinations["hooks"].enabled


# ---- destinations -------------------------------------------------------------------------------


def test_toggle_stops_and_resumes_deliveries(page: Any, pipeline: Pipeline):
    toggled = pipeline.receivers["toggled"]
    user = f"t-{uuid.uuid4().hex[:6]}"
    pipeline.send(track(user, "Before", 3), "wk_shop_0123456789")
    wait_for(lambda: _seen_users(toggled, user) == 3)

    login(page, "/destinations/toggled")
    page.click("#toggle")
    expect(page.locator("#state")).to_have_text("disabled")
    expect(page.locator(".flash")).to_contain_text("toggled disabled")
    assert not load_table(pipeline.settings).destinations["toggled"].enabled
    paused = f"p-{uuid.uuid4().hex[:6]}"
    pipeline.send(track(paused, "While Off", 3), "wk_shop_0123456789")
    assert stays(lambda: _seen_users(toggled, paused) == 0, 3.0)

    page.click("#toggle")
    expect(page.locator("#state")).to_have_text("enabled")
    resumed = f"r-{uuid.uuid4().hex[:6]}"
    pipeline.send(track(resumed, "After", 3), "wk_shop_0123456789")
    wait_for(lambda: _seen_users(toggled, resumed) == 3)
    assert _seen_users(toggled, paused) == 0  # dropped while disabled, as the seed says

    # Each change is on pipeline.events, and shown on the page, naming the session.
    page.reload()
    changes = page.locator("tr.event.console_change")
    expect(changes).to_have_count(2)
    expect(changes.first).to_contain_text("console:")
    expect(page.locator("#origin")).to_contain_text("console:")
    screenshot(page, "destination")


def test_redirects_stay_on_the_console_and_a_stale_button_changes_nothing(
    page: Any, pipeline: Pipeline
):
    # A login whose next page is another host lands on the overview.
    page.goto("/login?next=" + urllib.parse.quote("/\\evil.example/x", safe=""))
    page.fill("#password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"127\.0\.0\.1:\d+/$"))
    # Two tabs on the same destination: Disable in one, then Disable again in the stale other.
    other = page.context.new_page()
    page.goto("/destinations/toggled")
    other.goto("/destinations/toggled")
    page.click("#toggle")
    expect(page.locator("#state")).to_have_text("disabled")
    other.click("#toggle")  # its button still says Disable
    expect(other.locator(".flash")).to_have_text("toggled is disabled already")
    assert not load_table(pipeline.settings).destinations["toggled"].enabled
    # A form opened before that change cannot save over it.
    other.go_back()
    other.reload()
    page.click("#toggle")  # enabled again, after the other form was loaded
    expect(page.locator("#state")).to_have_text("enabled")
    other.fill("input[name=name]", "Renamed")
    other.click("#save")
    expect(other.locator('.field-error[data-field=""]')).to_contain_text("was changed by console:")
    table = load_table(pipeline.settings)
    assert table.destinations["toggled"].enabled and table.destinations["toggled"].name == "Toggled"
    other.close()


def test_a_sixth_webhook_is_refused_next_to_the_field(page: Any, pipeline: Pipeline):
    login(page, "/destinations/five")
    page.fill("#url_5", "https://example.com/sixth")
    page.click("#save")
    error = page.locator('.field-error[data-field="webhooks"]')
    expect(error).to_have_text(
        re.compile(
            r"^destinations\[\d+\] \(five\)\.webhooks: at most 5 webhooks per destination, got 6$"
        )
    )
    assert len(load_table(pipeline.settings).destinations["five"].webhooks) == 5
    # A URL without a scheme gets config apply's words next to its own field.
    page.fill("#url_5", "")
    page.fill("#url_1", "example.com/hook")
    page.click("#save")
    expect(page.locator('.field-error[data-field="webhooks[1].url"]')).to_contain_text(
        "must use http:// or https://"
    )
    screenshot(page, "destination-errors")


def create_destination(
    page: Any, pipeline: Pipeline, dest: str, more: Callable[[], None] = lambda: None
) -> None:
    """Create ``dest`` through the console's form (source ``jobs``, one webhook), ``more``
    filling in the rest, and wait for its page."""
    login(page, "/destinations/new")
    page.fill("input[name=id]", dest)
    page.check("input[name=source][value=jobs]")
    page.fill("#url_0", pipeline.receivers["hooks"].url + "/" + dest)
    more()
    page.click("#save")
    page.wait_for_url(re.compile(rf"/destinations/{dest}$"))


def test_secret_is_set_never_shown_and_policy_is_saved(page: Any, pipeline: Pipeline):
    def policy() -> None:
        page.check("input[name=secret_action][value=set]")
        page.fill("input[name=secret]", "s3cret-value")
        page.fill("input[name=retry_delays]", "5s, 1m")
        page.fill("input[name=rate_limit]", "25")
        page.select_option("#batch", "on")
        page.fill("input[name=batch_max_events]", "50")
        page.fill("input[name=batch_max_wait]", "250ms")

    create_destination(page, pipeline, "created", policy)
    expect(page.locator("#secret-state")).to_have_text("set")
    assert "s3cret-value" not in page.content()
    created = load_table(pipeline.settings).destinations["created"]
    assert created.shared_secret == "s3cret-value"
    assert created.retry is not None and created.retry.delays == [5.0, 60.0]
    assert created.rate_limit == 25
    assert created.batch is not None
    assert (created.batch.max_events, created.batch.max_bytes, created.batch.max_wait) == (
        50,
        500_000,
        0.25,
    )
    expect(page.locator("input[name=batch_max_bytes]")).to_have_value("500KB")
    # A bad size is refused next to its field, with config apply's words; nothing changes.
    page.fill("input[name=batch_max_bytes]", "lots")
    page.click("#save")
    expect(page.locator('.field-error[data-field="batch.max_bytes"]')).to_contain_text(
        "must be a size such as 500KB"
    )
    assert load_table(pipeline.settings).destinations["created"] == created
    page.fill("input[name=batch_max_bytes]", "500KB")
    # A bad duration is refused with config apply's words; nothing changes.
    page.fill("input[name=retry_delays]", "5s, soon")
    page.click("#save")
    expect(page.locator('.field-error[data-field="retry.delays[1]"]')).to_contain_text(
        "'soon' is not a duration"
    )
    assert load_table(pipeline.settings).destinations["created"] == created


def test_rotate_the_secret_keeps_the_old_one_for_the_window_and_shows_no_secret(
    page: Any, pipeline: Pipeline
):
    def secret() -> None:
        page.check("input[name=secret_action][value=set]")
        page.fill("input[name=secret]", "first-secret-value")
        page.select_option("#signing", "ed25519")

    dest = f"rotating-{uuid.uuid4().hex[:6]}"
    create_destination(page, pipeline, dest, secret)
    expect(page.locator(".rotation")).to_have_count(0)
    # Ed25519: the key was made on save; the page shows its public key, never the key.
    signing_key = load_table(pipeline.settings).destinations[dest].signing_key
    assert signing_key is not None
    expect(page.locator("#public-key")).to_have_text(public_key_of(signing_key))
    assert signing_key not in page.content()
    page.fill("#rotate-window", "8d")
    page.click("#rotate")
    expect(page.locator(".flash")).to_contain_text("not rotated: window: 8d is outside 1m..7d")
    assert load_table(pipeline.settings).destinations[dest].shared_secret == "first-secret-value"
    page.fill("#rotate-window", "2h")
    page.click("#rotate")
    expect(page.locator("#rotation-0")).to_contain_text("the previous secret still signs until")
    rotated = load_table(pipeline.settings).destinations[dest]
    assert rotated.shared_secret not in (None, "first-secret-value")
    [previous] = rotated.previous_secrets
    assert previous.secret == "first-secret-value"
    assert abs(previous.until.timestamp() - (time.time() + 7200)) < 120
    content = page.content()
    assert "first-secret-value" not in content and str(rotated.shared_secret) not in content
    assert rotated.signing_key == signing_key and signing_key not in content
    screenshot(page, "destination-rotating-secret")


def test_an_ordered_destination_shows_its_held_users(page: Any, pipeline: Pipeline):
    """Holds written to the ordering changelog (by hand, as the deliver role writes them) show
    on the destination's page, counted, with the oldest; an unordered destination has no line."""
    dest = f"ordered-{uuid.uuid4().hex[:6]}"
    create_destination(page, pipeline, dest, lambda: page.select_option("#ordering", "per_user"))
    held = page.locator("#held-users")
    expect(held).to_have_text("Held users: 0")
    now = int(time.time() * 1000)
    oldest = now - 270_000  # 4 min 30 s ago
    producer = Producer({"bootstrap.servers": pipeline.settings.bootstrap_servers})
    topic = topics_for(pipeline.settings).changelog("ordering")
    for key, value in [
        (f"h\x00{dest}/u1", oldest.to_bytes(8, "big") + b"m-1"),
        (f"h\x00{dest}/{HOSTILE}", (now - 1_000).to_bytes(8, "big") + HOSTILE.encode()),
        (f"q\x00{dest}/u1\x00" + "\x00" * 7 + "\x09", now.to_bytes(8, "big") + b"queued"),
    ]:
        producer.produce(topic, key=key.encode(), value=value, partition=0)
    assert producer.flush(10) == 0
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(oldest // 1000))
    wanted = f"Held users: 2 (oldest since {since}, 4m ago)"

    def shown() -> bool:
        page.reload()
        return bool(held.inner_text() == wanted)

    wait_for(shown, timeout=30)
    assert HOSTILE not in page.content()
    screenshot(page, "destination-held-users")
    page.goto("/destinations/hooks")
    expect(page.locator("h1")).to_contain_text("Destination hooks")
    assert page.locator("#held-users").count() == 0


def test_a_destination_page_shows_its_pace(page: Any, pipeline: Pipeline):
    """A pause reported to the pace topic (by hand, as a worker reports it) shows on the
    destination's page; a rate limit shows while nothing lowers it."""
    dest = f"paced-{uuid.uuid4().hex[:6]}"
    create_destination(page, pipeline, dest, lambda: page.fill("input[name=rate_limit]", "25"))
    pace = page.locator("#pace")
    expect(pace).to_have_text("Pace: 25/s (its rate_limit, for all workers)")
    until = time.time() + 600
    producer = Producer({"bootstrap.servers": pipeline.settings.bootstrap_servers})
    report = Report(demand=3.0, paused_until=until, at=time.time())
    producer.produce(
        topics_for(pipeline.settings).pace, key=report_key(dest, "w1"), value=report.encode()
    )
    assert producer.flush(10) == 0
    shown = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(until))
    wanted = f"Pace: paused until {shown} UTC (its receiver asked, Retry-After)"

    def paused() -> bool:
        page.reload()
        return bool(pace.inner_text() == wanted)

    wait_for(paused, timeout=30)
    screenshot(page, "destination-paused")


# ---- sources and the schema page ----------------------------------------------------------------


def test_block_an_event_on_the_source_schema_page(page: Any, pipeline: Pipeline):
    hooks = pipeline.receivers["hooks"]
    user = f"b-{uuid.uuid4().hex[:6]}"
    pipeline.send(track(user, "Debug Event", 2) + track(user, HOSTILE), "wk_web")
    wait_for(lambda: _seen_users(hooks, user) == 3)

    login(page, "/sources")
    expect(page.locator("#row-shop")).to_contain_text("wk_s••••••••89")
    assert "wk_shop_0123456789" not in page.content()
    page.goto("/sources/web")
    rows = page.locator("tr.event-row")
    expect(rows.filter(has_text="Debug Event")).to_have_count(1, timeout=30_000)
    # The hostile event name is text, not markup.
    hostile = page.locator("td.event-name", has_text="onerror")
    expect(hostile).to_have_text(HOSTILE)
    assert page.locator("table.schema img").count() == 0
    screenshot(page, "source-schema")

    rows.filter(has_text="Debug Event").locator("button.block-toggle").click()
    expect(rows.filter(has_text="Debug Event").locator("td.state")).to_have_text("blocked")
    assert load_table(pipeline.settings).sources["web"].blocked_events == ["Debug Event"]
    later = f"l-{uuid.uuid4().hex[:6]}"
    pipeline.send(track(later, "Debug Event", 2) + track(later, "Allowed"), "wk_web")
    wait_for(lambda: _seen_users(hooks, later) == 1)  # the allowed one, sent after the blocked
    assert [b["event"] for b in hooks.bodies() if b.get("userId") == later] == ["Allowed"]
    change = page.locator("tr.event.console_change")
    expect(change).to_contain_text("source web: blocked_events changed in the console by console:")

    # Reveal shows one key, on request only.
    page.goto("/sources/shop")
    page.click("button.reveal")
    expect(page.locator("code.revealed")).to_have_text("wk_shop_0123456789")


# ---- messages and traces ------------------------------------------------------------------------


def test_find_a_message_and_read_its_trace(page: Any, pipeline: Pipeline):
    hooks = pipeline.receivers["hooks"]
    user = f"m-{uuid.uuid4().hex[:6]}"
    pipeline.send(track(user, "Traced"), "wk_web")
    wait_for(lambda: _seen_users(hooks, user) == 1)
    message_id = next(b["messageId"] for b in hooks.bodies() if b.get("userId") == user)

    login(page, "/messages")
    page.fill("#user", user)

    def delivered_row() -> Any:
        page.click("#search")
        return page.locator("table.journeys tr.state-delivered").count() == 1

    wait_for(delivered_row, timeout=30)
    screenshot(page, "messages")
    page.click(f"text={message_id}")
    page.wait_for_url(re.compile(re.escape(message_id) + "$"))
    attempt = page.locator("tr.entry.kind-attempt")
    expect(attempt).to_have_count(1)
    expect(attempt.locator("td.status")).to_have_text("200")
    expect(page.locator("tr.journey")).to_contain_text("delivered")
    screenshot(page, "trace")
    # The same call sent again is dropped as a resend: the trace says so, and when the first
    # copy came; the call stays delivered.
    pipeline.send([dict(track(user, "Traced")[0], messageId=message_id)], "wk_web")
    resend = page.locator("tr.entry.kind-dropped")

    def resend_shown() -> bool:
        page.reload()
        return resend.count() == 1

    wait_for(resend_shown, timeout=30)
    expect(resend).to_contain_text("a resend of the call first received at 20")
    expect(resend).to_contain_text("duplicate")
    expect(page.locator("tr.journey.state-delivered")).to_contain_text("hooks")
    expect(page.locator("tr.journey.state-dropped")).to_have_count(0)
    assert _seen_users(hooks, user) == 1
    # A hostile messageId is one path segment in its link, and its trace is found.
    hostile_user = f"h-{uuid.uuid4().hex[:6]}"
    hostile_id = f"../destinations/new?x=<b>{uuid.uuid4().hex[:6]}#"
    pipeline.send([dict(track(hostile_user, "Odd")[0], messageId=hostile_id)], "wk_web")
    wait_for(lambda: _seen_users(hooks, hostile_user) == 1)
    page.goto("/messages")
    page.fill("#user", hostile_user)

    def found() -> bool:
        page.click("#search")
        return page.locator("table.journeys tr.state-delivered").count() == 1

    wait_for(found, timeout=30)
    page.get_by_role("link", name=hostile_id).click()
    expect(page.locator("h1 code")).to_have_text(hostile_id)
    expect(page.locator("tr.entry.kind-attempt td.status")).to_have_text("200")
    # The messageId field goes straight to the trace.
    page.goto("/messages")
    page.fill("#message_id", message_id)
    page.click("#search")
    page.wait_for_url(re.compile(re.escape(message_id) + "$"))


def test_a_traced_calls_page_links_its_trace(page: Any, pipeline: Pipeline):
    """A call made inside an application's span (our client, straight to Kafka) is in that
    trace: its page shows the trace id, linked by ``PIPELINE_TRACE_URL_TEMPLATE``."""
    from opentelemetry.sdk.trace import TracerProvider

    from pipeline.client import Client

    message_id = f"traced-{uuid.uuid4().hex[:8]}"
    client = Client(
        "wk_web",
        bootstrap_servers=pipeline.settings.bootstrap_servers,
        topic_prefix=pipeline.settings.topic_prefix,
        source_id="web",
        flush_at=1,
    )
    with TracerProvider().get_tracer("app").start_as_current_span("sign-up") as span:
        client.track(user_id="traced-user", event="Signed Up", message_id=message_id)
    client.flush()
    client.close()
    trace_id = f"{span.get_span_context().trace_id:032x}"

    login(page, f"/messages/{message_id}")
    link = page.locator("dd.trace-id a")
    wait_for(lambda: page.reload() and link.count() == 1, timeout=30)  # once the store has it
    expect(link).to_have_text(trace_id)
    expect(link).to_have_attribute("href", TRACE_URL.replace("{trace_id}", trace_id))


# ---- dead letters -------------------------------------------------------------------------------


def test_replay_a_dead_letter(page: Any, pipeline: Pipeline):
    refusing = pipeline.receivers["refusing"]
    user = f"d-{uuid.uuid4().hex[:6]}"
    pipeline.send(track(user, "Refused"), "wk_jobs")
    letters = wait_for(
        lambda: [
            entry
            for entry in list_dead_letters(pipeline.settings, DlqFilter(destination="refusing"))
            if entry.dead_letter.delivery is not None
            and orjson.loads(entry.dead_letter.delivery.body).get("userId") == user
        ],
        timeout=30,
    )
    letter_id = letters[0].dead_letter.id
    message_id = letters[0].dead_letter.delivery.message_id
    refusing.default = 200  # the receiver is mended

    # The trace shows the refused attempt and the start of the receiver's answer, as text.
    login(page, f"/messages/{message_id}")
    refused = page.locator("tr.entry.kind-attempt", has_text="refusing")
    wait_for(lambda: page.reload() and refused.count() == 1, timeout=30)  # once the store has it

    expect(refused.locator("td.status")).to_have_text("400")
    expect(refused.locator("pre.response")).to_have_text("answer from refusing: <b>400</b>")
    expect(page.locator("tr.entry.kind-dead_lettered")).to_contain_text("client_error")

    page.goto("/dead-letters?destination=refusing")
    page.check(f"input[name=id][value='{letter_id}']")
    screenshot(page, "dead-letters")
    page.click("#replay-selected")
    expect(page.locator("#pending")).to_have_text("1")
    screenshot(page, "dead-letters-dry-run")
    page.click("#confirm-replay")
    expect(page.locator("#job-state")).to_contain_text("Done: 1 replayed", timeout=30_000)
    wait_for(lambda: _seen_users(refusing, user) == 2)  # refused once, then replayed
    refusing.default = 400


# ---- test events --------------------------------------------------------------------------------


def test_send_a_test_event(page: Any, pipeline: Pipeline):
    hooks = pipeline.receivers["hooks"]
    login(page, "/test-event?destination=hooks&type=identify")
    call = orjson.loads(page.locator("#call").input_value())
    assert call["traits"] == {"email": "test@example.com"}
    call["userId"] = user = f"x-{uuid.uuid4().hex[:6]}"
    page.fill("#call", orjson.dumps(call).decode())
    page.click("#send")
    expect(page.locator(".probe .status")).to_have_text("200")
    received = wait_for(lambda: [r for r in hooks.requests if user.encode() in r.body])
    body = received[0].body
    assert page.locator("#signature").inner_text() == sign(body, SECRET)
    assert received[0].headers["X-Signature"] == sign(body, SECRET)
    assert received[0].headers["Authorization"] == "Bearer t"
    # The receiver's answer is shown as text.
    expect(page.locator(".probe pre.response")).to_have_text("answer from hooks: <b>200</b>")
    screenshot(page, "test-event")
    page.fill("#call", "{not json")
    page.click("#send")
    expect(page.get_by_role("alert")).to_contain_text("call: not JSON")


def test_overview_lists_problems_first(page: Any, pipeline: Pipeline):
    user = f"o-{uuid.uuid4().hex[:6]}"
    pipeline.send(track(user, "Refused"), "wk_jobs")
    login(page)

    def refusing_first() -> bool:
        page.reload()
        first = page.locator("article.tile").first
        return first.get_attribute("data-destination") == "refusing"

    wait_for(refusing_first, timeout=30)
    expect(page.locator("#tile-refusing dd.failed")).not_to_have_text("0")
    expect(page.locator("#tile-hooks .chart rect.ok")).to_have_count(24)
    screenshot(page, "overview")


# ---- the command ----------------------------------------------------------------------------------


def test_the_command_refuses_a_public_address_without_a_password(pipeline: Pipeline):
    assert "PIPELINE_CONSOLE_PASSWORD" not in settings_env(pipeline.settings)
    done = run_cli(pipeline.settings, "console", "--host", "0.0.0.0", "--port", "0", timeout=30)
    assert done.returncode == 2
    assert "refusing to listen on 0.0.0.0 without a password" in done.stderr
    assert "PIPELINE_CONSOLE_PASSWORD" in done.stderr


def test_the_command_serves_with_the_password_from_the_environment(pipeline: Pipeline):
    port = free_port()
    env = {**settings_env(pipeline.settings), "PIPELINE_CONSOLE_PASSWORD": "from-env"}
    process = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "console", "--port", str(port)],
        env=env,
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until_ready(f"http://127.0.0.1:{port}")
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        with browser.open(f"http://127.0.0.1:{port}/login", timeout=10) as form:
            token = re.search(r'name="login_token" value="([^"]+)"', form.read().decode())
        assert token is not None
        login = urlencode({"login_token": token.group(1), "next": "/", "password": "from-env"})
        with browser.open(f"http://127.0.0.1:{port}/login", login.encode(), 10) as answer:
            assert b"Destinations at a glance" in answer.read()  # the overview, logged in
    finally:
        process.terminate()
        process.wait(10)
        assert process.stderr is not None
        stderr = process.stderr.read()
        process.stderr.close()
    assert f"console on http://127.0.0.1:{port}" in stderr
    assert "from-env" not in stderr  # a password from the environment is never printed
