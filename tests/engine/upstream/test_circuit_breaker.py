"""The circuit breaker's states on a clock the test moves."""

from __future__ import annotations

from engine.upstream.circuit_breaker import CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_opens_after_consecutive_failures_and_lets_one_trial_through() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failures=3, reset_s=10, clock=clock)
    breaker.record_failure()
    breaker.record_failure()
    breaker.record_success()  # the count is of failures in a row
    breaker.record_failure()
    breaker.record_failure()
    assert not breaker.is_open
    breaker.record_failure()
    assert breaker.is_open and breaker.retry_after_s() == 10

    clock.now = 10
    assert not breaker.is_open
    breaker.begin()  # the trial
    assert breaker.is_open  # nobody else while it runs
    breaker.release()  # its client left: the next request is the trial
    assert not breaker.is_open
    breaker.begin()
    breaker.record_failure()
    assert breaker.is_open and breaker.retry_after_s() == 10  # one failure reopens it

    clock.now = 20
    breaker.begin()
    breaker.record_success()
    assert not breaker.is_open
    breaker.record_failure()
    assert not breaker.is_open  # closed again: a fresh count
