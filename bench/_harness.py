"""What every benchmark needs: a broker, receivers, worker processes, and fast backlogs.

Everything runs on 127.0.0.1 and is ended by PID. Every wait is bounded.
"""

from __future__ import annotations

import glob
import http.client
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson

from pipeline.core.calls import Call, CallType
from pipeline.core.config import validate_config
from pipeline.core.records import call_from_record, call_to_record, new_delivery
from pipeline.core.render import render_body
from pipeline.core.settings import Settings
from pipeline.core.signing import SIGNATURE_HEADER, sign
from pipeline.http.sender import USER_AGENT
from pipeline.kafka.clients import create_topics, make_producer, topics_for
from pipeline.kafka.codec import Codec
from pipeline.kafka.config_store import apply_config

ROOT = Path(__file__).resolve().parent.parent
SECRET = "bench-s3cret"
#: The call every end-to-end benchmark sends: a track call whose webhook body is ~600 bytes.
PROPERTIES = orjson.dumps({"plan": "pro", "revenue": 42.5, "currency": "EUR", "text": "x" * 300})
CONTEXT = orjson.dumps({"ip": "203.0.113.9", "library": {"name": "bench", "version": "1.0"}})
LOG_DIR = Path(tempfile.gettempdir()) / "pipeline-bench"


class Receiver:
    """A ``bench._receiver`` process; its counters are read over HTTP."""

    def __init__(
        self,
        mode: str = "ok",
        *,
        delay: float = 0.0,
        log: bool = False,
        fail_user: str = "",
        fail_for: float = 30.0,
        admit: int = 0,
    ) -> None:
        command = [sys.executable, "-m", "bench._receiver", "--mode", mode, "--delay", str(delay)]
        if log:
            command.append("--log")
        if fail_user:  # 503 to each user of this userId prefix for fail_for s (see _receiver)
            command += ["--fail-user", fail_user, "--fail-for", str(fail_for)]
        if admit:  # 429 past this many a second (see _receiver)
            command += ["--admit", str(admit)]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        _STARTED.append(self)
        assert self.process.stdout is not None
        self.port = int(self.process.stdout.readline())

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _get(self, path: str) -> Any:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            connection.request("GET", path)
            return orjson.loads(connection.getresponse().read())
        finally:
            connection.close()

    def stats(self) -> dict[str, Any]:
        return dict(self._get("/__stats"))

    def reset(self) -> None:
        self._get("/__reset")

    def arrivals(self) -> list[tuple[str, int, float]]:
        return [tuple(a) for a in self._get("/__arrivals")]  # type: ignore[misc]

    def failing(self) -> dict[str, Any]:
        """``fail_user``'s users: {"refused": n, "answered": [[userId, messageId, time], ...]}."""
        return dict(self._get("/__failing"))

    def stop(self) -> None:
        _forget(self)
        _end(self.process)


#: Every receiver and worker the bench started and has not stopped yet: a failed section's
#: leftovers are stopped by ``end_all`` (by PID, never by name).
_STARTED: list[Receiver | Worker] = []
#: The topic prefixes of the deployments made since the last ``end_all``.
_PREFIXES: list[str] = []


def end_all() -> None:
    """Stop what a section left running (it failed before its own ``finally``), and remove its
    deployments' embedded log stores (hundreds of MB a section; the worker logs stay)."""
    while _STARTED:
        started = _STARTED[-1]
        try:
            started.stop()  # forgets it
        except Exception as exc:  # noqa: BLE001 - keep ending the others
            print(f"could not stop {started}: {exc}", file=sys.stderr)
        _forget(started)
    while _PREFIXES:
        for path in LOG_DIR.glob(f"{glob.escape(_PREFIXES.pop())}log.sqlite3*"):
            path.unlink(missing_ok=True)


def _forget(started: Receiver | Worker) -> None:
    if started in _STARTED:
        _STARTED.remove(started)


