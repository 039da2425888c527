"""Rate limits per key and per tenant: requests and tokens per minute.

Fixed one-minute windows. In memory for a single process; in Redis (`BASTION_REDIS_URL`)
when several processes or replicas must share one limit.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

WINDOW_SECONDS = 60


@dataclass(frozen=True, slots=True)
class RateDecision:
    allowed: bool
    used: int
    retry_after: int


class RateLimiter(Protocol):
    """Counts usage of a bucket within the current minute."""

    # True when counting does no I/O (microseconds), so callers may count on the event
    # loop instead of taking a trip to a thread.
    local: bool

    def hit(self, bucket: str, limit: int, amount: int = 1) -> RateDecision:
        """Add `amount` unless that would pass `limit`; say whether it was allowed."""
        ...

    def add(self, bucket: str, amount: int) -> None:
        """Record usage known only afterwards (tokens), without a check."""
        ...

    def used(self, bucket: str) -> int: ...


def _window(now: float) -> tuple[int, int]:
    start = int(now // WINDOW_SECONDS) * WINDOW_SECONDS
    return start, max(1, math.ceil(start + WINDOW_SECONDS - now))


class InMemoryRateLimiter:
    """One process's counters; old windows are dropped as new ones start."""

    local = True

    def __init__(self) -> None:
        self._counts: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def hit(self, bucket: str, limit: int, amount: int = 1) -> RateDecision:
        start, retry_after = _window(time.time())
        with self._lock:
            self._forget_before(start)
            used = self._counts.get((bucket, start), 0)
            if used + amount > limit:
                return RateDecision(False, used, retry_after)
            self._counts[(bucket, start)] = used + amount
            return RateDecision(True, used + amount, 0)

    def add(self, bucket: str, amount: int) -> None:
        start, _ = _window(time.time())
        with self._lock:
            self._counts[(bucket, start)] = self._counts.get((bucket, start), 0) + amount

    def used(self, bucket: str) -> int:
        start, _ = _window(time.time())
        with self._lock:
            return self._counts.get((bucket, start), 0)

    def _forget_before(self, start: int) -> None:
        if len(self._counts) > 10_000:
            self._counts = {k: v for k, v in self._counts.items() if k[1] >= start}


class RedisRateLimiter:
    """Counters shared by every process that uses the same Redis."""

    local = False  # a round trip to Redis each time

    # Increment only when the result stays within the limit, atomically.
    _HIT = """
    local used = tonumber(redis.call('GET', KEYS[1]) or '0')
    if used + tonumber(ARGV[1]) > tonumber(ARGV[2]) then return {0, used} end
    used = redis.call('INCRBY', KEYS[1], ARGV[1])
    redis.call('EXPIRE', KEYS[1], ARGV[3])
    return {1, used}
    """

    def __init__(self, url: str, prefix: str = "bastion:rl") -> None:
        import redis

        self._redis: Any = redis.Redis.from_url(url, socket_timeout=2)
        self._prefix = prefix
        self._hit_script = self._redis.register_script(self._HIT)

    def hit(self, bucket: str, limit: int, amount: int = 1) -> RateDecision:
        start, retry_after = _window(time.time())
        allowed, used = self._hit_script(
            keys=[self._key(bucket, start)], args=[amount, limit, WINDOW_SECONDS * 2]
        )
        return RateDecision(bool(allowed), int(used), 0 if allowed else retry_after)

    def add(self, bucket: str, amount: int) -> None:
        start, _ = _window(time.time())
        key = self._key(bucket, start)
        pipe = self._redis.pipeline()
        pipe.incrby(key, amount)
        pipe.expire(key, WINDOW_SECONDS * 2)
        pipe.execute()

    def used(self, bucket: str) -> int:
        start, _ = _window(time.time())
        return int(self._redis.get(self._key(bucket, start)) or 0)

    def _key(self, bucket: str, start: int) -> str:
        return f"{self._prefix}:{bucket}:{start}"


def make_rate_limiter(redis_url: str | None) -> RateLimiter:
    return RedisRateLimiter(redis_url) if redis_url else InMemoryRateLimiter()
