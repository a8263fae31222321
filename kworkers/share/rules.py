"""The share-mode rules that follow from the group's settings: pure, so they are tested alone.

A share group lends a record to one member for ``share.record.lock.duration.ms`` (30 s by
default, at most 60 s unless the operator raises the broker's bound). An acknowledgement that
arrives after the lock expired is refused and the record goes to another member, so the work is
done twice. Renewing the lock (RENEW, KIP-1222) is what Kafka offers for long work; the broker
here (4.3.1) accepts it, but confluent-kafka 2.16.1 refuses the acknowledgement type (see
docs/SHARE_GROUPS.md). So the rules keep every record inside its lock instead:

- a handler's deadline (``message_timeout``) must leave room under the lock; past it the record
  is handed to a retry tier as a ``TimeoutError`` attempt (durable, then accepted), like any
  deadline in partitioned mode. Without a deadline set, share mode uses half the lock;
- a record may only *start* while its lock still leaves a whole deadline and a margin after it;
  a record that cannot start in time is released (another member, or this one, takes it fresh);
- the broker archives a record once it was delivered ``share.delivery.count.limit`` times, with
  no trace. Deliveries are counted on acquisition, crashes included, so a record near the limit
  goes to the DLQ without running. The dead letter needs a delivery of its own, and the member
  can die while writing it (a few milliseconds, but kills land anywhere), so the last *two*
  deliveries are kept for it: a death during the first dead-letter write leaves one more
  delivery to write it again. Only at the minimum limit (2) is there nothing to spare; then the
  last delivery alone is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kworkers.errors import ConfigError, NonRetryableError
from kworkers.share.ports import GroupSettings

#: share mode's deadline when none is set: this share of the lock
DEFAULT_DEADLINE_SHARE = 0.5
#: a record must finish this long before its lock expires (the acknowledgement travels too)
MIN_MARGIN_S = 1.0
MARGIN_SHARE = 0.1
#: a lane is fed about this much handler time at once (measured), so records handed to a lane
#: together start close to when they were handed over
CHUNK_S = 0.2
MAX_CHUNK = 500


class DeliveryLimitReached(NonRetryableError):
    """A record near the delivery limit, where the broker would soon archive it silently."""

    def __init__(self, deliveries: int, limit: int) -> None:
        super().__init__(
            "DeliveryLimitReached",
            f"delivery {deliveries} of the share group's limit {limit} "
            "(share.delivery.count.limit): earlier deliveries ended without an acknowledgement "
            "(a crash, a stop, a lost connection or an expired lock); dead-lettered instead of "
            "risking its last deliveries, after which the broker archives it")
        self.deliveries = deliveries
        self.limit = limit


@dataclass(frozen=True)
class ShareRules:
    lock_s: float
    delivery_limit: int
    #: the handler deadline share mode runs with (the config's, or its default)
    deadline_s: float
    margin_s: float

    @classmethod
    def of(cls, group: GroupSettings, message_timeout: float | None) -> ShareRules:
        lock = group.lock_s
        margin = max(MIN_MARGIN_S, MARGIN_SHARE * lock)
        deadline = lock * DEFAULT_DEADLINE_SHARE if message_timeout is None else message_timeout
        if deadline + margin + CHUNK_S >= lock:
            raise ConfigError(
                f"message_timeout: {deadline:g}s leaves no room under the share group's "
                f"acquisition lock ({lock:g}s, share.record.lock.duration.ms) with a "
                f"{margin:g}s margin; set it below {lock - margin - CHUNK_S:g}s or raise the "
                "group's lock duration (confluent-kafka 2.16 cannot renew a lock)")
        if group.delivery_limit < 2:
            raise ConfigError(f"share.delivery.count.limit: {group.delivery_limit} leaves no "
                              "redelivery at all (Kafka's minimum is 2)")
        return cls(lock, group.delivery_limit, deadline, margin)

    def latest_start(self, acquired_at: float) -> float:
        """The last moment a record acquired at ``acquired_at`` may start its handler."""
        return acquired_at + self.lock_s - self.deadline_s - self.margin_s

    def latest_finish(self, acquired_at: float) -> float:
        """Past this a running handler loses its record to the deadline (a heartbeat cannot
        extend a lock the client cannot renew)."""
        return acquired_at + self.lock_s - self.margin_s

    @property
    def dead_letter_from(self) -> int:
        """The first delivery that goes to the DLQ unrun: the limit minus one spare delivery
        for a dead-letter write cut short (none to spare at the minimum limit, 2)."""
        return self.delivery_limit - 1 if self.delivery_limit >= 3 else self.delivery_limit

    def is_last_delivery(self, deliveries: int) -> bool:
        return deliveries >= self.dead_letter_from

    def last_delivery(self, deliveries: int) -> DeliveryLimitReached:
        return DeliveryLimitReached(deliveries, self.delivery_limit)

    @staticmethod
    def chunk(mean_s: float | None, backlog: int, idle_lanes: int) -> int:
        """How many records to hand an idle lane at once: one while the handler's time is
        unknown; about ``CHUNK_S`` of handler time once measured; never more than an even
        share of the backlog, so every idle lane gets work."""
        if idle_lanes <= 0 or backlog <= 0:
            return 0
        even = math.ceil(backlog / idle_lanes)
        if mean_s is None:
            return 1
        fits = MAX_CHUNK if mean_s <= 0 else max(1, int(CHUNK_S / mean_s))
        return max(1, min(even, fits, MAX_CHUNK))