def _end(process: subprocess.Popen[Any], grace: float = 10.0) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def rate(stats: dict[str, Any]) -> float:
    """Answers per second between the first and the last answer the receiver gave."""
    span = stats["last"] - stats["first"]
    return (stats["answered"] - 1) / span if span > 0 and stats["answered"] > 1 else 0.0


def wait_answered(
    receiver: Receiver,
    count: int,
    *,
    timeout: float,
    stall: float = 10.0,
    counted: str = "answered",
) -> dict[str, Any]:
    """Wait until ``receiver`` answered ``count`` requests (``counted="calls"``: accepted that
    many calls, a batch carrying many), bounded by ``timeout`` and ``stall``."""
    deadline = time.monotonic() + timeout
    last_change, seen = time.monotonic(), -1
    while True:
        stats = receiver.stats()
        if stats[counted] >= count:
            return stats
        now = time.monotonic()
        if stats[counted] != seen:
            seen, last_change = stats[counted], now
        if now > deadline or now - last_change > stall:
            why = f"no progress for {stall:.0f} s" if now <= deadline else "timed out"
            raise TimeoutError(
                f"receiver :{receiver.port} {counted} {stats[counted]} of {count} ({why})"
            )
        time.sleep(0.05)


class Deployment:
    """One topic prefix on the shared broker: topics, a config, and the env for its workers."""

    def __init__(self, bootstrap: str, name: str, **settings: Any) -> None:
        self.settings = Settings(
            bootstrap_servers=bootstrap,
            topic_prefix=f"bench-{name}-{uuid.uuid4().hex[:6]}.",
            session_timeout=6.0,
            allowed_networks=("127.0.0.0/8",),
            **settings,
        )
        _PREFIXES.append(self.settings.topic_prefix)
        self.topics = topics_for(self.settings)
        create_topics(self.settings)
        self.codec = Codec.default()

    def apply(
        self,
        sources: dict[str, list[tuple[str, list[str]]]],
        *,
        destination_fields: dict[str, Any] | None = None,
        **extra: Any,
    ) -> None:
        """``sources``: source id → [(destination id, [url, ...]), ...]; ``destination_fields``:
        what every destination also gets (e.g. ``{"ordering": "per_user"}``)."""
        destinations = []
        for source, targets in sources.items():
            for destination, urls in targets:
                destinations.append(
                    {
                        "id": destination,
                        "sources": [source],
                        "shared_secret": SECRET,
                        "webhooks": [{"url": url} for url in urls],
                        **(destination_fields or {}),
                    }
                )
        config = {
            "sources": [{"id": s, "write_keys": [f"wk_{s}"]} for s in sources],
            "destinations": destinations,
            **extra,
        }
        apply_config(self.settings, validate_config(config))

    def env(self, **extra: str) -> dict[str, str]:
        s = self.settings
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
        env.update(
            PIPELINE_BOOTSTRAP_SERVERS=s.bootstrap_servers,
            PIPELINE_TOPIC_PREFIX=s.topic_prefix,
            PIPELINE_SESSION_TIMEOUT="6s",
            PIPELINE_ALLOWED_NETWORKS="127.0.0.0/8",
            PIPELINE_PARTITIONS=str(s.partitions),
            PIPELINE_RETRY_PARTITIONS=str(s.retry_partitions),
            PIPELINE_RETRY_DELAYS=",".join(f"{d:g}s" for d in s.retry_delays),
            PIPELINE_DELIVERY_TIMEOUT=f"{s.delivery_timeout:g}s",
            # As `pipeline dev` on the embedded broker, whose transactions can stall readers
            # (docs/decisions.md); section 9 measures the router with them on.
            PIPELINE_TRANSACTIONS="off",
            # Each deployment's delivery log store: a file of its own, beside the worker logs;
            # and its partition state.
            PIPELINE_LOG_STORE_URL=self.log_store_url,
            PIPELINE_STATE_DIR=str(LOG_DIR / (s.topic_prefix + "state")),
        )
        env.update(extra)
        return env

    @property
    def log_store_url(self) -> str:
        return f"sqlite:///{LOG_DIR / (self.settings.topic_prefix + 'log.sqlite3')}"

    def call_record(self, source: str, user: str, message_id: str, now: int) -> tuple[bytes, bytes]:
        """(key, value) of one encoded track call of ``user`` from ``source``."""
        call = Call(
            CallType.TRACK,
            message_id,
            source,
            now,
            now,
            user_id=user,
            event="Order Completed",
            properties=PROPERTIES.decode(),
            context=CONTEXT.decode(),
        )
        return user.encode(), self.codec.encode("Call", call_to_record(call))

    def call_records(self, source: str, count: int) -> Iterable[tuple[bytes, bytes]]:
        """(key, value) of ``count`` encoded track calls from ``source``."""
        now = int(time.time() * 1000)
        for i in range(count):
            yield self.call_record(source, f"u{i % 5000}", str(uuid.uuid4()), now)

    def produce_calls(self, source: str, count: int) -> None:
        produce_all(self.settings, self.topics.calls, self.call_records(source, count))


