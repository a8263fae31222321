"""The exceptions kworkers raises and the ones handlers raise to steer a failure.

Why a tree: a handler states *what kind* of failure happened; kworkers decides where the record
goes (retry tier or DLQ). Everything a user may catch derives from ``KworkersError``::

    KworkersError
    ├── ConfigError            bad settings or arguments; raised before anything is consumed
    ├── HandOffError           a retry/DLQ produce was not acknowledged; the source is not committed
    ├── FencedError            a result, heartbeat or completion for a partition no longer owned
    ├── DecodeError            a record that cannot be decoded (non-retryable by nature)
    ├── WorkerFailed           a worker stopped because a part of it failed (see ``fault``)
    ├── BatchError             raised by batch handlers: which records of the batch failed
    └── ActivityFailure        raised by handlers to type a failure
        ├── RetryableError     retry with backoff (the default for any other exception)
        │   ├── LeaseBusy      the record's key is another live attempt's: wait, no attempt spent
        │   └── AttemptCrashed the attempt before never finished (its lease ran out): counted
        └── NonRetryableError  goes to the DLQ after this attempt

Failure types survive ``raise X from err`` and wrapping: ``failure_type`` and
``is_non_retryable`` walk ``__cause__``/``__context__`` and exception groups.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kworkers.message import Message


class KworkersError(Exception):
    """Base of every exception kworkers raises on purpose."""


class ConfigError(KworkersError, ValueError):
    """A setting or argument that cannot work; reported before any record is touched."""


class HandOffError(KworkersError):
    """A record could not be handed to a retry tier or the DLQ; its source stays uncommitted."""


class FencedError(KworkersError):
    """Work for a partition this worker no longer owns (or owns under a newer assignment)."""


class TransactionAborted(KworkersError):
    """A Kafka transaction was aborted: nothing of it is visible to read_committed readers,
    so running it again is safe. ``fenced``: the broker refused it because this member or
    producer is no longer the owner (a stale group generation, another producer's epoch)."""

    def __init__(self, message: str, *, fenced: bool = False) -> None:
        super().__init__(message)
        self.fenced = fenced


class TransactionFailed(KworkersError):
    """A Kafka transaction cannot go on (fenced by another producer with the same id, timed
    out, or refused for good): whether it committed is unknown until its transactional id is
    taken over and the group's committed offsets are read; ``str()`` says why, ``fenced``
    whether it was a fence."""

    def __init__(self, message: str, *, fenced: bool = False) -> None:
        super().__init__(message)
        self.fenced = fenced


class WorkerFailed(KworkersError):
    """A thread or a lane of the worker failed: it stopped (committing only finished work) so
    that a restart moves its partitions to a member that works."""


class BatchError(KworkersError):
    """Raised by a batch handler when only some records failed: those named in ``failures``
    (record → its exception, which the retry policy judges as for a single record) go to the
    tiers or the DLQ; every other record of the batch counts as handled. Any other exception
    from a batch handler fails every record of the batch."""

    def __init__(self, failures: Mapping[Message, BaseException], message: str = "") -> None:
        super().__init__(message or f"{len(failures)} records of the batch failed")
        self.failures = dict(failures)


class ActivityFailure(KworkersError):
    """A typed handler failure; ``type`` is what a retry policy's ``non_retryable`` names."""

    non_retryable: bool = False

    def __init__(self, type: str, message: str = "") -> None:
        super().__init__(f"{type}: {message}" if message else type)
        self.type = type
        self.message = message


class RetryableError(ActivityFailure):
    """Try again later, after the policy's backoff."""


class LeaseBusy(RetryableError):
    """Another attempt holds the record's key (an idempotency store's lease, or another
    attempt of this process), until ``until`` (epoch seconds, as the store said). Not a
    failure of the record: a runner waits for the lease's end and runs the record again,
    spending no attempt (``Runner.steps``). Where nothing can wait (an inline handler on the
    poll thread) it is retried like any retryable failure."""

    def __init__(self, key: str, until: float, message: str) -> None:
        super().__init__("LeaseBusy", message)
        self.key = key
        self.until = until


class AttemptCrashed(RetryableError):
    """The attempt before this one never finished: its lease ran out unreleased, with no
    heartbeat, so its worker died or hung holding the record (seed 000: a lease that expires is
    a failed attempt). The record does not run in this attempt: it is routed like any failed
    attempt, so it is retried after the policy's backoff, and past ``max_attempts`` dead-lettered
    with this type and the attempts made. Its last heartbeat details stay with the key."""

    def __init__(self, message: str) -> None:
        super().__init__("AttemptCrashed", message)


class NonRetryableError(ActivityFailure):
    """Retrying cannot help (bad input, a broken invariant): dead-letter after this attempt."""

    non_retryable = True


class DecodeError(NonRetryableError):
    """The record's bytes are not what the handler's decoder expects."""

    def __init__(self, message: str, type: str = "DecodeError") -> None:
        super().__init__(type, message)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """Every exception reachable from ``exc`` through causes, contexts and groups, once each."""
    seen: set[int] = set()
    stack = [exc]
    while stack:
        cur = stack.pop(0)
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        yield cur
        if isinstance(cur, BaseExceptionGroup):
            stack.extend(cur.exceptions)
        if cur.__cause__ is not None:
            stack.append(cur.__cause__)
        if cur.__context__ is not None and not cur.__suppress_context__:
            stack.append(cur.__context__)


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception behind it (causes, contexts, groups), outermost first."""
    return _chain(exc)


def find_failure(exc: BaseException) -> ActivityFailure | None:
    """The first typed failure in ``exc``'s chain, outermost first."""
    for cur in _chain(exc):
        if isinstance(cur, ActivityFailure):
            return cur
    return None


def is_non_retryable(exc: BaseException) -> bool:
    """True when any typed failure in the chain is marked non-retryable."""
    return any(isinstance(c, ActivityFailure) and c.non_retryable for c in _chain(exc))


def failure_type(exc: BaseException) -> str:
    """The type a policy matches: the typed failure's ``type``, else the class name."""
    typed = find_failure(exc)
    return typed.type if typed is not None else type(exc).__name__


def failure_message(exc: BaseException) -> str:
    typed = find_failure(exc)
    if typed is not None:
        return typed.message
    return str(exc)


#: where a failed attempt's last heartbeat details travel with its exception to the hand-off
_CHECKPOINT = "__kworkers_checkpoint__"


def keep_checkpoint(exc: BaseException, details: bytes) -> None:
    """Marks ``exc`` with the last heartbeat details of the attempt that raised it: the
    hand-off writes them on the retry record, so the next attempt resumes from them with or
    without an idempotency store (``activity.heartbeat_details``)."""
    setattr(exc, _CHECKPOINT, details)


def checkpoint_of(exc: BaseException) -> bytes | None:
    """The details ``keep_checkpoint`` put on ``exc``, if any."""
    got = getattr(exc, _CHECKPOINT, None)
    return got if isinstance(got, bytes) else None
