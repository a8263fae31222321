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
wrong. The poll thread is the gauge's only writer (``report``), so a revoked or lost
partition's series, removed by ``forget``, never comes back from a late read. Later figures
built on the lag (time lag, drainable lag) start from ``figure``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from kworkers.consumer.partition import PartitionState
from kworkers.consumer.ports import TP, ConsumerPort
from kworkers.consumer.stall_watch import LagSource
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

    def __init__(self, group: str, source: LagSource | None, gauge: Labelled) -> None:
        self.group = group
        self.source = source
        self.gauge = gauge
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
        try:
            _lo, hi = consumer.watermarks(ps.tp, 0.0)
            latest: int | None = hi if hi >= 0 else None
        except Exception:  # not fetched yet: nothing cached
            latest = None
        tr = ps.tracker
        own = tr.committed if tr.committed is not None else tr.position
        with self._lock:
            got = self._reads.get(ps.tp)
        read = got[1] if got is not None and got[0] is ps else None
        return owned_lag(latest, own, read)

    def report(self, parts: Iterable[PartitionState], consumer: ConsumerPort) -> None:
        self.fresh = False
        for ps in list(parts):
            n = self.figure(ps, consumer)
            if n is not None:
                self.gauge.labels(self.group, ps.topic, str(ps.partition)).set(n)
                self._shown.add(ps.tp)

    def forget(self, tps: Iterable[TP]) -> None:
        """Revoked or lost: their series go (another member reports them now)."""
        for tp in tps:
            with self._lock:
                self._reads.pop(tp, None)
            if tp in self._shown:
                self._shown.discard(tp)
                with contextlib.suppress(KeyError):
                    self.gauge.remove(self.group, tp[0], str(tp[1]))

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
