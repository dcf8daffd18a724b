"""A call sent twice is delivered once: the router drops a resend of a call it routed within
``PIPELINE_DEDUPE_WINDOW`` (same source, same ``messageId``), through real HTTP and a real broker.
"""

from __future__ import annotations

import re
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline.core.settings import Settings
from pipeline.core.timestamps import format_timestamp, now_ms
from pipeline.kafka.clients import admin_config, topics_for
from pipeline.runtime.net import free_port
from tests.support import (
    WRITE_KEY,
    apply,
    delivery_log_entries,
    ingest_config,
    run_cli,
    send_calls,
    simple_config,
    wait_for,
)


def dropped_as_resends(settings: Settings) -> dict[str, str]:
    """messageId → the words of its resend's ``dropped`` entry, from the delivery log."""
    return {
        message_id: entry["error"]
        for message_id, entry in delivery_log_entries(settings, "dropped")
        if entry["reason"] == "duplicate"
    }


def batch(tag: str, count: int) -> dict[str, Any]:
    return {
        "batch": [
            {"type": "track", "userId": f"{tag}-u{n % 5}", "event": "E", "messageId": f"{tag}-{n}"}
            for n in range(count)
        ]
    }


def test_a_batch_resent_through_the_api_is_delivered_once(
    settings, receiver_factory, worker_factory, ingest_factory
):
    receiver = receiver_factory()
    apply(settings, ingest_config(receiver.url))
    worker_factory(settings)
    api = ingest_factory(settings)
    calls = batch("resend", 20)
    for _ in range(2):  # the SDK got no answer the first time, and sends the batch again
        answer = httpx.post(api.url + "/v1/batch", json=calls, auth=(WRITE_KEY, ""), timeout=10)
        assert answer.status_code == 200, answer.text
    ids = {call["messageId"] for call in calls["batch"]}
    wait_for(lambda: set(dropped_as_resends(settings)) >= ids, timeout=60)
    wait_for(lambda: receiver.count() >= 20, timeout=60)
    assert sorted(b["messageId"] for b in receiver.bodies()) == sorted(ids)
    words = dropped_as_resends(settings)["resend-0"]
    assert words.startswith("a resend of the call first received at 20")


def test_the_same_message_id_from_two_sources_is_delivered_for_each(
    settings, receiver_factory, worker_factory
):
    receiver = receiver_factory()
    config = simple_config(receiver.url)
    config["sources"].append({"id": "app", "write_keys": ["wk2"]})
    config["destinations"][0]["sources"] = ["web", "app"]
    apply(settings, config)
    worker_factory(settings)
    call = {"type": "track", "userId": "u1", "event": "E", "messageId": "shared-1"}
    send_calls(settings, [call], "wk")
    send_calls(settings, [call], "wk2")
    wait_for(lambda: receiver.count() >= 2, timeout=60)
    assert [b["messageId"] for b in receiver.bodies()] == ["shared-1", "shared-1"]


def test_a_resend_after_the_window_is_delivered_again(settings, receiver_factory, worker_factory):
    settings = settings.replace(dedupe_window=2.0)
    receiver = receiver_factory()
    apply(settings, simple_config(receiver.url))
    worker_factory(settings)
    call = {"type": "track", "userId": "u1", "event": "E", "messageId": "late-1"}
    sent_at = time.time()
    send_calls(settings, [call], "wk")
    send_calls(settings, [call], "wk")  # received within the window of the first: dropped
    wait_for(lambda: "late-1" in dropped_as_resends(settings), timeout=60)
    wait_for(lambda: receiver.count() == 1, timeout=60)
    wait_for(lambda: time.time() > sent_at + 3.0, timeout=10)  # the 2 s window has passed
    send_calls(settings, [call], "wk")
    wait_for(lambda: receiver.count() == 2, timeout=60)


def resent_to_a_second_worker(
    settings: Settings,
    receiver_factory: Callable[..., Any],
    process_factory: Callable[..., Any],
    tag: str,
    *,
    between: Callable[[], None] = lambda: None,
    env: dict[str, str] | None = None,
) -> str:
    """A worker routes 20 calls and stops; ``between()`` runs; a second worker (``env``) is sent
    every call again and drops each as a resend, delivering none. Returns the second's log."""
    receiver = receiver_factory()
    apply(settings, simple_config(receiver.url))
    calls = batch(tag, 20)["batch"]
    first = process_factory(settings, "worker", "--no-log-store")
    send_calls(settings, calls, "wk")
    wait_for(lambda: receiver.count() == 20, timeout=60)
    first.send_signal(signal.SIGTERM)
    assert first.wait(30) == 0
    between()
    port = str(free_port())
    second = process_factory(settings, "worker", "--no-log-store", "--metrics-port", port, env=env)
    send_calls(settings, calls, "wk")  # every one a resend
    wait_for(lambda: set(dropped_as_resends(settings)) >= {c["messageId"] for c in calls}, 60)
    assert receiver.count() == 20
    second.send_signal(signal.SIGTERM)
    assert second.wait(30) == 0
    assert second.stderr is not None
    return str(second.stderr.read().decode())


