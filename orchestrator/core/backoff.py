"""The one backoff policy of the host: exponential, capped, with equal jitter.

A retry ``n`` (1 for the first) waits ``uniform(d/2, d)`` seconds with
``d = min(cap, base·2ⁿ⁻¹)``: at least half the exponential step, so a storm
of failures never turns into a hot loop, and spread over the other half, so
the retries of many runs or deliveries that failed together do not come back
together.  The waits are tenacity's (``wait_exponential`` plus
``wait_random_exponential``, both halved); runs (``orchestrator/run/pipeline.py``)
and deliveries (``orchestrator/run/outbound.py``) use this, and the agent
runner's providers use their SDKs' own retries inside the container.
"""

from __future__ import annotations

from tenacity import RetryCallState, wait_exponential, wait_random_exponential


def backoff_delay(attempt: int, base_s: float, max_s: float) -> float:
    """Seconds to wait before retry number ``attempt`` (1-based)."""
    half = wait_exponential(multiplier=base_s / 2, max=max_s / 2) + wait_random_exponential(
        multiplier=base_s / 2, max=max_s / 2
    )
    # The waits read the attempt number alone: no Retrying object behind the state.
    state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
    state.attempt_number = max(1, attempt)
    return float(half(state))
