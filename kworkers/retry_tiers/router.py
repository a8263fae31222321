"""Turns a failed attempt into a hand-off: which topic, with which headers.

The topic follows from configuration only: the topic the record was read from, mapped through
the worker's tier ladder, picks the ladder and the DLQ (record headers are data from outside).

Pure: the decision (``route``) and the failure record (headers) are computed here, once per
failed record; sending is the caller's, through a ``Sender`` that reports the broker's
acknowledgement. The source offset is completed only after that acknowledgement. The caller
knows the hand-off's ``Destination`` (``destinations``) by what it means, never by name: a
destination a user adds is a ``Route`` registered here (``routes``), consulted before the policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from kworkers.clock import Clock
from kworkers.errors import checkpoint_of, failure_message, failure_type
from kworkers.memory import header_bytes, message_bytes
from kworkers.message import Headers, Message
from kworkers.retry_tiers.destinations import DLQ, RETRY, Destination, Route
from kworkers.retry_tiers.headers import (
    CHECKPOINT,
    FailureHeaders,
    Origin,
    is_own,
    last_value,
    user_headers,
)
from kworkers.retry_tiers.policy import JitterSource, RetryPolicy
from kworkers.retry_tiers.routing import (
    MAX_ERROR_MESSAGE,
    DeadLetterDecision,
    RetryDecision,
    Rung,
    decide,
    failure_facts,
    rung,
)
from kworkers.retry_tiers.tier_record import CorruptTierRecord
from kworkers.retry_tiers.tiers import TierLadder
from kworkers.topic_names import is_tier_topic, source_topic_of


class Origins(Protocol):
    """Where a record's work began, as the worker recorded it (``record_key.RecordKeys``)."""

    def recorded(self, msg: Message) -> Origin | None: ...


#: distinct failures a router keeps the record-independent part of before it starts over
PLAN_MEMO = 256


class HandOff(NamedTuple):
    """Where one failed attempt goes, with which headers (a ``NamedTuple``: one per failed
    record, see ``routing.RetryDecision``)."""

    destination: Destination  # what the engine asks: the label, retried or dead, fallback
    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers
    decision: RetryDecision | DeadLetterDecision
    label: str  # the tier label, or the error type for any other destination (metrics)
    #: what the producer holds of it until acknowledged: ``memory.message_bytes`` of its key,
    #: value and headers (the hand-off step's byte bound)
    size: int


