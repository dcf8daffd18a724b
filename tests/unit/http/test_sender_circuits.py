"""``WebhookSender`` and the endpoint health it keeps: a circuit per endpoint (webhook URL), and one
per host for failures of the host itself; ``refusals`` decides an attempt without a request only
when every webhook's circuit refuses, and without taking the half-open probe; silence and
unproven endpoints. The requests go to real HTTP
servers on 127.0.0.1 (aiohttp), so the breakers see real answers and real refused connections."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from pipeline.core.config import Destination
from pipeline.core.outcomes import Failure, UrlResult
from pipeline.core.settings import Settings
from pipeline.http.sender import WebhookSender
from pipeline.runtime.net import free_port
from tests.unit.http._receiving import sender_and_server

SETTINGS = Settings(allowed_networks=("127.0.0.0/8",), circuit_failures=1, circuit_cool_down=60.0)
A, B = "http://127.0.0.1:9001/hook", "http://127.0.0.1:9002/hook"


def destination(*urls: str) -> Destination:
    return Destination(id="d", sources=["web"], webhooks=[{"url": url} for url in urls])


def open_circuit(sender: WebhookSender, url: str) -> None:
    sender.health.endpoint(url).breaker.record(ok=False)  # one failure opens it (failures=1)


def refused(sender: WebhookSender, destination: Destination) -> list[UrlResult] | None:
    return sender.health.refusals(destination)


def silent(sender: WebhookSender, destination: Destination) -> bool:
    return sender.health.snapshot(destination).silence_ends_in is not None


def unproven(sender: WebhookSender, destination: Destination) -> bool:
    return sender.health.snapshot(destination).unproven


def test_closed_circuits_need_a_request() -> None:
    sender = WebhookSender(SETTINGS)
    assert refused(sender, destination(A)) is None


def test_every_circuit_open_gives_circuit_open_results() -> None:
    sender = WebhookSender(SETTINGS)
    open_circuit(sender, A)
    open_circuit(sender, B)
    results = refused(sender, destination(A, B))
    assert results is not None
    assert [(r.url, r.failure) for r in results] == [
        (A, Failure.CIRCUIT_OPEN),
        (B, Failure.CIRCUIT_OPEN),
    ]
    assert results[0].detail == "not tried: it failed repeatedly; circuit open"


def test_one_open_circuit_among_several_still_needs_the_attempt() -> None:
    """Seed rule: any webhook's 2xx delivers the call, so the closed one must be tried."""
    sender = WebhookSender(SETTINGS)
    open_circuit(sender, A)
    assert refused(sender, destination(A, B)) is None


def test_an_endpoints_circuit_leaves_its_neighbours_on_the_host_alone() -> None:
    sender = WebhookSender(SETTINGS)
    failing, healthy = "http://127.0.0.1:9001/a", "http://127.0.0.1:9001/b"
    open_circuit(sender, failing)
    assert refused(sender, destination(failing)) is not None
    assert refused(sender, destination(healthy)) is None


def test_an_open_host_circuit_refuses_every_endpoint_on_the_host() -> None:
    sender = WebhookSender(SETTINGS)
    host = sender.health.endpoint(A).host
    assert host is not None
    host.breaker.record(ok=False)
    other_path = "http://127.0.0.1:9001/other"
    results = refused(sender, destination(other_path))
    assert results is not None
    assert results[0].detail == (
        "not tried: http://127.0.0.1:9001 could not be reached repeatedly; circuit open"
    )
    assert refused(sender, destination(B)) is None  # another port: another host


def test_asking_does_not_take_the_half_open_probe() -> None:
    now = [0.0]
    sender = WebhookSender(SETTINGS)
    target = sender.health.endpoint(A)
    target.breaker._clock = lambda: now[0]
    target.breaker.record(ok=False)
    now[0] = 61.0  # cool-down over: the next allow() is the probe
    assert refused(sender, destination(A)) is None
    assert refused(sender, destination(A)) is None
    assert target.breaker.allow()  # the probe is still there for the real attempt


# ---- real requests ----------------------------------------------------------------------------


def with_receiver(
    test: Callable[[WebhookSender, str], Awaitable[None]], settings: Settings = SETTINGS
) -> None:
    """Run ``test`` with a started sender and a server on 127.0.0.1 (its base URL) where
    ``/fail`` answers 500 and any other path 200."""

    async def handle(request: web.Request) -> web.Response:
        if request.path == "/hang":
            await asyncio.sleep(2)  # past the test's 1 s timeout
        return web.Response(status=500 if request.path == "/fail" else 200)

    async def go() -> None:
        async with sender_and_server(handle, settings) as (sender, port):
            await test(sender, f"http://127.0.0.1:{port}")

    asyncio.run(go())


