"""Which CPU a delivery process keeps its threads on (``PIPELINE_CPU_AFFINITY``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pipeline.core.settings import Settings, SettingsError, parse_cpus
from pipeline.runtime.cpu_affinity import chosen_cpu


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0", [0]), ("0,2-3", [0, 2, 3]), (" 3 , 1-2 ", [3, 1, 2]), ("1-2,2", [1, 2])],
)
def test_a_list_of_cpus_is_read_in_its_order(text: str, cpus: list[int]) -> None:
    assert parse_cpus(text) == cpus


@pytest.mark.parametrize(
    ("text", "words"),
    [("a", "'a' is not a CPU number"), ("3-1", "ends before it starts"), ("1,", "'' is not")],
)
def test_a_bad_setting_names_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({"PIPELINE_CPU_AFFINITY": text})
    assert "PIPELINE_CPU_AFFINITY" in str(caught.value) and words in str(caught.value)


def test_the_setting_is_off_by_default_and_read_without_case() -> None:
    assert Settings.from_env({}).cpu_affinity == "off"
    assert Settings.from_env({"PIPELINE_CPU_AFFINITY": " AUTO "}).cpu_affinity == "auto"


@pytest.mark.parametrize(
    ("setting", "allowed", "index", "busy", "cpu"),
    [
        ("off", {0, 1}, 1, None, None),
        ("auto", {2, 5, 7}, 0, None, 2),
        ("auto", {2, 5, 7}, 1, None, 5),
        ("auto", {2, 5, 7}, 4, None, 5),  # more workers than CPUs: round the CPUs again
        ("auto", {2, 5, 7}, None, {2: 0.9, 5: 0.1, 7: 0.4}, 5),  # alone: the least busy
        ("auto", {2, 5, 7}, None, None, 2),
        ("3,1", {0, 1, 2, 3}, None, None, 3),  # alone: the first of the list
        ("3,1", {0, 1, 2, 3}, 1, None, 1),
        ("3,1", {0, 1}, 0, None, 1),  # only the CPUs the process may use
        ("4-5", {0, 1}, 0, None, None),
    ],
)
def test_the_cpu_chosen(
    setting: str, allowed: set[int], index: int | None, busy: dict[int, float] | None, cpu: int
) -> None:
    assert chosen_cpu(setting, allowed, index, busy) == cpu


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_pin_keeps_the_threads_there_and_those_started_later() -> None:
    """In a process of its own (pinning this one would pin the test run)."""
    cpu = max(os.sched_getaffinity(0))
    code = f"""
import json, os, threading, time
from pipeline.runtime.cpu_affinity import pin
before = threading.Thread(target=time.sleep, args=(1,), daemon=True)
before.start()
assert pin("{cpu}") == {cpu}
seen = []
after = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
after.start(); after.join()
print(json.dumps([sorted(os.sched_getaffinity(before.native_id)), sorted(seen[0])]))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    assert json.loads(out) == [[cpu], [cpu]]
