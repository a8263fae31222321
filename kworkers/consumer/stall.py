"""When an assigned partition with lag makes no progress: a stall, told apart from a hold.

Why this exists: a worker can be alive in every thread and still leave partitions stuck (a
client pause the worker forgot, a runner that never got a thread): Kafka sees a live member,
KEDA sees lag, health says 200 and nothing moves. The only honest answer is to notice and say
so. A partition is *stalled* when it is assigned, has lag, is not held on purpose, has no
handler call running for it, and made no progress (records completed) for ``bound`` seconds.

Held on purpose (never a stall): a graceful stop, an open breaker, tier records not yet due,
a record waiting for a schema registry that is down, a self-fenced member, a record waiting
for a rate-limit token or for another attempt's lease on its key; later reasons (a transaction
in progress, a schedule) are more members of ``Hold``. Paused by backpressure is *not* a hold:
a partition paused for what it holds has records of its own that should be running.

A hold must be true when it is claimed. Most holds end at a time the worker knows
(``PartitionView.hold_ends``): a tier record's due time, the end of a breaker's cool-down, the
moment its bucket had a token, a lease's expiry. A hold still claimed ``bound`` seconds after
that moment is not a hold but a stall like any other (a timer that never fires, a breaker that
never half-opens, a waiter that never looks again): ``overdue``. A drain and a fence have no
such time: they are the worker's own decisions, bounded elsewhere (``drain_timeout``, the
coordinator's answer). Where each fact comes from: ``observe.stall_views``.

Pure: the poll thread describes each partition (``PartitionView``), the watch thread
(``stall_watch``) adds the lag from a fresh watermark query — the client's cached watermarks
skip exactly the partitions never fetched, which are the stuck ones — and ``judge`` decides.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kworkers.consumer.ports import TP

#: a partition is never judged stalled sooner than this by default
MIN_STALL_S = 60.0
#: how many stall bounds a stall may last before the worker is unhealthy (and restarts)
UNHEALTHY_AFTER = 3


class Hold(enum.Enum):
    """Why a partition waits on purpose (exported as ``kworkers_paused_partitions{reason}``
    for the pauses among them)."""

    DRAINING = "draining"
    BREAKER = "breaker"
    NOT_DUE = "not_due"
    #: its next record waits for a schema registry that does not answer (``payloads.decode``)
    REGISTRY = "registry"
    FENCED = "fenced"
    #: its next record waits for a rate-limit token (``kworkers.pace``)
    RATE_LIMIT = "rate_limit"
    #: its next record waits for another attempt's lease on its key to end (``activity``)
    LEASE = "lease"
    #: it holds nothing and waits for its loop to hold less than its byte bound (others'
    #: records over their shares: ``backpressure``, issue #45)
    MEMORY = "memory"


@dataclass(frozen=True, slots=True)
class PartitionView:
    tp: TP
    #: monotonic time of the partition's last progress (or of its assignment)
    since: float
    #: a handler call or a hand-off is under way for it
    busy: bool
    hold: Hold | None
    #: records fetched and not yet completed (positive: it has lag by itself)
    held: int
    #: the next offset the worker would commit, when it knows one
    position: int | None
    #: monotonic time by which ``hold`` should have ended (None: no such time is known; the
    #: hold is true for as long as it is claimed)
    hold_ends: float | None = None


#: what a hold still claimed past its end means, for the log line and ``/readyz``
_OVERDUE = {
    Hold.NOT_DUE: "its earliest waiting retry record came due and has not started",
    Hold.BREAKER: "the breaker's cool-down ended and no probe started",
    Hold.RATE_LIMIT: "its record waits for a rate-limit token while the bucket has one",
    Hold.REGISTRY: "its record waits for the schema registry and has stopped asking",
    Hold.LEASE: "its record waits for a lease that expired",
    Hold.MEMORY: "its loop, at its byte bound, completed no record",
}


@dataclass(frozen=True, slots=True)
class Stall:
    tp: TP
    #: since when it is stuck: its last progress, or the end its claimed hold overran
    since: float
    lag: int
    #: the hold it claimed past that hold's end (None: nothing held it)
    overdue: Hold | None = None

    def describe(self, now: float) -> str:
        t, p = self.tp
        if self.overdue is not None:
            return (f"{t}/{p}: lag {self.lag}, held as {self.overdue.value} but "
                    f"{_OVERDUE[self.overdue]} {now - self.since:.0f}s ago")
        return (f"{t}/{p}: lag {self.lag}, no progress for {now - self.since:.0f}s, "
                "nothing running and nothing holding it")


def overdue(v: PartitionView, now: float, bound: float) -> bool:
    """A hold claimed ``bound`` seconds past the time it should have ended by: not a hold.
    Whatever else runs in the partition does not excuse it (the record held is not started)."""
    return v.hold is not None and v.hold_ends is not None and now - v.hold_ends >= bound


def candidates(views: Iterable[PartitionView], now: float, bound: float) -> list[PartitionView]:
    """Partitions idle past ``bound`` that nothing explains, and partitions whose hold is
    overdue: they need a lag figure."""
    return [v for v in views
            if (v.hold is None and not v.busy and now - v.since >= bound)
            or overdue(v, now, bound)]


def judge(cands: Iterable[PartitionView], lag: Mapping[TP, int | None]) -> list[Stall]:
    """Stalled: a candidate holding records of its own, or with a positive lag read fresh.
    A lag that could not be read (the broker unreachable) judges nothing: an outage is told
    by other signals, and a guess here would restart a worker for the broker's fault."""
    out: list[Stall] = []
    for v in cands:
        n = v.held if v.held > 0 else lag.get(v.tp)
        if n is not None and n > 0:
            if v.hold is not None and v.hold_ends is not None:
                out.append(Stall(v.tp, v.hold_ends, n, v.hold))
            else:
                out.append(Stall(v.tp, v.since, n))
    return out


def default_bound(message_timeout: float | None, commit_interval: float) -> float:
    """Long enough that a slow but working partition is never taken for a stuck one: two
    deadlines, ten commit intervals, and never under a minute."""
    bound = max(MIN_STALL_S, 10 * commit_interval)
    if message_timeout is not None:
        bound = max(bound, 2 * message_timeout)
    return bound
