"""A delivery process's threads kept on one CPU (``PIPELINE_CPU_AFFINITY``).

A worker process runs Python on one thread at a time, and its other threads (the HTTP client's
runtime, librdkafka's, the consumer's) hand it their results: every webhook answer wakes the
event loop's thread and takes the interpreter lock from another thread. Spread over the cores,
each of those hand-offs wakes a thread on another CPU (an inter-processor interrupt, an exit to
the hypervisor in a virtual machine); on one CPU it is a switch on the same core. Measured on the
bench's two-core virtual machine (docs/decisions.md): 1.1-1.24x less CPU a call.

The setting:

- ``off`` (the default): the operating system places the threads;
- ``auto``: one CPU of those the process may use (its affinity, which a container's cpuset
  sets): under ``pipeline worker --processes N``, worker ``k`` takes the ``k``-th; a process on
  its own takes the one least busy as it starts;
- a list of CPUs (``0,2-3``): worker ``k`` takes the ``k``-th of them, a process on its own the
  first.

It is off by default because it takes the placement from the scheduler: two deployments on one
host, each pinning, could share a CPU while another idles. It is meant for hosts and containers
given to the pipeline.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from pipeline.core.settings import parse_cpus

__all__ = ["chosen_cpu", "pin"]

log = logging.getLogger("pipeline.cpu")

#: How long the CPUs' use is watched to find the least busy (``auto``, a process on its own).
SAMPLE_SECONDS = 0.2


def chosen_cpu(
    setting: str, allowed: set[int], index: int | None, busy: dict[int, float] | None = None
) -> int | None:
    """The CPU a process keeps its threads on (``None``: none, the setting is ``off`` or names
    no CPU the process may use). ``index``: its number under the supervisor; ``busy``: each
    CPU's recent use (``auto`` for a process on its own takes the least busy)."""
    if setting == "off" or not allowed:
        return None
    if setting == "auto":
        cpus = sorted(allowed)
        if index is not None:
            return cpus[index % len(cpus)]
        if busy:
            return min(cpus, key=lambda cpu: (busy.get(cpu, 0.0), cpu))
        return cpus[0]
    cpus = [cpu for cpu in parse_cpus(setting) if cpu in allowed]
    if not cpus:
        return None
    return cpus[(index or 0) % len(cpus)]


def pin(setting: str, index: int | None = None) -> int | None:
    """Keep every thread of this process, and the threads it starts later, on the CPU
    ``chosen_cpu`` picks; the CPU, or ``None`` (not on this system, or nothing to do)."""
    if setting == "off" or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = os.sched_getaffinity(0)
    busy = _busy(allowed) if setting == "auto" and index is None and len(allowed) > 1 else None
    cpu = chosen_cpu(setting, allowed, index, busy)
    if cpu is None:
        log.warning(
            "PIPELINE_CPU_AFFINITY=%s names no CPU this process may use (%s); not pinned",
            setting,
            ",".join(map(str, sorted(allowed))),
        )
        return None
    for task in Path("/proc/self/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), {cpu})
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile
            continue
    log.info("threads kept on CPU %d (PIPELINE_CPU_AFFINITY=%s)", cpu, setting)
    return cpu


def _busy(cpus: set[int]) -> dict[int, float]:
    """Each CPU's share of time busy over ``SAMPLE_SECONDS`` (/proc/stat)."""
    first = _times()
    time.sleep(SAMPLE_SECONDS)
    second = _times()
    busy = {}
    for cpu in cpus:
        if cpu in first and cpu in second:
            (idle0, total0), (idle1, total1) = first[cpu], second[cpu]
            total = total1 - total0
            busy[cpu] = 1.0 - (idle1 - idle0) / total if total > 0 else 0.0
    return busy


def _times() -> dict[int, tuple[int, int]]:
    """Per CPU: (idle ticks, all ticks) so far."""
    out: dict[int, tuple[int, int]] = {}
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            ticks = [int(field) for field in fields]
            out[int(name[3:])] = (ticks[3] + ticks[4], sum(ticks))  # idle + iowait
    return out
