"""What a record read from a rung must be before the scheduler holds or moves it.

The tier record rules (``retry_tiers.tier_record``) refuse a due time beyond the longest tier
plus 60 s, so scheduled records, due up to a year ahead, have rules of their own, in the same
spirit: a rung record's headers are checked, not believed (anyone who can write to a rung can
write any header). The destination is never read from a header: it is the configured one whose
rung the record was read from. A record that fails raises ``HeaderError`` naming the header and
the reason; the gate dead-letters it to ``<rung>.dlq`` with that reason (nothing is lost).

- ``kw-scheduled-id``, ``kw-scheduled-due-at``, ``kw-scheduled-at`` and ``kw-due-at`` parse;
- the due time is at most ``ladder.max_ahead`` (plus slack) ahead;
- the release time is not after the due time, and at most the rung's window (plus slack)
  ahead: a forged release far ahead would hold a heap slot for good;
- the scheduling time is not more than the allowed clock skew ahead of this worker's clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kworkers.message import Message
from kworkers.retry_tiers.headers import DUE_AT, ORIGINAL_TOPIC, HeaderError
from kworkers.retry_tiers.tier_record import DUE_SLACK_S, MAX_CLOCK_SKEW_S
from kworkers.schedule.headers import SCHEDULED_AT, SCHEDULED_DUE_AT, ScheduledInfo, scheduled_of
from kworkers.schedule.ladder import ScheduleLadder

#: a rounding allowance between a due time and a release time written in whole ms
_MS = 0.001


@dataclass(frozen=True)
class Admitted:
    """A rung record the gate holds until ``due_at`` (its rung's release time)."""

    info: ScheduledInfo
    destination: str
    rung: int
    attempt: int = 1

    @property
    def due_at(self) -> float:
        return self.info.release_at


@dataclass(frozen=True)
class Rung:
    destination: str
    rung: int


@dataclass(frozen=True)
class ScheduleRules:
    """The rungs of the configured destinations, and the ladder that bounds their records."""

    ladder: ScheduleLadder
    rungs: Mapping[str, Rung] = field(default_factory=dict)
    max_skew: float = MAX_CLOCK_SKEW_S

    @classmethod
    def of(cls, ladder: ScheduleLadder, destinations: Iterable[str]) -> ScheduleRules:
        rungs = {topic: Rung(dest, k) for dest in destinations
                 for k, topic in enumerate(ladder.topics(dest))}
        return cls(ladder, rungs)

    def rung(self, topic: str) -> Rung:
        got = self.rungs.get(topic)
        if got is None:
            raise HeaderError(ORIGINAL_TOPIC, f"{topic[:100]!r} is no rung of a configured "
                              "destination")
        return got

    def check(self, msg: Message, now: float) -> Admitted:
        """``msg`` admitted (held until its release time), or ``HeaderError``."""
        where = self.rung(msg.topic)
        info = scheduled_of(msg.headers)
        ahead = self.ladder.max_ahead + DUE_SLACK_S
        if info.due_at - now > ahead:
            raise HeaderError(SCHEDULED_DUE_AT, f"due {info.due_at - now:.0f} s from now, more "
                              f"than the {ahead:g} s a record may be scheduled ahead")
        if info.release_at > info.due_at + _MS:
            raise HeaderError(DUE_AT, "released after the record's own due time")
        window = self.ladder.window(where.rung) + DUE_SLACK_S
        if info.release_at - now > window:
            raise HeaderError(DUE_AT, f"released {info.release_at - now:.0f} s from now, more "
                              f"than the {window:g} s rung {msg.topic!r} holds a record")
        if info.scheduled_at - now > self.max_skew:
            raise HeaderError(SCHEDULED_AT, f"{info.scheduled_at - now:.0f} s ahead of this "
                              f"worker's clock, more than the {self.max_skew:g} s allowed")
        return Admitted(info, where.destination, where.rung)
