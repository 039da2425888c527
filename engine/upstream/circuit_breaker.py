"""A circuit breaker for one upstream URL: after `failures` failures in a row it opens for
`reset_s` seconds (requests skip the URL), then lets one trial request through; the
trial's success closes it, its failure opens it again."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(slots=True)
class CircuitBreaker:
    failures: int
    reset_s: float
    clock: Callable[[], float] = time.monotonic
    _consecutive: int = 0
    _open_until: float | None = None
    _trial_in_flight: bool = field(default=False)

    @property
    def is_open(self) -> bool:
        """True while requests must skip this URL (open, or a trial already in flight)."""
        if self._open_until is None:
            return False
        return self.clock() < self._open_until or self._trial_in_flight

    def retry_after_s(self) -> float:
        """Seconds until this URL takes a request again (0 when it does now)."""
        if not self.is_open or self._open_until is None:
            return 0.0
        return max(self._open_until - self.clock(), 0.0) or self.reset_s

    def begin(self) -> None:
        """A request is sent; after the open period it is the one trial."""
        if self._open_until is not None:
            self._trial_in_flight = True

    def record_success(self) -> None:
        self._consecutive = 0
        self._open_until = None
        self._trial_in_flight = False

    def record_failure(self) -> None:
        self._consecutive += 1
        self._trial_in_flight = False
        if self._open_until is not None or self._consecutive >= self.failures:
            self._open_until = self.clock() + self.reset_s

    def release(self) -> None:
        """A request ended with no verdict on the server (the client left): the next
        request may be the trial."""
        self._trial_in_flight = False
