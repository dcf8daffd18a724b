"""How fast ``pipeline replay`` sends, and what a replay costs live traffic.

    .venv/bin/python -m bench.replay [--calls 20000] [--phase-seconds 5] [--rounds 3]

Starts its own embedded broker, one ``pipeline worker --no-log-store`` process and two
``bench._receiver`` processes (live, backfill). A backlog of ``--calls`` calls of a source with
no destination is routed nowhere; then a ``backfill`` destination is connected to it, and:

1. live traffic alone, 200 calls/s of another source to a ``live`` destination, alternating with
   the same live traffic while ``pipeline replay --destination backfill`` runs at its default
   rate (200/s) and at 1,000/s (the replay is paused with SIGSTOP between phases, so both phases
   of a round see the same machine): live end-to-end latency (the call's arrival at the
   pipeline to the receiver's answer), p50 and p95 of each kind of phase;
2. the replay alone at an unreachable rate (``--rate 100000``): calls/s from the replay's first
   delivered call to its last, and the replay command's own wall time.

The figures behind the default rate (docs/decisions.md, "Replay and backfill").
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid

from confluent_kafka import Consumer, TopicPartition

from bench._harness import ROOT, Deployment, Receiver, Worker, end_all, wait_answered
from pipeline.core.calls import Call, CallType
from pipeline.core.records import call_to_record
from pipeline.kafka.broker import EmbeddedBroker
from pipeline.kafka.clients import consumer_config, make_producer

LIVE_RATE = 200


class LiveTraffic(threading.Thread):
    """Live calls at ``LIVE_RATE`` a second, produced as the ingestion API does; ``sent`` keeps
    each one's arrival time by messageId."""

    def __init__(self, deployment: Deployment, seconds: float) -> None:
        super().__init__(daemon=True)
        self.deployment, self.seconds = deployment, seconds
        self.sent: dict[str, float] = {}

    def run(self) -> None:
        producer = make_producer(self.deployment.settings)
        codec, topic = self.deployment.codec, self.deployment.topics.calls
        started = time.time()
        while (now := time.time()) - started < self.seconds:
            message_id = str(uuid.uuid4())
            ms = int(now * 1000)
            call = Call(CallType.TRACK, message_id, "live", ms, ms, user_id="l", event="Live")
            producer.produce(topic, codec.encode("Call", call_to_record(call)), b"l")
            producer.poll(0)
            self.sent[message_id] = now
            time.sleep(max(0.0, started + len(self.sent) / LIVE_RATE - time.time()))
        producer.flush(30)


def live_latencies(deployment: Deployment, receiver: Receiver, seconds: float) -> list[float]:
    traffic = LiveTraffic(deployment, seconds)
    traffic.start()
    traffic.join()
    deadline = time.monotonic() + 30
    while True:
        arrived = {mid: at for mid, _attempt, at in receiver.arrivals() if mid in traffic.sent}
        if len(arrived) >= len(traffic.sent) or time.monotonic() > deadline:
            return [at - traffic.sent[mid] for mid, at in arrived.items()]
        time.sleep(0.1)


def routed_everything(deployment: Deployment, count: int) -> None:
    """Wait until the router's group committed ``count`` calls (the backlog, routed nowhere)."""
    settings, topic = deployment.settings, deployment.topics.calls
    consumer = Consumer(consumer_config(settings, f"{settings.topic_prefix}router"))
    try:
        partitions = [TopicPartition(topic, p) for p in range(settings.partitions)]
        while sum(max(0, tp.offset) for tp in consumer.committed(partitions, 10)) < count:
            time.sleep(0.2)
    finally:
        consumer.close()


def replay(deployment: Deployment, *extra: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "pipeline", "replay", "--destination", "backfill"]
    command += ["--since", "1h", "--yes", *extra]
    return subprocess.Popen(
        command,
        env=deployment.env(),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def summary(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p95 = ordered[int(len(ordered) * 0.95)]
    return f"p50 {statistics.median(ordered) * 1000:6.1f} ms, p95 {p95 * 1000:6.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20_000, help="backlog to replay")
    parser.add_argument("--phase-seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with EmbeddedBroker(port=0) as broker:
        deployment = Deployment(broker.bootstrap_servers, "replay")
        live, backfill = Receiver(log=True), Receiver()
        try:
            deployment.apply({"old": [], "live": [("live", [live.url()])]})
            worker = Worker("worker --no-log-store", deployment.env(), "replay-worker")
            deployment.produce_calls("old", args.calls)
            routed_everything(deployment, args.calls)
            deployment.apply(
                {"old": [("backfill", [backfill.url()])], "live": [("live", [live.url()])]}
            )
            live_latencies(deployment, live, 1.0)  # warm-up

            # Distinct --until texts: each is a replay of its own, not a resumption of another.
            replays = {
                "replay at 200/s": replay(deployment, "--until", "1s"),
                "replay at 1,000/s": replay(deployment, "--until", "2s", "--rate", "1000"),
            }
            phases: dict[str, list[float]] = {"alone": [], **{name: [] for name in replays}}
            for process in replays.values():
                process.send_signal(signal.SIGSTOP)
            for _ in range(args.rounds):
                phases["alone"] += live_latencies(deployment, live, args.phase_seconds)
                for name, process in replays.items():
                    process.send_signal(signal.SIGCONT)
                    phases[name] += live_latencies(deployment, live, args.phase_seconds)
                    process.send_signal(signal.SIGSTOP)
            for process in replays.values():
                process.send_signal(signal.SIGCONT)
                process.send_signal(signal.SIGINT)
                process.wait(60)
            alone = statistics.median(phases["alone"])
            print(f"live traffic {LIVE_RATE} calls/s, end to end ({args.rounds} rounds):")
            for name, latencies in phases.items():
                ratio = statistics.median(latencies) / alone
                print(f"  {name:<18} {summary(latencies)}  (p50 {ratio:.2f}x alone)")

            backfill.reset()
            started = time.monotonic()
            fast = replay(deployment, "--until", "3s", "--rate", "100000")
            fast.wait(600)
            took = time.monotonic() - started
            stats = wait_answered(backfill, args.calls, timeout=600)
            span = stats["last"] - stats["first"]
            print(
                f"replay alone, --rate 100000: {stats['answered']:,} calls delivered at "
                f"{stats['answered'] / span:,.0f} calls/s (first to last answer); the command "
                f"took {took:.1f} s in all"
            )
            worker.stop()
        finally:
            end_all()


if __name__ == "__main__":
    main()
