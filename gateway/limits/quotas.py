"""Applying a policy's rate limits (and a key's own) to one request."""

from __future__ import annotations

from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from gateway.http.auth import identity_of, services_of
from gateway.http.errors import ApiError
from gateway.http.off_loop import run_stage
from gateway.keys.store import KeyIdentity
from gateway.limits.rate_limit import RateLimiter
from gateway.policy.runtime import policy_for
from gateway.policy.schema import RateLimits


def _buckets(identity: KeyIdentity, limits: RateLimits) -> list[tuple[str, int | None, str]]:
    return [
        (
            f"key:{identity.key_id}:requests",
            identity.requests_per_minute or limits.key_requests_per_minute,
            "requests",
        ),
        (f"tenant:{identity.tenant}:requests", limits.tenant_requests_per_minute, "requests"),
        (
            f"key:{identity.key_id}:tokens",
            identity.tokens_per_minute or limits.key_tokens_per_minute,
            "tokens",
        ),
        (f"tenant:{identity.tenant}:tokens", limits.tenant_tokens_per_minute, "tokens"),
    ]


def admit(limiter: RateLimiter, identity: KeyIdentity, limits: RateLimits) -> None:
    """Count the request, or refuse it with 429 and `retry-after`.

    Token budgets are charged after the answer (its size is unknown before); a caller
    whose minute's budget is already spent is refused up front.
    """
    for bucket, limit, unit in _buckets(identity, limits):
        if limit is None:
            continue
        scope = "key" if bucket.startswith("key:") else "tenant"
        if unit == "requests":
            decision = limiter.hit(bucket, limit)
            refused = not decision.allowed
            retry_after = decision.retry_after
        else:
            refused = limiter.used(bucket) >= limit
            retry_after = 60
        if refused:
            raise ApiError(
                429,
                f"Rate limit reached for this {scope}: {limit} {unit} per minute.",
                type="rate_limit_error",
                code="rate_limit_exceeded",
                headers={"retry-after": str(retry_after)},
            )


def charge_tokens(
    limiter: RateLimiter, identity: KeyIdentity, limits: RateLimits, tokens: int
) -> None:
    if tokens <= 0:
        return
    for bucket, limit, unit in _buckets(identity, limits):
        if unit == "tokens" and limit is not None:
            limiter.add(bucket, tokens)


async def charge(
    limiter: RateLimiter, identity: KeyIdentity, limits: RateLimits, tokens: int
) -> None:
    """`charge_tokens`, off the event loop when the limiter does I/O."""
    await run_stage(not limiter.local, charge_tokens, limiter, identity, limits, tokens)


async def admit_guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Guard, after the role guard: the caller's policy (403 without one) admits the
    request under its rate limits (429), before the body is read."""
    services = services_of(connection)
    identity = identity_of(connection)
    limits = policy_for(services.policies, identity).loaded.policy.rate_limits
    limiter = services.limiter
    # Counted in memory, on the event loop; a Redis round trip goes to a thread.
    await run_stage(not limiter.local, admit, limiter, identity, limits)
