"""The operator commands: broker, topics create, dev."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

from pipeline.runtime.net import free_port, port_open
from tests.support import ROOT, run_cli, wait_for


def test_topics_create_is_idempotent(settings):
    prefix = settings.topic_prefix
    fresh = settings.replace(topic_prefix=prefix + "again.")
    first = run_cli(fresh, "topics", "create")
    assert first.returncode == 0, first.stderr
    lines = dict(line.split(None, 1) for line in first.stdout.splitlines())
    expected = {
        f"{prefix}again.{name}"
        for name in (
            "calls",
            "config",
            "deliveries.webhooks",
            "deliveries.webhooks.retry.0",
            "deliveries.webhooks.retry.1",
            "deliveries.webhooks.dlq",
        )
    }
    assert expected <= set(lines)
    assert all(lines[name] == "created" for name in expected)
    second = run_cli(fresh, "topics", "create")
    assert second.returncode == 0
    assert all(line.endswith("exists") for line in second.stdout.splitlines())


def test_broker_command_serves_kafka_and_stops_on_sigterm(settings):
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "broker", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: port_open("127.0.0.1", port), timeout=20)
        own = settings.replace(bootstrap_servers=f"127.0.0.1:{port}")
        created = run_cli(own, "topics", "create")
        assert created.returncode == 0, created.stderr
        assert "created" in created.stdout
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
        assert not port_open("127.0.0.1", port)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stderr is not None
        process.stderr.close()


def test_dev_shows_every_call_type_arriving_and_stops_on_ctrl_c_quietly():
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    broker_port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline",
            "dev",
            "--broker-port",
            str(broker_port),
            "--receiver-port",
            str(free_port()),
            "--ingest-port",
            str(free_port()),
            "--console-port",
            str(free_port()),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A process group of its own, as a terminal gives a foreground job: Ctrl-C there is a
        # SIGINT to every process of the group.
        start_new_session=True,
    )
    lines: list[str] = []
    errors: list[str] = []
    readers = [
        threading.Thread(
            target=lambda: lines.extend(iter(process.stdout.readline, "")), daemon=True
        ),
        threading.Thread(
            target=lambda: errors.extend(iter(process.stderr.readline, "")), daemon=True
        ),
    ]
    for reader in readers:
        reader.start()
    try:
        started = time.monotonic()
        wait_for(lambda: any("all 9 arrived" in e for e in errors), timeout=60)
        print(
            f"\npipeline dev: every sample call arrived {time.monotonic() - started:.1f} s after start"
        )
        # The console runs too: its URL and made-up password are printed, its login page answers.
        console = next(e for e in errors if "web console on" in e)
        url = re.search(r"http://127\.0\.0\.1:\d+", console)
        assert url is not None and "password " in console
        with urllib.request.urlopen(f"{url.group(0)}/login", timeout=10) as page:
            assert page.status == 200 and b'name="password"' in page.read()
        interrupted_at = len(errors)
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    for reader in readers:
        reader.join(5)
    process.stdout.close()
    process.stderr.close()
    received = [line for line in lines if "✓ received" in line]
    kinds = {line.split()[2] for line in received}
    assert kinds == {"identify", "track", "page", "screen", "group", "alias", "delete"}
    assert all("[signature ok]" in line for line in received)
    assert any("user-2 Signed Up" in line for line in received), "the call sent over HTTP"
    assert any("▸ stopped." in e for e in errors)
    # The roles drain before the broker stops (it is not in the terminal's process group), so
    # nothing complains that it went away.
    after = errors[interrupted_at:]
    assert not [e for e in after if " ERROR " in e or " WARNING " in e], after
    assert not port_open("127.0.0.1", broker_port), "the broker outlived pipeline dev"
