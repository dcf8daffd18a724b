"""``PIPELINE_CPU_AFFINITY``: every thread of a delivery process (the event loop's, the HTTP
client's runtime, librdkafka's, the consumer's) on one CPU, and under ``--processes`` each worker
on its own. Real processes on a real broker, read back from /proc."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from pipeline.core.settings import Settings
from tests.integration.test_pace import calls
from tests.integration.test_worker_processes import pids
from tests.support import (
    Receiver,
    Stderr,
    apply,
    send_calls,
    simple_config,
    unique_delivered,
    wait_for,
)

ALLOWED = sorted(os.sched_getaffinity(0))
#: This process's CPUs as /proc writes them (``0-1``): what an unpinned thread may use.
EVERY = next(
    line.split(":\t", 1)[1].strip()
    for line in Path("/proc/self/status").read_text().splitlines()
    if line.startswith("Cpus_allowed_list:")
)


def thread_cpus(pid: int) -> dict[str, set[str]]:
    """Each thread's name and the CPUs it may run on (``Cpus_allowed_list``), grouped by CPUs."""
    found: dict[str, set[str]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except FileNotFoundError:  # ended meanwhile
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        found.setdefault(fields["Cpus_allowed_list"].strip(), set()).add(fields["Name"].strip())
    return found


def delivered_by(
    settings: Settings,
    receiver: Receiver,
    process_factory: Callable[..., subprocess.Popen[bytes]],
    *args: str,
    affinity: str,
    client: str = "httptools",
) -> subprocess.Popen[bytes]:
    """A process started with ``args`` that has delivered calls (so all its threads run)."""
    apply(settings, simple_config(receiver.url))
    env = {"PIPELINE_CPU_AFFINITY": affinity, "PIPELINE_HTTP_CLIENT": client}
    process = process_factory(settings, *args, env=env)
    send_calls(settings, calls(10, "a"), "wk")
    wait_for(lambda: unique_delivered(receiver) == 10, timeout=90)
    return process


def test_a_worker_keeps_every_thread_on_the_cpu_it_is_given(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    process_factory: Callable[..., subprocess.Popen[bytes]],
) -> None:
    cpu = str(ALLOWED[-1])
    worker = delivered_by(
        settings,
        receiver_factory(),
        process_factory,
        "worker",
        "--no-log-store",
        affinity=f"{cpu},{ALLOWED[0]}",  # alone, the first of the list
        client="reqwest",  # its runtime's threads start later
    )
    threads = thread_cpus(worker.pid)
    assert list(threads) == [cpu], threads
    names = threads[cpu]
    assert any(name.startswith("rdk:") for name in names), names  # librdkafka's, started later
    assert any(name.startswith("pyreqwest") for name in names), names  # the HTTP runtime's


def test_under_the_supervisor_each_worker_takes_its_own_cpu(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    process_factory: Callable[..., subprocess.Popen[bytes]],
) -> None:
    supervisor = delivered_by(
        settings,
        receiver_factory(),
        process_factory,
        "worker",
        "--processes",
        "2",
        "--no-log-store",
        affinity="auto",
    )
    log = Stderr(supervisor)
    wait_for(lambda: pids(log, "worker 1 of 2") and pids(log, "worker 2 of 2"), timeout=30)
    for n in (0, 1):
        [pid] = pids(log, f"worker {n + 1} of 2")
        expected = str(ALLOWED[n % len(ALLOWED)])
        wait_for(lambda pid=pid, cpu=expected: len(thread_cpus(pid).get(cpu, ())) > 5, timeout=30)
        assert list(thread_cpus(pid)) == [expected]
    assert list(thread_cpus(supervisor.pid)) == [EVERY]  # the supervisor is not pinned


def test_off_leaves_the_threads_to_the_system(
    settings: Settings,
    receiver_factory: Callable[..., Receiver],
    process_factory: Callable[..., subprocess.Popen[bytes]],
) -> None:
    worker = delivered_by(
        settings, receiver_factory(), process_factory, "worker", "--no-log-store", affinity="off"
    )
    assert list(thread_cpus(worker.pid)) == [EVERY]
