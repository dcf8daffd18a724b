"""The embedded broker with no settings at all: ``pipeline broker``, then ``pipeline ingest`` and
``pipeline worker`` started by hand, deliver every call.

Its transactions stall read_committed readers (docs/decisions.md), so the roles recognise it
by its cluster id and run without router transactions and with a short session timeout, saying
so in one line. Nothing here sets ``PIPELINE_TRANSACTIONS`` or ``PIPELINE_SESSION_TIMEOUT``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from pipeline.core.settings import Settings
from pipeline.runtime.net import free_port, port_open
from tests.support import ROOT, WRITE_KEY, apply, ingest_config, wait_for, wait_until_ready


@pytest.fixture
def broker_command() -> Iterator[str]:
    """``pipeline broker`` in a process of its own; its bootstrap address."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "broker", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: port_open("127.0.0.1", port), timeout=20)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _batch(tag: str, start: int, count: int) -> dict[str, object]:
    return {
        "batch": [
            {
                "type": "track",
                "userId": f"user-{i % 7}",
                "event": "Burst",
                "messageId": f"{tag}-{i}",
            }
            for i in range(start, start + count)
        ]
    }


@pytest.mark.timeout(240)
def test_roles_started_by_hand_with_no_settings_deliver_every_call(
    broker_command, receiver_factory, process_factory, tmp_path
):
    # Only where the broker is, that loopback receivers are allowed, and a log store file and
    # state directory of the test's own: nothing about transactions or timeouts.
    settings = Settings(
        bootstrap_servers=broker_command,
        allowed_networks=("127.0.0.0/8",),
        log_store_url=f"sqlite:///{tmp_path / 'log.sqlite3'}",
        state_dir=str(tmp_path / "state"),
    )
    receiver = receiver_factory()
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "topics", "create"],
        env={"PATH": "/usr/bin:/bin", "PIPELINE_BOOTSTRAP_SERVERS": broker_command},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    apply(settings, ingest_config(receiver.url))
    port = free_port()
    process_factory(settings, "ingest", "--port", str(port))
    worker = process_factory(settings, "worker")
    url = f"http://127.0.0.1:{port}"
    wait_until_ready(url)

    def post(body: dict[str, object]) -> None:
        answer = httpx.post(url + "/v1/batch", json=body, auth=(WRITE_KEY, ""), timeout=30)
        assert answer.status_code == 200, answer.text

    def delivered() -> set[str]:
        return {b["messageId"] for b in receiver.delivered()}

    # A burst from an SDK (three batches at once), then silence.
    for start in (0, 50, 100):
        post(_batch("burst", start, 50))
    burst = {f"burst-{i}" for i in range(150)}
    wait_for(lambda: burst <= delivered(), timeout=90)

    # A steady stream, one call every 50 ms.
    for i in range(60):
        post(_batch("steady", i, 1))
        time.sleep(0.05)
    steady = {f"steady-{i}" for i in range(60)}
    wait_for(lambda: steady <= delivered(), timeout=90)

    # A SIGKILL of the worker mid-stream; a new worker finishes.
    for i in range(40):
        post(_batch("killed", i, 1))
        if i == 10:
            worker.send_signal(signal.SIGKILL)
            worker.wait(10)
            worker = process_factory(settings, "worker")
        time.sleep(0.05)
    killed = {f"killed-{i}" for i in range(40)}
    wait_for(lambda: killed <= delivered(), timeout=120)

    worker.send_signal(signal.SIGTERM)
    assert worker.wait(60) == 0
    assert worker.stderr is not None
    said = worker.stderr.read().decode()
    # One line a process: the worker's, and its log-store's (which writes to the same stderr).
    line = "embedded broker (cluster id pipeline-embedded): router transactions off"
    assert said.count(line) == 2, said
