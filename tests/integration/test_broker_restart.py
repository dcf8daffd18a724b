"""A broker restart loses nothing: the embedded broker on ``s3://`` storage (a local S3 server,
moto's) is SIGKILLed and restarted while calls stream in; every call acknowledged before the
kill is delivered.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from pipeline.kafka.broker import EmbeddedBroker
from pipeline.kafka.clients import create_topics
from tests.support import apply, send_calls, simple_config, wait_for

CHUNK = 5


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_broker(s3_endpoint: str) -> Iterator[EmbeddedBroker]:
    """A broker keeping its data in a bucket of its own (it must exist before the broker)."""
    bucket = f"broker-{uuid.uuid4().hex[:12]}"
    credentials = {"aws_access_key_id": "test", "aws_secret_access_key": "test"}
    boto3.client(
        "s3", endpoint_url=s3_endpoint, region_name="us-east-1", **credentials
    ).create_bucket(Bucket=bucket)
    env = {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT": s3_endpoint,
        "AWS_ALLOW_HTTP": "true",  # the local server speaks plain HTTP
    }
    broker = EmbeddedBroker(port=0, storage=f"s3://{bucket}/", env=env)
    broker.start()
    yield broker
    broker.stop()


@pytest.mark.timeout(240)
def test_a_broker_killed_and_restarted_mid_stream_loses_no_acknowledged_call(
    settings, s3_broker, receiver_factory, worker_factory
):
    settings = settings.replace(bootstrap_servers=s3_broker.bootstrap_servers)
    create_topics(settings)
    receiver = receiver_factory()
    apply(settings, simple_config(receiver.url))
    worker_factory(settings)

    acked: list[tuple[float, list[str]]] = []  # (when send_calls returned, its messageIds)
    stop = threading.Event()

    def stream() -> None:
        n = 0
        while not stop.is_set():
            ids = [f"m-{n + i}" for i in range(CHUNK)]
            send_calls(settings, [_call(i) for i in ids], "wk")
            acked.append((time.monotonic(), ids))
            n += CHUNK
            time.sleep(0.1)

    sender = threading.Thread(target=stream, daemon=True)
    sender.start()
    wait_for(lambda: receiver.count() >= 50, timeout=60)
    s3_broker.kill()
    killed_at = time.monotonic()
    time.sleep(1.0)
    s3_broker.start()
    # The stream goes on through the restart, then stops.
    wait_for(lambda: any(at > killed_at + 3 for at, _ in acked), timeout=90)
    stop.set()
    sender.join(90)
    assert not sender.is_alive()

    before = {i for at, ids in acked if at < killed_at for i in ids}
    every = {i for _, ids in acked for i in ids}
    wait_for(lambda: every <= {b["messageId"] for b in receiver.delivered()}, timeout=120)
    delivered = {b["messageId"] for b in receiver.delivered()}
    print(
        f"\n{len(before)} calls acknowledged before the kill, {len(every)} in all; "
        f"{len(delivered)} delivered"
    )
    assert before <= delivered
    assert every <= delivered


def _call(message_id: str) -> dict[str, Any]:
    return {
        "type": "track",
        "userId": f"u{message_id[-1]}",
        "event": "Tick",
        "messageId": message_id,
    }
