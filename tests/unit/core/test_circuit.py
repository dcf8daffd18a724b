"""``CircuitBreaker``: how long a circuit stays open, as its probes keep failing."""

from __future__ import annotations

from pipeline.core.circuit import CircuitBreaker, CircuitState


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def failing_probes(breaker: CircuitBreaker, clock: Clock, count: int) -> list[float]:
    """The cool-down after each of ``count`` failed probes in a row."""
    waits = []
    for _ in range(count):
        clock.now += breaker.retry_in()
        assert breaker.allow()  # the probe
        breaker.record(ok=False)
        waits.append(breaker.retry_in())
    return waits


def test_each_failed_probe_doubles_the_cool_down_up_to_its_max() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failures=2, cool_down=30.0, cool_down_max=300.0, clock=clock)
    breaker.record(ok=False)
    assert breaker.state is CircuitState.CLOSED
    breaker.record(ok=False)
    assert breaker.retry_in() == 30.0
    assert failing_probes(breaker, clock, 5) == [60.0, 120.0, 240.0, 300.0, 300.0]
    clock.now += 299.0
    assert breaker.refuses()  # still open: the grown cool-down holds
    clock.now += 1.0
    assert not breaker.refuses()


def test_a_probe_that_succeeds_resets_the_cool_down() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failures=1, cool_down=30.0, cool_down_max=300.0, clock=clock)
    breaker.record(ok=False)
    failing_probes(breaker, clock, 3)
    clock.now += breaker.retry_in()
    assert breaker.allow()
    breaker.record(ok=True)
    assert breaker.state is CircuitState.CLOSED
    breaker.record(ok=False)  # a new run of failures: the first cool-down again
    assert breaker.retry_in() == 30.0


def test_a_late_failure_while_open_does_not_grow_the_cool_down() -> None:
    """A request sent before the circuit opened fails after it: the circuit stays open as long
    as a new opening, not twice as long."""
    clock = Clock()
    breaker = CircuitBreaker(failures=1, cool_down=30.0, cool_down_max=300.0, clock=clock)
    breaker.record(ok=False)
    clock.now += 10.0
    breaker.record(ok=False)
    assert breaker.retry_in() == 30.0


def test_without_a_max_or_with_one_under_the_cool_down_it_never_grows() -> None:
    for cool_down_max in (None, 0.0, 10.0):
        clock = Clock()
        breaker = CircuitBreaker(
            failures=1, cool_down=30.0, cool_down_max=cool_down_max, clock=clock
        )
        breaker.record(ok=False)
        assert failing_probes(breaker, clock, 3) == [30.0, 30.0, 30.0]