def test_resends_are_still_dropped_after_another_router_took_the_partitions_over(
    settings, receiver_factory, process_factory, tmp_path
):
    """The next worker starts on another machine's empty state directory and restores what the
    first routed from the changelog topic."""
    elsewhere = tmp_path / "another-machine"
    said = resent_to_a_second_worker(
        settings,
        receiver_factory,
        process_factory,
        "moved",
        env={"PIPELINE_STATE_DIR": str(elsewhere)},
    )
    assert re.search(r"restored \d+ changes in", said), said
    assert list((elsewhere / "dedupe").iterdir()), "the new worker keeps its own local stores"


def test_a_restart_on_the_same_machine_reads_only_what_is_new_in_the_changelog(
    settings, receiver_factory, process_factory
):
    """A store's checkpoint is the changelog offset Kafka acknowledged for what it applied: the
    next worker on the same state directory restores nothing, and still knows every call."""
    said = resent_to_a_second_worker(settings, receiver_factory, process_factory, "again")
    assert "changes in" not in said, said  # "state ...[p]: restored N changes in T s"


def test_a_local_store_that_cannot_be_opened_is_rebuilt_from_the_changelog(
    settings, receiver_factory, process_factory
):
    def corrupt() -> None:
        for store in (Path(settings.state_dir) / "dedupe").iterdir():  # every partition's
            shutil.rmtree(store)
            store.mkdir()
            (store / "CURRENT").write_text("not a manifest\n")

    said = resent_to_a_second_worker(
        settings, receiver_factory, process_factory, "corrupt", between=corrupt
    )
    assert "cannot be opened" in said and "restored from the changelog" in said, said


def test_a_missing_changelog_topic_is_a_clear_error_at_start(settings):
    changelog = topics_for(settings).changelog("dedupe")
    admin = AdminClient(admin_config(settings))
    admin.delete_topics([changelog])[changelog].result(10)
    wait_for(lambda: changelog not in admin.list_topics(timeout=5).topics, timeout=20)
    done = run_cli(settings, "router", timeout=60)
    assert done.returncode == 3, done.stderr
    assert f"the changelog topic {changelog} does not exist: run `pipeline topics create`" in (
        done.stderr
    )
    # ``topics create`` makes it again.
    made = run_cli(settings, "topics", "create")
    assert made.returncode == 0 and f"{changelog} " in made.stdout
    assert "created" in next(line for line in made.stdout.splitlines() if changelog in line)


def test_a_changelog_topic_that_is_not_compacted_is_a_clear_error_at_start(settings):
    wrong = settings.replace(topic_prefix=settings.topic_prefix + "w.")
    changelog = topics_for(wrong).changelog("dedupe")
    admin = AdminClient(admin_config(settings))
    admin.create_topics([NewTopic(changelog, 3, 1)])[changelog].result(10)
    assert run_cli(wrong, "topics", "create").returncode == 0  # it exists: left as it is
    done = run_cli(wrong, "router", timeout=60)
    assert done.returncode == 3
    assert "has cleanup.policy=delete; a changelog must be compacted" in done.stderr


def test_dedupe_can_be_turned_off(settings, receiver_factory, worker_factory):
    settings = settings.replace(dedupe_window="off")
    assert settings.dedupe_window is None
    receiver = receiver_factory()
    apply(settings, simple_config(receiver.url))
    worker_factory(settings)
    call = {"type": "track", "userId": "u1", "event": "E", "messageId": "twice-1"}
    send_calls(settings, [call, call], "wk")
    wait_for(lambda: receiver.count() == 2, timeout=60)


def test_a_replay_is_not_a_resend(settings, receiver_factory, worker_factory):
    """``pipeline replay`` hands its calls to the deliveries topic, past the router: a call the
    router already routed, whose resend it drops, is delivered again when replayed."""
    receiver = receiver_factory()
    apply(settings, simple_config(receiver.url))
    worker_factory(settings)
    since = now_ms() - 1000
    call = {"type": "track", "userId": "u1", "event": "E", "messageId": "replayed-1"}
    send_calls(settings, [call], "wk")
    wait_for(lambda: receiver.count() == 1, timeout=60)
    until = now_ms()
    send_calls(settings, [call], "wk")
    wait_for(lambda: "replayed-1" in dropped_as_resends(settings), timeout=60)

    args = ["--destination", "hooks", "--since", format_timestamp(since)]
    done = run_cli(settings, "replay", *args, "--until", format_timestamp(until))
    assert done.returncode == 0, done.stderr
    wait_for(lambda: receiver.count() == 2, timeout=60)
    assert [body["messageId"] for body in receiver.delivered()] == ["replayed-1"] * 2
