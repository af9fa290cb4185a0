"""What a failed call to a channel (a send, an edit, a retraction) leads to.

Retried after the backoff policy's delay (``orchestrator/core/backoff.py``), at least a
rate-limited channel's ``Retry-After`` (:class:`~orchestrator.core.errors.ChannelRateLimited`,
which uses up no attempt: a long rate limit delays a call, never fails it), or failed for
good after ``delivery_max_attempts``.  The reason kept is redacted (a channel's exception
may quote its URL, and the Telegram bot token is in its path) and capped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from orchestrator.core import secrets
from orchestrator.core.backoff import backoff_delay
from orchestrator.core.errors import ChannelRateLimited
from orchestrator.core.settings import DeliverySettings

log = logging.getLogger(__name__)

ERROR_CAP = 2000  # characters of a failure kept in last_error


@dataclass(frozen=True)
class FailedCall:
    error: str  # what went wrong, redacted and capped
    retry_at: datetime | None  # when to try again (None: failed for good)
    give_back_attempt: bool  # the platform said "not now": the attempt is not counted


def judge_failure(exc: BaseException, *, attempts: int, delivery: DeliverySettings, what: str) -> FailedCall:
    """What the ``attempts``-th failed call ``what`` ("delivery of #5 to slack") leads to; logged."""
    error = secrets.redact(f"{type(exc).__name__}: {exc}")[:ERROR_CAP]
    # A platform's "not now" (429) is no failure of the call: it gives back the attempt
    # the claim counted, so a long rate limit delays a message, never drops it.
    retry_after = exc.retry_after_s if isinstance(exc, ChannelRateLimited) else None
    if retry_after is None and attempts >= delivery.max_attempts:
        log.warning("%s failed for good after %d attempts: %s", what, attempts, error)
        return FailedCall(error, None, False)
    delay = backoff_delay(attempts, delivery.retry_base_s, delivery.retry_max_s)
    if retry_after is not None:
        # The platform said when it takes calls again (429 Retry-After): not a moment early.
        delay = max(delay, retry_after)
    log.info("%s failed (attempt %d: %s); retrying in %.1fs", what, attempts, error, delay)
    return FailedCall(error, datetime.now(UTC) + timedelta(seconds=delay), retry_after is not None)
