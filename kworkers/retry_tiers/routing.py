"""Where a failed record goes next: a retry tier with a due time, or the DLQ. Never nowhere.

``route`` is the one decision the consumer loop makes after a handler raises; it is pure so
the whole schedule can be checked under a fake clock, and it returns a value the loop turns
into a produce (see ``headers.retry_headers`` / ``headers.dead_letter_headers``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kworkers.errors import ActivityFailure, causes, failure_type, is_non_retryable
from kworkers.retry_tiers.policy import JitterSource, RetryPolicy, backoff
from kworkers.retry_tiers.tiers import Tier, TierLadder

#: Error messages are cut to this many characters: a handler that puts a whole payload or
#: a stack trace in its exception must not make the retry record bigger than the original.
MAX_ERROR_MESSAGE = 1000

DeadLetterReason = Literal["non_retryable", "exhausted"]


@dataclass(frozen=True)
class RetryDecision:
    """Produce the record to ``tier.topic`` to run as ``next_attempt`` at ``due_at``."""

    next_attempt: int
    delay: float
    due_at: float
    tier: Tier
    error_type: str
    error_message: str


@dataclass(frozen=True)
class DeadLetterDecision:
    """Produce the record to the DLQ after ``attempts`` attempts."""

    attempts: int
    reason: DeadLetterReason
    error_type: str
    error_message: str


def is_retryable(policy: RetryPolicy, exc: BaseException) -> bool:
    """Whether a failure may be retried under ``policy``: the one answer routing and the
    circuit breaker share (bad input says nothing about a dependency, and must not burn the
    remaining attempts either). The policy matches the failure's *type*, never its message."""
    return not (is_non_retryable(exc)
                or failure_type(exc) in policy.normalized().non_retryable)


def _failure(exc: BaseException) -> tuple[str, str, bool]:
    """(type, message cut to ``MAX_ERROR_MESSAGE``, marked non-retryable): what
    ``failure_type``, ``failure_message`` and ``is_non_retryable`` say, in one walk of the
    chain (a failure storm routes every record)."""
    typed: ActivityFailure | None = None
    marked = False
    for cur in causes(exc):
        if isinstance(cur, ActivityFailure):
            if typed is None:
                typed = cur
            if cur.non_retryable:
                marked = True
                break
    if typed is None:
        return type(exc).__name__, str(exc)[:MAX_ERROR_MESSAGE], marked
    return typed.type, typed.message[:MAX_ERROR_MESSAGE], marked


def route(
    policy: RetryPolicy,
    ladder: TierLadder,
    topic: str,
    attempt: int,
    exc: BaseException,
    now: float,
    jitter: JitterSource,
) -> RetryDecision | DeadLetterDecision:
    """Decide the fate of a record whose ``attempt`` (1-based) raised ``exc`` at ``now``.

    ``topic`` is the original topic, so a record hopping between tiers stays on one ladder.
    Non-retryable failures are checked first: bad input must not burn the remaining attempts.
    The policy matches the failure's *type*, never its message.
    """
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    p = policy.normalized()
    error_type, error_message, marked = _failure(exc)
    if marked or error_type in p.non_retryable:
        return DeadLetterDecision(attempt, "non_retryable", error_type, error_message)
    if attempt >= p.max_attempts:
        return DeadLetterDecision(attempt, "exhausted", error_type, error_message)
    delay = jitter(backoff(p, attempt))
    return RetryDecision(
        next_attempt=attempt + 1,
        delay=delay,
        due_at=now + delay,
        tier=ladder.tier_for(topic, delay),
        error_type=error_type,
        error_message=error_message,
    )
