"""Section 13 of ``make bench``: ordered delivery per user (``ordering: per_user``).

- end to end, one ``pipeline worker``: a backlog of calls of 1,000 users (round robin) to one
  destination with ``ordering: per_user``, against the same destination with ``ordering: none``
  (a deployment and a worker of its own, the same receiver; same run, alternated);
- 1,000 users, one of them failing: the receiver answers 503 to every call of one user for 30 s
  from that user's first request, then 200 (``bench._receiver --fail-user``); the other 999 users'
  deliveries/s against a run of the same 999 users' calls without the failing user (both
  ordered, the same worker; same run, alternated). The failing user's first call waits in a
  retry tier (every 5 s, deadline 300 s: retried, never dead-lettered in the 30 s) and holds back
  its later calls; each run has a failing user of its own (``slow-<run>``), and at the end the
  failing users' calls are checked to have all arrived, in order (bounded wait).

Every worker is settled (``Worker.settle``) before each measured run, so that neither deployment's
tail (its delivery log, commits) is billed to the next run. The worker logs' errors are counted.

Run alone: ``python -m bench --only 13``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from ._harness import (
    Deployment,
    Receiver,
    Worker,
    produce_all,
    rate,
    wait_answered,
)

__all__ = ["section_ordering"]

#: Users of each backlog (round robin, one call each a round).
USERS = 1000
#: The failing users' userId prefix, and how long the receiver refuses each one's calls.
FAILING = "slow"
FAILING_FOR = 30.0
#: The retry tier's delay and the deadline: the failing user's first call is retried, not
#: dead-lettered, during its 30 s.
RETRY_DELAY = 5.0
RETRY_DEADLINE = "300s"
#: Longest wait, after the last run, for the failing users' calls to arrive.
TAIL_SECONDS = 120.0


def section_ordering(
    bench: Any,
    *,
    warm_up: Callable[[Receiver, Deployment, str], None],
    row: Callable[..., Any],
    fmt: Callable[..., str],
    median: Callable[[list[float]], float],
    log: Callable[[str], None],
) -> None:
    calls = bench.n(20000)
    rounds = calls // USERS
    users = [f"u{n}" for n in range(USERS)]
    others = users[:-1]  # in the failing runs, the failing user takes the last one's place
    receiver = Receiver(fail_user=FAILING, fail_for=FAILING_FOR)
    modes = {
        "per_user": Deployment(bench.bootstrap, "ordered", retry_delays=(RETRY_DELAY,)),
        "none": Deployment(bench.bootstrap, "unordered", retry_delays=(RETRY_DELAY,)),
    }
    e2e: dict[str, list[float]] = {"per_user": [], "none": []}
    failing: dict[str, list[float]] = {"with": [], "without": []}
    expected: dict[str, list[str]] = {}  # a failing user → its messageIds, in the order sent
    began: dict[str, float] = {}  # a failing user → when its run's backlog was produced
    workers: dict[str, Worker] = {}
    cpu: dict[str, list[float]] = {}  # mode → the worker's CPU per call, µs, by run
    runs = max(bench.runs, 5)  # as in section 12: a run's ratio spreads far on this machine
    started = time.monotonic()
    try:
        for mode, deployment in modes.items():
            deployment.apply(
                {"s": [("d1", [receiver.url()])]}, destination_fields={"ordering": mode}
            )
            env = deployment.env(PIPELINE_RETRY_DEADLINE=RETRY_DEADLINE)
            workers[mode] = Worker("worker", env, f"ordering-worker-{mode}")
        for deployment in modes.values():
            warm_up(receiver, deployment, "s")

        def measured(mode: str, records: list[tuple[bytes, bytes]], count: int) -> float:
            """Events/s of ``count`` calls at the receiver (the failing users' left out); the
            mode's worker's CPU a call meanwhile goes to ``cpu[mode]`` (µs)."""
            for worker in workers.values():
                worker.settle()
            receiver.reset()
            used = workers[mode].cpu_seconds()
            produce_all(modes[mode].settings, modes[mode].topics.calls, records)
            figure = rate(wait_answered(receiver, count, timeout=120, stall=15))
            cpu.setdefault(mode, []).append((workers[mode].cpu_seconds() - used) / count * 1e6)
            return figure

        for run in range(runs):
            for mode in ("per_user", "none") if run % 2 == 0 else ("none", "per_user"):
                records, _ = call_records(modes[mode], "s", users, rounds)
                e2e[mode].append(measured(mode, records, len(records)))
            log(
                f"13 run {run + 1}: end to end ordered {e2e['per_user'][-1]:,.0f}/s "
                f"({cpu['per_user'][-1]:.0f} µs CPU a call), unordered {e2e['none'][-1]:,.0f}/s "
                f"({cpu['none'][-1]:.0f} µs)"
            )
        ordered = modes["per_user"]
        for run in range(runs):
            for case in ("with", "without") if run % 2 == 0 else ("without", "with"):
                slow = f"{FAILING}-{run}"
                run_users = [*others, slow] if case == "with" else others
                records, expected_ids = call_records(ordered, "s", run_users, rounds, slow)
                if case == "with":
                    expected[slow], began[slow] = expected_ids, time.time()
                failing[case].append(measured("per_user", records, len(others) * rounds))
            log(
                f"13 run {run + 1}: the other {len(others):,} users with one failing "
                f"{failing['with'][-1]:,.0f} deliveries/s, without {failing['without'][-1]:,.0f}/s"
            )
        tail = failing_users_delivered(receiver, expected, began)
    finally:
        for worker in workers.values():
            worker.stop()
        receiver.stop()
    errors = {mode: logged_errors(worker) for mode, worker in workers.items()}
    log(
        f"13: {time.monotonic() - started:.0f} s; worker logs' errors: "
        + ", ".join(f"{mode} {count}" for mode, count in errors.items())
    )
    notes = [
        f"(13): the worker's CPU a call while it delivered the backlog (router, deliver, retry and "
        f"log-store in one process), end to end: ordered {median(cpu['per_user'][:runs]):.0f} µs, "
        f"unordered {median(cpu['none']):.0f} µs (medians).",
        f"(13): {tail}",
    ]
    if any(errors.values()):
        notes.append(
            "(13): errors in the worker logs: "
            + ", ".join(f"{workers[mode].log_path} {count}" for mode, count in errors.items())
        )
    for note in notes:
        log(note)
    bench.notes += notes

    def against(measure: str, rates: dict[str, list[float]], reference: str, target: float) -> Any:
        """A row of the first of ``rates`` against the second (``reference`` says what it is),
        the ratio the median of the runs' ratios."""
        ours, theirs = rates.values()
        pairs = list(zip(ours, theirs, strict=True))
        ratio = median([a / b for a, b in pairs])
        return row(
            "13",
            measure,
            fmt(median(ours)),
            f"{reference}: {fmt(median(theirs))}",
            fmt(ratio),
            f"≥ {target:g}",
            ratio >= target,
            [f"{a:,.0f}/{b:,.0f}" for a, b in pairs],
        )

    bench.rows += [
        against(
            f"end to end, one `pipeline worker`, {calls:,} calls of {USERS:,} users to a "
            "destination with `ordering: per_user` (events/s)",
            e2e,
            "`ordering: none`",
            0.9,
        ),
        against(
            f"{USERS:,} users, one's calls answered 503 for {FAILING_FOR:.0f} s (ordered): "
            f"the other {len(others):,} users' {len(others) * rounds:,} calls (deliveries/s)",
            failing,
            "the same calls without the failing user",
            0.95,
        ),
    ]


def call_records(
    deployment: Deployment, source: str, users: Sequence[str], rounds: int, watched: str = ""
) -> tuple[list[tuple[bytes, bytes]], list[str]]:
    """(key, value) of encoded track calls, one of each user a round, ``rounds`` rounds; and the
    messageIds of ``watched``'s calls, in the order they are sent."""
    now = int(time.time() * 1000)
    records, watched_ids = [], []
    for _ in range(rounds):
        for user in users:
            message_id = str(uuid.uuid4())
            records.append(deployment.call_record(source, user, message_id, now))
            if user == watched:
                watched_ids.append(message_id)
    return records, watched_ids


def failing_users_delivered(
    receiver: Receiver, expected: dict[str, list[str]], began: dict[str, float]
) -> str:
    """Wait (``TAIL_SECONDS`` at most) until every failing user's calls arrived; say whether they
    all did, in the order sent, and how long after their run's backlog was produced."""
    total = sum(len(ids) for ids in expected.values())
    deadline = time.monotonic() + TAIL_SECONDS
    while True:
        answered = receiver.failing()
        arrived: dict[str, dict[str, float]] = {user: {} for user in expected}
        for user, message_id, at in answered["answered"]:
            arrived.setdefault(user, {}).setdefault(message_id, at)  # the first delivery
        if sum(len(ids) for ids in arrived.values()) >= total or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    late = [user for user in expected if len(arrived[user]) < len(expected[user])]
    disordered = [
        user
        for user in expected
        if [m for m in arrived[user] if m in set(expected[user])]
        != [m for m in expected[user] if m in arrived[user]]
    ]
    first = [min(arrived[user].values()) - began[user] for user in expected if arrived[user]]
    last = [max(arrived[user].values()) - began[user] for user in expected if arrived[user]]
    span = (
        f"{min(first):.0f}-{max(first):.0f} s and {min(last):.0f}-{max(last):.0f} s"
        if first
        else "n/a"
    )
    return (
        f"the {len(expected)} failing users' {total} calls ({total // max(len(expected), 1)} "
        f"each): {sum(len(a) for a in arrived.values())} arrived ({len(late)} users not all "
        f"within {TAIL_SECONDS:.0f} s after the last run), "
        + ("in order" if not disordered else f"out of order for {', '.join(disordered)}")
        + f"; a user's first and last call arrived {span} after its run's backlog was produced; "
        f"{answered['refused']} requests answered 503"
    )


def logged_errors(worker: Worker) -> int:
    """Lines of the worker's log that say ERROR or start a traceback."""
    try:
        text = worker.log_path.read_text(errors="replace")
    except OSError:
        return 0
    return sum(1 for line in text.splitlines() if "ERROR" in line or line.startswith("Traceback"))
