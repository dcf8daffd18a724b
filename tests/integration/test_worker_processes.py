"""``pipeline worker --processes 2``: two worker processes share every group under one
supervisor, with the log-store beside them; a child that is killed comes back; SIGTERM drains and
ends them all. A real broker, real HTTP, real processes."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
from collections.abc import Callable

from pipeline.core.settings import Settings
from tests.integration.test_isolation import held
from tests.integration.test_pace import calls
from tests.support import (
    Receiver,
    Stderr,
    apply,
    send_calls,
    simple_config,
    try_scrape,
    unique_delivered,
    wait_for,
)


def consecutive_free_ports(count: int) -> int:
    """The first of ``count`` free ports in a row on 127.0.0.1."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + count >= 65536:
            continue
        sockets = []
        try:
            for port in range(first, first + count):
                taken = socket.socket()
                sockets.append(taken)
                taken.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for taken in sockets:
                taken.close()
    raise RuntimeError(f"no {count} free ports in a row")


def pids(log: Stderr, name: str) -> list[int]:
    """The pids ``name`` was started with, in order (``worker 1 of 2 started (pid 123)``)."""
    pattern = re.compile(rf"{re.escape(name)} started(?: again)? \(pid (\d+)\)")
    return [int(m.group(1)) for line in list(log.lines) if (m := pattern.search(line))]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie has ended: only its parent has not collected it yet
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_two_processes_share_the_groups_a_killed_one_comes_back_and_sigterm_ends_all(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    process_factory: Callable[..., subprocess.Popen[bytes]],
) -> None:
    receiver = receiver_factory()
    apply(settings, simple_config(receiver.url))
    port = consecutive_free_ports(3)
    supervisor = process_factory(
        settings, "worker", "--processes", "2", "--metrics-port", str(port)
    )
    log = Stderr(supervisor)
    ports = [port, port + 1]

    def shared() -> bool:
        """Both workers hold deliver partitions, and between them all of them."""
        shares = [held(p).get("deliver", 0.0) for p in ports]
        return min(shares) >= 1 and sum(shares) == settings.partitions

    # Two members joining the embedded broker's groups one after the other take a few of its
    # rebalances (each rejoin waits 3 s); under a loaded suite that once took over 60 s (it
    # takes about 15 s alone). What is tested is the sharing, not how fast the group forms.
    wait_for(shared, timeout=120, interval=0.2)
    wait_for(lambda: try_scrape(port + 2) is not None, timeout=30)  # the log-store's /metrics
    send_calls(settings, calls(40, "a"), "wk")
    wait_for(lambda: unique_delivered(receiver) == 40, timeout=60)

    [first] = pids(log, "worker 1 of 2")
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: len(pids(log, "worker 1 of 2")) == 2, timeout=30)
    again = pids(log, "worker 1 of 2")[1]
    assert again != first and alive(again)
    assert any("worker 1 of 2 (pid" in line and "status -9" in line for line in log.lines)
    wait_for(shared, timeout=60, interval=0.2)
    send_calls(settings, calls(40, "b"), "wk")
    wait_for(lambda: unique_delivered(receiver) == 80, timeout=60)

    children = [again, *pids(log, "worker 2 of 2"), *pids(log, "log-store")]
    assert len(children) == 3 and all(alive(pid) for pid in children)
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(45) == 0
    assert not any(alive(pid) for pid in children)
    print("\nsupervisor log:\n" + "\n".join(line for line in log.lines if "supervisor" in line))