def test_a_500_opens_the_endpoints_circuit_not_the_hosts() -> None:
    async def test(sender: WebhookSender, receiver: str) -> None:
        failing, healthy = destination(f"{receiver}/fail"), destination(f"{receiver}/ok")
        first = await sender.attempt(failing, b"{}", "m1")
        assert first[0].status == 500
        again = await sender.attempt(failing, b"{}", "m2")
        assert again[0].failure is Failure.CIRCUIT_OPEN  # no request made
        for n in range(5):
            result = await sender.attempt(healthy, b"{}", f"h{n}")
            assert result[0].status == 200
        assert refused(sender, failing) is not None
        assert refused(sender, healthy) is None

    with_receiver(test)


def test_a_refused_connection_opens_the_hosts_circuit() -> None:
    async def test(sender: WebhookSender, _receiver: str) -> None:
        port = free_port()  # nothing listens there
        first = await sender.attempt(destination(f"http://127.0.0.1:{port}/a"), b"{}", "m1")
        assert first[0].failure is Failure.CONNECTION_ERROR
        other = destination(f"http://127.0.0.1:{port}/b")  # never tried itself
        refusals = refused(sender, other)
        assert refusals is not None and "could not be reached" in refusals[0].detail
        second = await sender.attempt(other, b"{}", "m2")
        assert second[0].failure is Failure.CIRCUIT_OPEN

    with_receiver(test)


def test_any_answer_closes_the_hosts_circuit() -> None:
    async def test(sender: WebhookSender, receiver: str) -> None:
        now = [0.0]
        target = sender.health.endpoint(f"{receiver}/fail")
        host = target.host
        assert host is not None
        host.breaker._clock = lambda: now[0]
        host.breaker.record(ok=False)
        assert refused(sender, destination(f"{receiver}/fail")) is not None
        now[0] = 61.0  # the host's probe: a 500 is an answer, so the host is up
        result = await sender.attempt(destination(f"{receiver}/fail"), b"{}", "m1")
        assert result[0].status == 500
        assert not host.breaker.refuses()
        assert target.breaker.refuses()  # the endpoint's own circuit opened on the 500

    with_receiver(test)


def test_the_final_attempt_goes_through_open_circuits() -> None:
    async def test(sender: WebhookSender, _receiver: str) -> None:
        url = f"http://127.0.0.1:{free_port()}/a"
        open_circuit(sender, url)
        refused = await sender.attempt(destination(url), b"{}", "m1")
        assert refused[0].failure is Failure.CIRCUIT_OPEN
        final = await sender.attempt(destination(url), b"{}", "m1", final=True)
        assert final[0].failure is Failure.CONNECTION_ERROR  # a request was made

    with_receiver(test)


def test_a_pause_heard_while_a_request_waits_for_its_turn_stops_it() -> None:
    """Another process was told Retry-After while this request waited for its rate-limit turn:
    it is not sent (the deliver role parks it), unless it is the record's final attempt."""

    async def test(sender: WebhookSender, receiver: str) -> None:
        limited = Destination(
            id="d", sources=["web"], webhooks=[{"url": f"{receiver}/ok"}], rate_limit=5.0
        )
        while sender.health.reserve(limited) == 0:  # past its burst: turns 0.2 s apart
            pass
        waiting = asyncio.create_task(sender.attempt(limited, b"{}", "m1", turn=None))
        final = asyncio.create_task(sender.attempt(limited, b"{}", "m2", final=True))
        await asyncio.sleep(0.05)
        sender.health.pace.answered("d", 429, 30.0)  # as if heard from the pace topic
        [result] = await waiting
        assert result.failure is Failure.CIRCUIT_OPEN and result.status is None
        assert result.detail == "not tried: its receiver asked for a pause (Retry-After)"
        assert [r.status for r in await final] == [200]

    with_receiver(test)


