"""Turns a failed attempt into a hand-off: which topic, with which headers.

The topic follows from configuration only: the topic the record was read from, mapped through
the worker's tier ladder, picks the ladder and the DLQ (record headers are data from outside).

Pure: the decision (``route``) and the failure record (headers) are computed here; sending is
the caller's, through a ``Sender`` whose future resolves on the broker's acknowledgement. The
source offset is completed only after that acknowledgement.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Literal, Protocol

from kworkers.clock import Clock
from kworkers.errors import failure_message, failure_type
from kworkers.message import Headers, Message
from kworkers.retry_tiers.headers import (
    HeaderError,
    dead_letter_headers,
    retry_headers,
    user_headers,
)
from kworkers.retry_tiers.policy import JitterSource, RetryPolicy
from kworkers.retry_tiers.routing import (
    MAX_ERROR_MESSAGE,
    DeadLetterDecision,
    RetryDecision,
    route,
)
from kworkers.retry_tiers.tier_record import TierRules, check_tier_record
from kworkers.retry_tiers.tiers import TierLadder
from kworkers.topic_names import is_tier_topic, source_topic_of


class Sender(Protocol):
    """Produces one record; the future resolves when the broker acknowledged it."""

    def send(self, topic: str, key: bytes | None, value: bytes | None,
             headers: Headers) -> Future[None]: ...


@dataclass(frozen=True)
class HandOff:
    destination: Literal["retry", "dlq"]
    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers
    decision: RetryDecision | DeadLetterDecision
    label: str  # the tier label, or the error type for the DLQ (metrics)


class FailureRouter:
    """Where a failed record goes, decided by the topic it was read from and this worker's
    configuration alone.

    A record's own kw-* headers never choose its destination: a source record's are ignored
    (``headers._origin``), a tier record's are checked against ``rules``
    (``tier_record.check_tier_record``) and, when corrupt or forged, the record goes to its own
    source's DLQ with the reason instead of being retried.
    """

    def __init__(self, policy: RetryPolicy, ladder: TierLadder, group: str,
                 jitter: JitterSource, clock: Clock) -> None:
        self.policy = policy.normalized()
        self.ladder = ladder
        self.group = group
        self.jitter = jitter
        self.clock = clock
        #: what this worker's tier records must satisfy (the tier gate checks the same)
        self.rules = TierRules.of(self.policy, ladder, group)

    def source_topic(self, msg: Message) -> str:
        """The source whose tiers and DLQ ``msg`` may go to: from the topic it was read from,
        through the ladder (``ConfigError`` for a topic not on it)."""
        return self.ladder.source_of(msg.topic)

    def plan(self, msg: Message, exc: BaseException) -> HandOff:
        now = self.clock.now()
        source = self.source_topic(msg)
        if is_tier_topic(msg.topic):
            try:
                check_tier_record(msg, self.rules, now)
            except HeaderError as bad:
                # Corrupt or forged kworkers headers: it cannot be retried faithfully.
                return self.dead_letter(msg._replace(headers=user_headers(msg.headers)), bad)
        decision = route(self.policy, self.ladder, source, msg.attempt, exc, now, self.jitter)
        return self._hand_off(msg, decision, source, now)

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
        return self._hand_off(msg, dead, source_topic_of(msg.topic), now)

    def _hand_off(self, msg: Message, decision: RetryDecision | DeadLetterDecision,
                  source: str, now: float) -> HandOff:
        if isinstance(decision, RetryDecision):
            return HandOff("retry", decision.tier.topic, msg.key, msg.value,
                           retry_headers(msg, self.group, decision, now), decision,
                           decision.tier.label)
        return HandOff("dlq", self.ladder.dlq_topic(source), msg.key, msg.value,
                       dead_letter_headers(msg, self.group, decision, now), decision,
                       decision.error_type)
