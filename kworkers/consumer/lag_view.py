"""Each owned partition's lag, right from the first scrape: the one place its figure is made.

Lag is the log's end minus where the group stands. Where it stands is the worker's own commit
position once it has one (a record tracked, or a commit of its own), and before that the
group's committed offset. A worker restarted on a caught-up partition has neither a record nor
a commit of its own, and the client keeps the committed offset to itself until a record
arrives (librdkafka's ``position`` is invalid until then): the gauge used to show the whole log
as lag (the high watermark) until a new record came, while ``kworkers lag`` said 0. So when a
partition is assigned, its committed offset and log end are read from the broker by an admin
client (``LagSource``), on a short thread of its own: the poll thread never waits for the
broker.

``figure`` is the number (KEDA's arithmetic, ``kworkers.lag.partition_lag``, as ``kworkers
lag`` shows it); until the base is known there is none, and the series is absent rather than
wrong. The poll thread is the gauges' only writer (``report``), so a revoked or lost
partition's series, removed by ``forget``, never comes back from a late read.

The figures built on the lag are made here too, from the same reads (``Figures``): the time
lag (``time_lag``: how long the oldest record not completed has waited, or how late a due
tier record is), the drainable lag (``drainable``: what more replicas could drain, from the
stall detector's ``Hold`` facts) and the drainable time lag (the time lag of a partition with
drainable records, else 0). They count from the oldest record not yet completed, not from the
last commit: records completed and waiting for the next commit are nobody's work.

Under ``--processes`` every child writes its own value of a series (prometheus-client's
multiprocess files, one per process), and a removed series stays in the child's file: the
gauges are ``livemax`` (no ``pid`` label) and a partition that leaves a child is set to 0
there instead of removed, so the partition's owner's value is the one shown, and a sum over
replicas counts each partition once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from kworkers.clock import Clock, SystemClock
from kworkers.consumer.drainable import drainable
from kworkers.consumer.partition import PartitionState
from kworkers.consumer.ports import TP, ConsumerPort
from kworkers.consumer.stall import PartitionView
from kworkers.consumer.stall_watch import LagSource
from kworkers.consumer.time_lag import time_lag
from kworkers.lag import partition_lag

log = logging.getLogger("kworkers.consumer")

#: one read of committed offsets and log ends at an assignment, and how often it is tried
READ_TIMEOUT_S = 5.0
READ_TRIES = 3


class _Gauge(Protocol):
    def set(self, value: float) -> None: ...


class Labelled(Protocol):
    def labels(self, *values: str) -> _Gauge: ...
    def remove(self, *values: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Figures:
    """The gauges built on the lag (``kworkers.metrics``), each labelled group, topic,
    partition."""

    time_lag: Labelled
    drainable: Labelled
    drainable_time_lag: Labelled
    #: a delayed partition's fetched records waiting for their due time, and due (loops with
    #: a timer heap only: retry tiers, schedule rungs)
    tier_waiting: Labelled | None = None
    tier_due: Labelled | None = None


@dataclass(frozen=True, slots=True)
class Facts:
    """What the drainable rule needs beyond the lag, read by the poll loop at a report."""

    #: the stall detector's latest views, by partition (their ``hold``)
    views: Mapping[TP, PartitionView]
    #: how many of a partition's records wait in its tier heap (None: no gate)
    waiting: Callable[[PartitionState], int] | None = None
    #: the worker's rate limit is the pool's (``scope="pool"``)
    pool_rate_limit: bool = False
    #: ... with one bucket for every record, and a record of the loop waits for it
    pool_at_bound: bool = False


def _multiprocess() -> bool:
    """prometheus-client writes values to per-process files (``--processes``)."""
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


@dataclass(frozen=True, slots=True)
class Read:
    """What the broker said of a partition when it was assigned."""

    #: the group's committed offset (None: the group never committed on it)
    committed: int | None
    #: the log end then (None: not answered)
    latest: int | None


def owned_lag(latest: int | None, own: int | None, read: Read | None) -> int | None:
    """A partition's lag: ``latest`` (the client's cached log end, else the one read at the
    assignment) minus the worker's own position ``own``, else the group's committed offset
    read at the assignment (none committed: KEDA's rule for the rendered reset policy, the
    whole log). None while a figure would be a guess. Never below 0."""
    if latest is None and read is not None:
        latest = read.latest
    if latest is None:
        return None
    if own is not None:
        return max(0, partition_lag(latest, own))
    if read is None:
        return None
    return max(0, partition_lag(latest, read.committed))


class LagView:
    """The lag gauge of one poll loop (``kworkers_consumer_lag{group,topic,partition}``)."""

    def __init__(self, group: str, source: LagSource | None, gauge: Labelled,
                 figures: Figures | None = None, clock: Clock | None = None) -> None:
        self.group = group
        self.source = source
        self.gauge = gauge
        self.figures = figures
        self.clock = clock or SystemClock()
        self._lock = threading.Lock()
        #: reads at assignment, kept with the partition state they were made for
        self._reads: dict[TP, tuple[PartitionState, Read]] = {}
        #: series the gauge shows (the poll thread's own)
        self._shown: set[TP] = set()
        #: a read arrived since the last report (the poll thread reports at once)
        self.fresh = False

    # -- the poll thread ----------------------------------------------------------------------

    def assigned(self, parts: list[PartitionState]) -> None:
        """Read the new partitions' committed offsets and log ends, off the poll thread."""
        if self.source is None or not parts:
            return
        threading.Thread(target=self._read, args=(parts,), daemon=True,
                         name=f"kworkers-lag-{self.group}").start()

    def figure(self, ps: PartitionState, consumer: ConsumerPort) -> int | None:
        """The partition's lag now (``owned_lag``), or None while it is not known."""
        latest, read = self._known(ps, consumer)
        tr = ps.tracker
        return owned_lag(latest, tr.committed if tr.committed is not None else tr.position,
                         read)

    def outstanding(self, ps: PartitionState, consumer: ConsumerPort) -> int | None:
        """Records from the oldest not yet completed to the log end (the lag less what
        completed and waits for the next commit), or None while it is not known."""
        latest, read = self._known(ps, consumer)
        tr = ps.tracker
        return owned_lag(latest, tr.oldest if tr.oldest is not None else tr.position, read)

    def _known(self, ps: PartitionState, consumer: ConsumerPort
               ) -> tuple[int | None, Read | None]:
        """(the client's cached log end, the read made at the assignment of this state)."""
        try:
            _lo, hi = consumer.watermarks(ps.tp, 0.0)
            latest: int | None = hi if hi >= 0 else None
        except Exception:  # not fetched yet: nothing cached
            latest = None
        with self._lock:
            got = self._reads.get(ps.tp)
        return latest, got[1] if got is not None and got[0] is ps else None

    def report(self, parts: Iterable[PartitionState], consumer: ConsumerPort,
               facts: Facts | None = None) -> None:
        self.fresh = False
        now = self.clock.now()
        for ps in list(parts):
            n = self.figure(ps, consumer)
            labels = (self.group, ps.topic, str(ps.partition))
            if n is not None:
                self.gauge.labels(*labels).set(n)
                self._shown.add(ps.tp)
            self._tier(ps, labels, facts)
            out = None if self.figures is None else self.outstanding(ps, consumer)
            if self.figures is None or out is None:
                continue
            if out == 0:
                ps.saw_caught_up(now)
            tr = ps.tracker
            head = tr.oldest
            t = time_lag(now, out, None if head is None else ps.stamps.time_of(head),
                         ps.stamps.last_t, ps.caught_up_at)
            d = self.drainable(ps, out, facts)
            f = self.figures
            f.drainable.labels(*labels).set(d)
            if t is not None:
                f.time_lag.labels(*labels).set(t)
                f.drainable_time_lag.labels(*labels).set(t if d > 0 else 0.0)
            self._shown.add(ps.tp)

    def _tier(self, ps: PartitionState, labels: tuple[str, str, str],
              facts: Facts | None) -> None:
        """A delayed partition's records fetched and not completed, waiting or due."""
        f = self.figures
        if f is None or facts is None or facts.waiting is None:
            return
        waiting = facts.waiting(ps)
        if f.tier_waiting is not None:
            f.tier_waiting.labels(*labels).set(waiting)
        if f.tier_due is not None:
            f.tier_due.labels(*labels).set(max(0, ps.tracker.in_flight - waiting))
        self._shown.add(ps.tp)

    @staticmethod
    def drainable(ps: PartitionState, outstanding: int, facts: Facts | None) -> int:
        """``drainable.drainable`` for ``ps`` with the loop's facts."""
        if facts is None:
            return drainable(None, outstanding)
        view = facts.views.get(ps.tp)
        waiting = facts.waiting(ps) if facts.waiting is not None else 0
        return drainable(None if view is None else view.hold, outstanding,
                         ps.tracker.in_flight - waiting,
                         pool_rate_limit=facts.pool_rate_limit,
                         pool_at_bound=facts.pool_at_bound,
                         unseen=facts.waiting is not None and not ps.tracker.fetched_any)

    def forget(self, tps: Iterable[TP]) -> None:
        """Revoked or lost: their series go (another member reports them now); under
        ``--processes`` they are set to 0 instead (the module doc says why)."""
        gauges = [self.gauge]
        if self.figures is not None:
            f = self.figures
            gauges += [f.time_lag, f.drainable, f.drainable_time_lag]
            gauges += [g for g in (f.tier_waiting, f.tier_due) if g is not None]
        shared = _multiprocess()
        for tp in tps:
            with self._lock:
                self._reads.pop(tp, None)
            if tp in self._shown:
                self._shown.discard(tp)
                labels = (self.group, tp[0], str(tp[1]))
                for g in gauges:
                    if shared:
                        g.labels(*labels).set(0)
                    else:
                        with contextlib.suppress(KeyError):
                            g.remove(*labels)

    # -- the read's thread --------------------------------------------------------------------

    def _read(self, parts: list[PartitionState]) -> None:
        assert self.source is not None
        tps = [ps.tp for ps in parts]
        for attempt in range(READ_TRIES):
            try:
                committed = self.source.committed(self.group, tps, READ_TIMEOUT_S)
                latest = self.source.latest(tps, READ_TIMEOUT_S)
                break
            except Exception as exc:
                log.debug("%s: reading committed offsets at assignment failed: %s",
                          self.group, exc)
                time.sleep(0.5 * 2 ** attempt)
        else:
            return  # the gauge waits for the worker's own position
        with self._lock:
            for ps in parts:
                if ps.tp in committed:
                    self._reads[ps.tp] = (ps, Read(committed[ps.tp], latest.get(ps.tp)))
        self.fresh = True
