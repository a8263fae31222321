"""When an assigned partition with lag makes no progress: a stall, told apart from a hold.

Why this exists: a worker can be alive in every thread and still leave partitions stuck (a
client pause the worker forgot, a runner that never got a thread): Kafka sees a live member,
KEDA sees lag, health says 200 and nothing moves. The only honest answer is to notice and say
so. A partition is *stalled* when it is assigned, has lag, is not held on purpose, has no
handler call running for it, and made no progress (records completed) for ``bound`` seconds.

Held on purpose (never a stall): a graceful stop, an open breaker, tier records not yet due,
a record waiting for a schema registry that is down, a self-fenced member, a record waiting
for a rate-limit token; later reasons (a transaction in progress, a schedule) are more members
of ``Hold``. Paused by
backpressure is *not* a hold: a partition paused for what it holds has records of its own that
should be running.

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


@dataclass(frozen=True, slots=True)
class Stall:
    tp: TP
    since: float
    lag: int

    def describe(self, now: float) -> str:
        t, p = self.tp
        return (f"{t}/{p}: lag {self.lag}, no progress for {now - self.since:.0f}s, "
                "nothing running and nothing holding it")


def candidates(views: Iterable[PartitionView], now: float, bound: float) -> list[PartitionView]:
    """Partitions idle past ``bound`` that nothing explains: they need a lag figure."""
    return [v for v in views
            if v.hold is None and not v.busy and now - v.since >= bound]


def judge(cands: Iterable[PartitionView], lag: Mapping[TP, int | None]) -> list[Stall]:
    """Stalled: a candidate holding records of its own, or with a positive lag read fresh.
    A lag that could not be read (the broker unreachable) judges nothing: an outage is told
    by other signals, and a guess here would restart a worker for the broker's fault."""
    out: list[Stall] = []
    for v in cands:
        n = v.held if v.held > 0 else lag.get(v.tp)
        if n is not None and n > 0:
            out.append(Stall(v.tp, v.since, n))
    return out


def default_bound(message_timeout: float | None, commit_interval: float) -> float:
    """Long enough that a slow but working partition is never taken for a stuck one: two
    deadlines, ten commit intervals, and never under a minute."""
    bound = max(MIN_STALL_S, 10 * commit_interval)
    if message_timeout is not None:
        bound = max(bound, 2 * message_timeout)
    return bound