class FailureRouter:
    """Where a failed record goes, decided by the topic it was read from and this worker's
    configuration alone.

    A record's own kw-* headers never choose its destination: a source record's are ignored
    (``headers.origin_of``); a tier record's were checked once, by the tier gate, when it was
    read (``tier_record.check_tier_record``): one refused there arrives as a
    ``CorruptTierRecord`` failure and goes to its own source's DLQ with the reason, its kw-*
    headers dropped, instead of being retried.

    ``routes``: the destinations a user adds (``destinations.Route``), asked in order before
    the retry policy; the first naming a topic takes the failure, with dead-letter headers.
    """

    def __init__(self, policy: RetryPolicy, ladder: TierLadder, group: str,
                 jitter: JitterSource, clock: Clock, keys: Origins | None = None,
                 routes: Sequence[Route] = ()) -> None:
        self.policy = policy.normalized()
        self.ladder = ladder
        self.group = group
        self.jitter = jitter
        self.clock = clock
        #: where work began (``kworkers.record_key``): the origin the hand-off records, so the
        #: key of a record without ids stays the same in the tiers and the DLQ
        self.keys = keys
        self.routes = tuple(routes)
        #: (attempt, error type, message, marked) -> the rung and its headers, encoded once:
        #: in a storm thousands of records fail alike (bounded: a handler may put a record's
        #: own data in its messages)
        self._memo: dict[tuple[int, str, str, bool], tuple[Rung, FailureHeaders]] = {}

    def source_topic(self, msg: Message) -> str:
        """The source whose tiers and DLQ ``msg`` may go to: from the topic it was read from,
        through the ladder (``ConfigError`` for a topic not on it)."""
        return self.ladder.source_of(msg.topic)

    def plan(self, msg: Message, exc: BaseException) -> HandOff:
        if isinstance(exc, CorruptTierRecord):  # the gate's verdict: no faithful retry
            return self.dead_letter(msg._replace(headers=user_headers(msg.headers)), exc)
        now = self.clock.now()
        source = self.source_topic(msg)  # the one way (a hostile-records canary replaces it)
        error_type, error_message, marked = failure_facts(exc)
        if self.routes:
            routed = self._routed(msg, exc, source, now, error_type, error_message)
            if routed is not None:
                return routed
        step, headers = self._rung(msg.attempt, error_type, error_message, marked)
        decision = decide(step, self.ladder, source, now, self.jitter)
        return self._hand_off(msg, decision, headers, source, now, _checkpoint(msg, exc),
                              failure_headers(exc))

    def _routed(self, msg: Message, exc: BaseException, source: str, now: float,
                error_type: str, error_message: str) -> HandOff | None:
        """The first registered route taking the failure: there, as a dead letter whose reason
        is the destination's label."""
        for route in self.routes:
            topic = route.topic_for(msg, exc, source)
            if topic is not None:
                where = route.destination
                dead = DeadLetterDecision(msg.attempt, "non_retryable", error_type,
                                          error_message)
                headers = FailureHeaders(self.group, msg.attempt, error_type, error_message)
                return _dead(where, topic, msg,
                             headers.dead(msg, now, where.label, self._origin(msg))
                             + failure_headers(exc), dead, error_type)
        return None

    def _rung(self, attempt: int, error_type: str, error_message: str,
              marked: bool) -> tuple[Rung, FailureHeaders]:
        key = (attempt, error_type, error_message, marked)
        got = self._memo.get(key)
        if got is None:
            step = rung(self.policy, attempt, error_type, error_message, marked)
            got = (step, FailureHeaders(self.group, step.next_attempt, error_type,
                                        error_message))
            if len(self._memo) >= PLAN_MEMO:
                self._memo.clear()
            self._memo[key] = got
        return got

    def dead_letter(self, msg: Message, exc: BaseException) -> HandOff:
        """Straight to the DLQ of the topic ``msg`` was consumed from, whatever the policy says:
        for a record that cannot be routed, or whose tier refused the hand-off for good.

        The destination derives from the consumed topic's name alone (never from headers), so
        a record with forged or corrupt headers still lands in its own pipeline's DLQ; this
        never raises for a topic a worker can consume.
        """
        now = self.clock.now()
        dead = DeadLetterDecision(msg.attempt, "non_retryable", failure_type(exc),
                                  failure_message(exc)[:MAX_ERROR_MESSAGE])
        headers = FailureHeaders(self.group, dead.attempts, dead.error_type, dead.error_message)
        return self._hand_off(msg, dead, headers, source_topic_of(msg.topic), now,
                              extra=failure_headers(exc))

    def _origin(self, msg: Message) -> Origin | None:
        return None if self.keys is None else self.keys.recorded(msg)

    def _hand_off(self, msg: Message, decision: RetryDecision | DeadLetterDecision,
                  headers: FailureHeaders, source: str, now: float,
                  checkpoint: bytes | None = None, extra: Headers = ()) -> HandOff:
        origin = self._origin(msg)
        if isinstance(decision, RetryDecision):
            own, size = headers.retry(msg, now, decision.due_at, origin, checkpoint)
            key, value = msg.key, msg.value
            if key:
                size += len(key)
            if value:
                size += len(value)
            if extra:
                own += extra
                size += header_bytes(extra)
            return HandOff(RETRY, decision.tier.topic, key, value, own, decision,
                           decision.tier.label, size)
        return _dead(DLQ, self.ladder.dlq_topic(source), msg,
                     headers.dead(msg, now, decision.reason, origin) + extra, decision,
                     decision.error_type)


def _dead(where: Destination, topic: str, msg: Message, headers: Headers,
          decision: DeadLetterDecision, label: str) -> HandOff:
    """A hand-off as a dead letter (sized by walking its headers: a retry's are sized as they
    are built, ``FailureHeaders.retry``)."""
    return HandOff(where, topic, msg.key, msg.value, headers, decision, label,
                   message_bytes(msg.key, msg.value, headers))


def failure_headers(exc: BaseException) -> Headers:
    """Headers a failure adds of its own (``failure_headers`` on the exception: a payload that
    could not be decoded names its schema id, ``kw-schema-id``); only kworkers' own names,
    so a later hop or a redrive strips them."""
    got = getattr(exc, "failure_headers", ())
    return tuple((k, v) for k, v in got if is_own(k) and isinstance(v, bytes)) if got else ()


def _checkpoint(msg: Message, exc: BaseException) -> bytes | None:
    """The failed attempt's last heartbeat details (``errors.keep_checkpoint``), else those the
    retry record it ran carried (an attempt that did not heartbeat keeps the earlier ones)."""
    got = checkpoint_of(exc)
    if got is None and msg.headers and is_tier_topic(msg.topic):
        got = last_value(msg.headers, CHECKPOINT)
    return got
