"""What a record read from a retry tier must be before it runs: its headers checked, not believed.

Anyone who can write to a tier topic can write any ``kw-*`` header, and a record's headers
decide when it runs, as which attempt and (in the DLQ) where an operator's redrive sends it.
So every tier record is checked against the worker's own configuration (``TierRules``), in
one pure function the tier gate and the router share:

- every kworkers header parses, within its bounds (``headers``: int64, epoch-millisecond times,
  values of at most ``MAX_HEADER_VALUE`` bytes);
- ``kw-group`` names this worker's group; another group's retry is not ours (``None``: the
  gate skips it, never running or dead-lettering it: that group runs it, or dead-letters it
  if it is corrupt; this check comes first so a record is judged by one group only);
- ``kw-original-topic`` is the source of the tier topic the record was read from;
- the attempt lies in ``[2, max_attempts]``: a retry record runs as attempt 2 or later, and
  never beyond what the policy would ever schedule;
- the due time is at most ``max_ahead`` away (the longest wait the ladder and policy can
  give, plus slack) and not older than ``max_age``; failure times and the original record's
  timestamp are not more than ``max_skew`` ahead of this worker's clock.

Anything else raises ``HeaderError`` naming the header and the reason; the record goes to its
own source's DLQ (derived from the topic it was read from) with that reason.

The check runs once, in the tier gate, when the record is read. Its verdict travels with the
record: an admitted one carries the attempt it parsed, a refused one becomes a
``CorruptTierRecord`` failure, which the router dead-letters as it is, without checking again.
"""

from __future__ import annotations

from dataclasses import dataclass

from kworkers.errors import DecodeError, failure_message, failure_type
from kworkers.message import Message
from kworkers.retry_tiers.headers import (
    DUE_AT,
    FIRST_FAILURE_AT,
    GROUP,
    LAST_FAILURE_AT,
    ORIGINAL_TIMESTAMP,
    ORIGINAL_TOPIC,
    FailureInfo,
    HeaderError,
    check_due,
    failure_of,
    last_value,
    text_of,
)
from kworkers.retry_tiers.policy import RetryPolicy
from kworkers.retry_tiers.tiers import TierLadder

#: how far ahead of this worker's clock another worker's may run (Kafka's own default for
#: ``message.timestamp.after.max.ms`` is one hour too)
MAX_CLOCK_SKEW_S = 3600.0
#: added to the longest wait a due time can legitimately be ahead (clock skew, rounding)
DUE_SLACK_S = 60.0
#: a tier record whose failure is older than this is not one of ours (tier topics keep days)
MAX_AGE_S = 365 * 86_400.0


class CorruptTierRecord(DecodeError):
    """The tier gate's verdict on a record whose kworkers headers are corrupt or forged (or
    whose check failed in a way nobody foresaw): it goes to its own source's DLQ with the
    reason, its kw-* headers dropped. Only the gate makes one."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(failure_message(cause), type=failure_type(cause))
        self.__cause__ = cause


@dataclass(frozen=True)
class TierRules:
    """The worker's configuration, as far as its tier records are concerned."""

    group: str
    ladder: TierLadder
    max_attempts: int
    #: the furthest a due time may be ahead of now
    max_ahead: float
    max_skew: float = MAX_CLOCK_SKEW_S
    max_age: float = MAX_AGE_S

    def check(self, msg: Message, now: float) -> FailureInfo | None:
        """The tier gate's check (``RecordCheck``): ``check_tier_record`` under these rules."""
        return check_tier_record(msg, self, now)

    @classmethod
    def of(cls, policy: RetryPolicy, ladder: TierLadder, group: str) -> TierRules:
        """Rules for a worker: a retry waits at most the policy's ``max_interval`` (the
        jittered delay never exceeds it), and at least the tier it sits in."""
        p = policy.normalized()
        return cls(group, ladder, p.max_attempts,
                   max(max(ladder.delays), p.max_interval) + DUE_SLACK_S)


def _not_ahead(name: str, t: float | None, now: float, skew: float) -> None:
    if t is not None and t - now > skew:
        raise HeaderError(name, f"{t - now:.0f} s ahead of this worker's clock, more than the "
                          f"{skew:g} s of clock skew allowed", str(round(t * 1000)).encode())


def _not_older(name: str, t: float, now: float, age: float) -> None:
    if now - t > age:
        raise HeaderError(name, f"{now - t:.0f} s in the past, more than the {age:g} s a retry "
                          "may wait", str(round(t * 1000)).encode())


def check_tier_record(msg: Message, rules: TierRules, now: float) -> FailureInfo | None:
    """The failure ``msg`` (read from one of the worker's tier topics) carries, checked;
    None when it is another group's retry. ``HeaderError`` when corrupt or forged;
    ``ConfigError`` when ``msg.topic`` is not one of this ladder's tier topics."""
    source = rules.ladder.source_of(msg.topic)
    if source == msg.topic:
        raise HeaderError(ORIGINAL_TOPIC, f"{msg.topic!r} is a source topic, not a retry tier")
    group = text_of(msg.headers, GROUP)
    if group is None:
        raise HeaderError(GROUP, "missing on a retry tier record")
    if group != rules.group:
        return None  # first: another group's record is that group's to judge, corrupt or not
    info = failure_of(msg.headers)
    if info is None:
        raise HeaderError(ORIGINAL_TOPIC, "missing on a retry tier record")
    if info.original_topic != source:
        raise HeaderError(ORIGINAL_TOPIC, f"names another topic than {source!r}, the source "
                          f"of {msg.topic!r}", last_value(msg.headers, ORIGINAL_TOPIC))
    if not 2 <= info.attempt <= rules.max_attempts:
        raise HeaderError("kw-attempt", f"a retry runs as attempt 2 to {rules.max_attempts} "
                          "(the policy's maximum)", str(info.attempt).encode())
    if info.due_at is None:
        raise HeaderError(DUE_AT, "missing on a retry tier record")
    check_due(info.due_at, now, rules.max_ahead)
    _not_older(DUE_AT, info.due_at, now, rules.max_age)
    for name, t in ((FIRST_FAILURE_AT, info.first_failure_at),
                    (LAST_FAILURE_AT, info.last_failure_at)):
        _not_ahead(name, t, now, rules.max_skew)
        _not_older(name, t, now, rules.max_age)
    ts = info.original_timestamp_ms
    _not_ahead(ORIGINAL_TIMESTAMP, None if ts is None else ts / 1000, now, rules.max_skew)
    return info

