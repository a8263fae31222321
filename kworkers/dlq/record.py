"""A dead letter read back from the DLQ topic as a typed value, for listing and redrive."""

from __future__ import annotations

from dataclasses import dataclass

from kworkers.message import Headers, Message
from kworkers.retry_tiers.headers import (
    DEAD_LETTERED_AT,
    DLQ_REASON,
    ORIGINAL_TOPIC,
    HeaderError,
    dead_lettered_at_of,
    dlq_reason_of,
    failure_of,
)


@dataclass(frozen=True)
class DeadLetter:
    """One DLQ record: where it sits, where it came from, and why it died.

    ``headers`` are the DLQ record's headers as read, ours included, so nothing an operator
    might need is lost; ``redrive_headers`` decides what a replay carries.
    """

    dlq_topic: str
    dlq_partition: int
    dlq_offset: int
    original_topic: str
    original_partition: int
    original_offset: int
    key: bytes | None
    value: bytes | None
    attempts: int
    error_type: str
    error_message: str
    first_failure_at: float
    last_failure_at: float
    dead_lettered_at: float
    reason: str
    group: str
    headers: Headers

    def age(self, now: float) -> float:
        """Seconds since it was dead-lettered; 0, not negative, when clocks disagree."""
        return max(0.0, now - self.dead_lettered_at)

    @classmethod
    def from_message(cls, msg: Message) -> DeadLetter:
        """Parse a DLQ record; ``HeaderError`` when it was not written by kworkers' DLQ path."""
        info = failure_of(msg.headers)
        if info is None:
            raise HeaderError(ORIGINAL_TOPIC, "missing: not a kworkers dead letter")
        dead_lettered_at = dead_lettered_at_of(msg.headers)
        if dead_lettered_at is None:
            raise HeaderError(DEAD_LETTERED_AT, "missing")
        reason = dlq_reason_of(msg.headers)
        if not reason:
            raise HeaderError(DLQ_REASON, "missing")
        return cls(
            dlq_topic=msg.topic,
            dlq_partition=msg.partition,
            dlq_offset=msg.offset,
            original_topic=info.original_topic,
            original_partition=info.original_partition,
            original_offset=info.original_offset,
            key=msg.key,
            value=msg.value,
            attempts=info.attempt,
            error_type=info.error_type,
            error_message=info.error_message,
            first_failure_at=info.first_failure_at,
            last_failure_at=info.last_failure_at,
            dead_lettered_at=dead_lettered_at,
            reason=reason,
            group=info.group,
            headers=msg.headers,
        )