def test_an_endpoint_with_requests_out_and_no_answer_for_a_while_is_silent() -> None:
    async def test(sender: WebhookSender, receiver: str) -> None:
        hanging, healthy = destination(f"{receiver}/hang"), destination(f"{receiver}/ok")
        assert not silent(sender, hanging)  # never tried
        requests = [asyncio.create_task(sender.attempt(hanging, b"{}", f"m{n}")) for n in range(3)]
        await asyncio.sleep(0.02)
        assert not silent(sender, hanging)  # out for less than QUIET_MIN (0.25 s)
        # Silent once they have been out QUIET_MIN of the loop's free time, and until they time
        # out at 1 s: polled, as a busy machine lends the loop less of the wall clock.
        loop = asyncio.get_running_loop()
        started = loop.time()
        while not silent(sender, hanging) and loop.time() - started < 0.9:
            await asyncio.sleep(0.01)
        assert silent(sender, hanging)
        assert (await sender.attempt(healthy, b"{}", "h1"))[0].status == 200
        assert not silent(sender, healthy)  # its neighbour on the host answers
        results = await asyncio.gather(*requests)
        assert all(r[0].failure is Failure.TIMEOUT for r in results)
        assert not silent(sender, hanging)  # nothing out any more

    with_receiver(test, SETTINGS.replace(delivery_timeout=1.0, circuit_failures=10))


def test_a_destination_is_unproven_while_its_first_requests_go_unanswered() -> None:
    async def test(sender: WebhookSender, receiver: str) -> None:
        hanging, failing = f"{receiver}/hang", f"{receiver}/fail"
        assert not unproven(sender, destination(hanging))  # never tried
        out = asyncio.create_task(sender.attempt(destination(hanging), b"{}", "m1"))
        while not sender.health.endpoint(hanging).in_flight:
            await asyncio.sleep(0)
        assert not unproven(sender, destination(hanging))  # out for less than UNPROVEN_AFTER
        await asyncio.sleep(0.1)
        assert unproven(sender, destination(hanging))
        assert (await sender.attempt(destination(failing), b"{}", "m2"))[0].status == 500
        assert not unproven(sender, destination(hanging, failing))  # a 500 is an answer
        assert unproven(sender, destination(hanging))
        assert (await out)[0].failure is Failure.TIMEOUT
        assert not unproven(sender, destination(hanging))  # nothing out any more

    with_receiver(test, SETTINGS.replace(delivery_timeout=1.0, circuit_failures=10))


def test_a_blocked_event_loop_makes_no_endpoint_silent() -> None:
    """Answers are read only when the loop runs: a step that blocks it longer than QUIET_MIN
    (routing a large batch) is not the endpoint's silence. A hanging one is still found."""

    async def test(sender: WebhookSender, receiver: str) -> None:
        healthy, hanging = destination(f"{receiver}/ok"), destination(f"{receiver}/hang")
        out = [asyncio.create_task(sender.attempt(d, b"{}", "m")) for d in (healthy, hanging)]
        while not all(
            sender.health.endpoint(d.webhooks[0].url).in_flight for d in (healthy, hanging)
        ):
            await asyncio.sleep(0)
        time.sleep(0.6)  # the loop is blocked: no answer can be read meanwhile
        assert not silent(sender, healthy) and not silent(sender, hanging)
        assert (await out[0])[0].status == 200
        # The loop runs, the hanging request stays out (it answers 2 s after it started): it
        # is found silent once QUIET_MIN of free loop time has passed. Polled, not slept: on a
        # loaded machine the loop's beats run late and count as blocked time too.
        deadline = time.monotonic() + 1.2
        while not silent(sender, hanging) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert silent(sender, hanging) and not silent(sender, healthy)
        assert (await out[1])[0].status == 200  # after its 2 s

    with_receiver(test, SETTINGS.replace(delivery_timeout=3.0, circuit_failures=10))


def test_a_request_waiting_behind_a_silent_endpoint_gives_up_its_wait() -> None:
    async def test(sender: WebhookSender, receiver: str) -> None:
        hanging = destination(f"{receiver}/hang")
        out = [asyncio.create_task(sender.attempt(hanging, b"{}", f"m{n}")) for n in range(2)]
        await asyncio.sleep(0.1)  # both of the host's slots are taken by hanging requests
        started = asyncio.get_running_loop().time()
        [waited] = await sender.attempt(hanging, b"{}", "m3")
        took = asyncio.get_running_loop().time() - started
        assert waited.failure is Failure.CIRCUIT_OPEN and "answered none" in waited.detail
        assert took < 0.95  # not the hanging requests' 1 s timeout: it stopped waiting
        results = await asyncio.gather(*out)
        assert all(r[0].failure is Failure.TIMEOUT for r in results)

    settings = SETTINGS.replace(
        delivery_timeout=1.0, circuit_failures=10, max_connections_per_host=2
    )
    with_receiver(test, settings)