def produce_all(settings: Settings, topic: str, records: Iterable[tuple[Any, ...]]) -> int:
    """Produce every (key, value) or (key, value, headers); return once Kafka acknowledged them
    all."""
    producer = make_producer(settings, **{"linger.ms": 20})
    errors: list[str] = []

    def report(error: Any, _message: Any) -> None:
        if error is not None:
            errors.append(error.str())

    count = 0
    for record in records:
        key, value = record[0], record[1]
        headers = record[2] if len(record) > 2 else None
        while True:
            try:
                producer.produce(topic, value, key, headers=headers, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.05)
        count += 1
        if count % 10000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    if left or errors:
        raise RuntimeError(f"produce failed: {left} unacknowledged, errors {errors[:3]}")
    return count


def alternated(
    section: str,
    runs: int,
    modes: Sequence[str],
    measure: Callable[[str], tuple[float, float]],
    log: Callable[[str], None],
    before_run: Callable[[], None] | None = None,
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """``measure(mode)`` (a rate, the worker's CPU seconds per 1,000 calls) for every mode in
    each of ``runs`` runs, in the reverse order every other run (so that no mode always runs on
    the warmer machine), each run logged: (rates, CPU) by mode, a figure a run. ``before_run``
    is called before each run."""
    figures: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
    for run in range(runs):
        if before_run is not None:
            before_run()
        for mode in modes if run % 2 == 0 else tuple(reversed(modes)):
            figures[mode].append(measure(mode))
        log(
            f"{section} run {run + 1}: "
            + ", ".join(
                f"{mode} {figures[mode][-1][0]:,.0f}/s ({figures[mode][-1][1]:.3f} CPU s/1k)"
                for mode in modes
            )
        )
    rates = {mode: [rate for rate, _ in runs_] for mode, runs_ in figures.items()}
    cpu = {mode: [used for _, used in runs_] for mode, runs_ in figures.items()}
    return rates, cpu


def backlog_run(
    receiver: Receiver,
    deployment: Deployment,
    worker: Worker,
    records: Iterable[tuple[Any, ...]],
    count: int,
    counted: str = "answered",
) -> tuple[float, float]:
    """One backlog of ``records`` (``count`` calls) through a settled ``worker``: (``counted``
    per second at the receiver, the worker's CPU seconds per 1,000 calls)."""
    worker.settle()
    receiver.reset()
    cpu = worker.cpu_seconds()
    produce_all(deployment.settings, deployment.topics.calls, records)
    stats = wait_answered(receiver, count, timeout=180, stall=15, counted=counted)
    used = worker.cpu_seconds() - cpu
    span = stats["last"] - stats["first"]
    return (stats[counted] / span if span > 0 else 0.0), used / count * 1000


def sample_request(deployment: Deployment) -> tuple[bytes, dict[str, str]]:
    """The body and headers the pipeline would send for one of our calls (for the baselines)."""
    _key, value = next(iter(deployment.call_records("s", 1)))
    body = render_body(call_from_record(deployment.codec.decode("Call", value)))
    return body, webhook_headers(body)


def webhook_headers(body: bytes) -> dict[str, str]:
    """The headers the pipeline sends with ``body`` to a destination whose secret is SECRET."""
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        SIGNATURE_HEADER: sign(body, SECRET),
    }


