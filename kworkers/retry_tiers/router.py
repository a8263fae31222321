"""Turns a failed attempt into a hand-off: which topic, with which headers.

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
    failure_of,
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
from kworkers.retry_tiers.tiers import TierLadder, source_topic_of


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
    def __init__(self, policy: RetryPolicy, ladder: TierLadder, group: str,
                 jitter: JitterSource, clock: Clock) -> None:
        self.policy = policy.normalized()
        self.ladder = ladder
        self.group = group
        self.jitter = jitter
        self.clock = clock

    def source_topic(self, msg: Message) -> str:
        try:
            info = failure_of(msg.headers)
        except HeaderError:
            info = None
        return info.original_topic if info is not None else source_topic_of(msg.topic)

    def plan(self, msg: Message, exc: BaseException) -> HandOff:
        now = self.clock.now()
        source = self.source_topic(msg)
        decision = route(self.policy, self.ladder, source, msg.attempt, exc, now, self.jitter)
        try:
            return self._hand_off(msg, decision, source, now)
        except HeaderError as bad:
            # The record's own kworkers headers are corrupt: it cannot be retried faithfully.
            dead = DeadLetterDecision(msg.attempt, "non_retryable", failure_type(bad),
                                      failure_message(bad)[:MAX_ERROR_MESSAGE])
            clean = msg._replace(headers=user_headers(msg.headers))
            return self._hand_off(clean, dead, source, now)

    def dead_letter(self, msg: Message, exc: BaseException) -> HandOff:
        """Straight to the DLQ of the topic ``msg`` was consumed from, whatever the policy says:
        for a record that cannot be routed, or whose tier refused the hand-off for good.

        The destination derives from the consumed topic's name alone (never from headers), so
        a record with forged or corrupt headers still lands in its own pipeline's DLQ.
        """
        now = self.clock.now()
        source = source_topic_of(msg.topic)
        dead = DeadLetterDecision(msg.attempt, "non_retryable", failure_type(exc),
                                  failure_message(exc)[:MAX_ERROR_MESSAGE])
        try:
            return self._hand_off(msg, dead, source, now)
        except HeaderError:
            clean = msg._replace(headers=user_headers(msg.headers))
            return self._hand_off(clean, dead, source, now)

    def _hand_off(self, msg: Message, decision: RetryDecision | DeadLetterDecision,
                  source: str, now: float) -> HandOff:
        if isinstance(decision, RetryDecision):
            return HandOff("retry", decision.tier.topic, msg.key, msg.value,
                           retry_headers(msg, self.group, decision, now), decision,
                           decision.tier.label)
        return HandOff("dlq", self.ladder.dlq_topic(source), msg.key, msg.value,
                       dead_letter_headers(msg, self.group, decision, now), decision,
                       decision.error_type)
