"""When a member stops starting records because it may no longer be one: self-fencing.

A member cut off from its group coordinator (a network partition, a broker that froze) keeps its
partitions only until its session times out; then the group gives them to another member, which
commits past them, while the cut-off member, which has not heard yet, would go on running the
records it fetched. Every record it started then would be run a second time (the receiver absorbs
store effects, but an external call happens twice). Kafka Streams bounds this with
``task.timeout.ms``; a worker that promises "never twice" fences itself instead: once the
coordinator has been silent for the session timeout less a margin, it starts no further record
and commits nothing, until the coordinator answers again (its partitions are still its own: it
goes on) or the client says they were lost (they are dropped).

Pure: contact times come from the consumer (``ConsumerPort.coordinator_contact``: the client's
statistics and successful commits), the clock is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

from kworkers.errors import ConfigError

#: the default margin: a fifth of the session, at least a second
MARGIN_SHARE = 0.2
MIN_MARGIN_S = 1.0


def default_margin(session_s: float) -> float:
    return min(max(MIN_MARGIN_S, MARGIN_SHARE * session_s), session_s / 2)


def check_margin(margin_s: float, session_s: float) -> None:
    """One clear error for a margin that leaves no time to work, or none to stop in."""
    if not 0 < margin_s < session_s:
        raise ConfigError(f"fence_margin: must be > 0 s and below the session timeout "
                          f"({session_s:g}s), got {margin_s:g}")


@dataclass
class Membership:
    """The member's last contact with its coordinator, and whether it is fenced.

    Fencing starts by silence alone; it ends only by a confirmation from the group (a commit
    the coordinator accepted, or a new assignment): a coordinator that answers again may be
    answering that this member was expelled, and a member that went on before the client says
    so would start records of partitions that moved. While fenced and answered again, the
    member may probe (``may_probe``): a commit of what it would commit anyway, which the
    coordinator accepts only from a member.
    """

    session_s: float
    margin_s: float
    #: the loop's start: a member that never heard from the coordinator counts from here
    since: float
    fenced: bool = False
    contact_at: float | None = None

    def __post_init__(self) -> None:
        check_margin(self.margin_s, self.session_s)

    @property
    def threshold(self) -> float:
        return self.session_s - self.margin_s

    def observe(self, contact_at: float | None) -> None:
        if contact_at is not None and (self.contact_at is None or contact_at > self.contact_at):
            self.contact_at = contact_at

    def silent_for(self, now: float) -> float:
        return now - max(self.since, self.contact_at or self.since)

    def may_wait(self, now: float, seconds: float) -> bool:
        """Whether the member may go ``seconds`` without hearing what its client says (a hold
        polls nothing, so the statistics that tell the coordinator's silence wait for its
        end) and still fence itself in time: not when the threshold could pass meanwhile."""
        return not self.fenced and self.silent_for(now) + seconds < self.threshold

    def update(self, now: float) -> bool:
        """True when the member fences itself now (it was silent past the threshold)."""
        if self.fenced or self.silent_for(now) < self.threshold:
            return False
        self.fenced = True
        return True

    def may_probe(self, now: float) -> bool:
        """Fenced, and the coordinator answers again: time to ask whether it is a member."""
        return self.fenced and self.silent_for(now) < self.threshold

    def confirm(self, now: float) -> bool:
        """The group confirmed the membership: contact now, no longer fenced. True when it
        was."""
        self.observe(now)
        was, self.fenced = self.fenced, False
        return was