class Worker:
    """A Python process (``python -m pipeline ROLE`` by default); output goes to a log file.

    It runs in ``root`` (this checkout by default), and Python imports ``module`` from there:
    the directory ``-m`` runs in comes before ``PYTHONPATH``, so another version of the code is
    run by giving its checkout as ``root`` (a ``git worktree``), not by ``PYTHONPATH``."""

    def __init__(
        self,
        role: str,
        env: dict[str, str],
        name: str,
        *,
        module: str = "pipeline",
        root: Path = ROOT,
    ) -> None:
        LOG_DIR.mkdir(exist_ok=True)
        self.name = name
        self.log_path = LOG_DIR / f"{name}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115
        command = [sys.executable, "-m", module, *role.split()]
        profile_dir = os.environ.get("BENCH_PROFILE")
        if profile_dir:  # py-spy samples the process (GIL holder only); raw stacks for flame graphs
            Path(profile_dir).mkdir(parents=True, exist_ok=True)
            output = Path(profile_dir) / f"{name}.txt"
            spy = Path(sys.executable).parent / "py-spy"
            command = [
                str(spy),
                "record",
                "--gil",
                "-r",
                "200",
                "-f",
                "raw",
                "-o",
                str(output),
                "--",
                *command,
            ]
        self.process = subprocess.Popen(
            command,
            env=env,
            cwd=root,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        _STARTED.append(self)
        self._profiled = bool(profile_dir)

    @property
    def pid(self) -> int:
        """The Python process's PID (under ``BENCH_PROFILE``, py-spy's child)."""
        if not self._profiled:
            return self.process.pid
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
            found = children.read_text().split() if children.exists() else []
            if found:
                return int(found[0])
            time.sleep(0.05)
        raise RuntimeError(f"py-spy started no process for {self.name}")

    def memory_mb(self) -> tuple[float, float]:
        """(current RSS, peak RSS) in MB from /proc (VmRSS, VmHWM)."""
        values = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                name, amount, _unit = line.split()
                values[name] = int(amount) / 1024
        return values["VmRSS:"], values["VmHWM:"]

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def settle(self, *, busy: float = 0.1, window: float = 0.5, timeout: float = 30.0) -> float:
        """Wait until the process uses less than ``busy`` of a core over ``window`` seconds: what
        an earlier run left it to do (its delivery log, its commits) is done, so the next run
        starts from a quiet worker whatever ran before. The seconds waited (``timeout`` at most:
        a process that never settles is measured as it is)."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            before = self.cpu_seconds()
            time.sleep(window)
            if self.cpu_seconds() - before < busy * window:
                break
        return time.monotonic() - started

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        _forget(self)
        if self._profiled and self.alive():  # py-spy writes its profile once its child exits
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                pass
        _end(self.process, grace=20.0)
        self._log.close()


def delivery_records(
    deployment: Deployment, destination: str, count: int
) -> Iterable[tuple[bytes, bytes]]:
    """(key, value) of ``count`` encoded ``Delivery`` records, built from one template.

    Encoding a million records with fastavro would take longer than the benchmark they feed; only
    the messageId (the first field, 36 characters) differs, so it is spliced into the template.
    """
    _key, value = next(iter(deployment.call_records("s", 1)))
    call = call_from_record(deployment.codec.decode("Call", value))
    template_id = str(uuid.uuid4())
    body = render_body(call)
    record = new_delivery(call._replace(message_id=template_id), destination, body)
    encoded = deployment.codec.encode("Delivery", record)
    head, rest = encoded[:11], encoded[11 + 36 :]
    assert encoded[10] == 72 and encoded[11 : 11 + 36] == template_id.encode()  # zigzag(36)
    prefix = destination.encode() + b"/u"  # the router's key: destination/user
    for i in range(count):
        yield prefix + b"%d" % (i % 5000), head + b"%036d" % i + rest
