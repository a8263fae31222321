"""Where a failed record goes next: a retry tier with a due time, or the DLQ. Never nowhere.

``route`` is the one decision the consumer loop makes after a handler raises; it is pure so
the whole schedule can be checked under a fake clock, and it returns a value the loop turns
into a produce (see ``headers.retry_headers`` / ``headers.dead_letter_headers``).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from kworkers.errors import ActivityFailure, causes, failure_type, is_non_retryable
from kworkers.retry_tiers.policy import JitterSource, RetryPolicy, backoff
from kworkers.retry_tiers.tiers import Tier, TierLadder

#: Error messages are cut to this many characters: a handler that puts a whole payload or
#: a stack trace in its exception must not make the retry record bigger than the original.
MAX_ERROR_MESSAGE = 1000

DeadLetterReason = Literal["non_retryable", "exhausted"]


class RetryDecision(NamedTuple):
    """Produce the record to ``tier.topic`` to run as ``next_attempt`` at ``due_at``.

    A ``NamedTuple`` rather than a frozen dataclass, like ``Message``: one is built for every
    failed record, and in a failure storm a frozen dataclass's ``__init__`` (one
    ``object.__setattr__`` per field) was a tenth of the failure path's CPU."""

    next_attempt: int
    delay: float
    due_at: float
    tier: Tier
    error_type: str
    error_message: str


class DeadLetterDecision(NamedTuple):
    """Produce the record to the DLQ after ``attempts`` attempts (a ``NamedTuple``: see
    ``RetryDecision``)."""

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


def failure_facts(exc: BaseException) -> tuple[str, str, bool]:
    """(type, message cut to ``MAX_ERROR_MESSAGE``, marked non-retryable): what
    ``failure_type``, ``failure_message`` and ``is_non_retryable`` say, in one walk of the
    chain (a failure storm routes every record)."""
    if (exc.__cause__ is None and exc.__context__ is None
            and not isinstance(exc, (ActivityFailure, BaseExceptionGroup))):
        return type(exc).__name__, str(exc)[:MAX_ERROR_MESSAGE], False  # a chain of one
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


class Rung(NamedTuple):
    """What ``route`` decides before the draw of jitter: the DLQ (``dead``), or a retry as
    ``next_attempt`` after a backoff of ``backoff_s`` (jittered per record). It depends only on
    the policy, the attempt and the failure's facts, so a caller routing many records that
    failed alike (a storm) may keep it (``FailureRouter``)."""

    dead: DeadLetterDecision | None
    next_attempt: int
    backoff_s: float
    error_type: str
    error_message: str


def rung(policy: RetryPolicy, attempt: int, error_type: str, error_message: str,
         marked: bool) -> Rung:
    """The record-independent half of ``route`` (``policy`` already normalized).
    Non-retryable failures are checked first: bad input must not burn the remaining attempts.
    The policy matches the failure's *type*, never its message."""
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    if marked or error_type in policy.non_retryable:
        return Rung(DeadLetterDecision(attempt, "non_retryable", error_type, error_message),
                    attempt, 0.0, error_type, error_message)
    if attempt >= policy.max_attempts:
        return Rung(DeadLetterDecision(attempt, "exhausted", error_type, error_message),
                    attempt, 0.0, error_type, error_message)
    return Rung(None, attempt + 1, backoff(policy, attempt), error_type, error_message)


def decide(step: Rung, ladder: TierLadder, topic: str, now: float,
           jitter: JitterSource) -> RetryDecision | DeadLetterDecision:
    """The record's own half of ``route``: the jittered delay, its tier and due time."""
    if step.dead is not None:
        return step.dead
    delay = jitter(step.backoff_s)
    return RetryDecision(step.next_attempt, delay, now + delay, ladder.tier_for(topic, delay),
                         step.error_type, step.error_message)


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
    The policy matches the failure's *type*, never its message. (``rung`` then ``decide``:
    the same two steps a caller that keeps rungs takes.)
    """
    return decide(rung(policy.normalized(), attempt, *failure_facts(exc)), ladder, topic, now,
                  jitter)
