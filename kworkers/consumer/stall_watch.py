"""The thread that turns ``stall.judge`` into signals: a gauge per partition, one log line per
transition, ``/readyz`` 503 while a partition is stalled, and ``/healthz`` 503 (the worker stops,
so the orchestrator restarts it) once a stall lasted ``UNHEALTHY_AFTER`` bounds.

A thread of its own because "has lag" must be read fresh from the broker (a watermark query, a
committed-offset fetch for a partition never fetched), and the poll thread never waits on the
broker for that. It reads only what the poll thread published (``views``: an immutable tuple
replaced as a whole) and the consumer's thread-safe queries.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from kworkers.clock import Clock
from kworkers.consumer.ports import TP
from kworkers.consumer.stall import UNHEALTHY_AFTER, PartitionView, Stall, candidates, judge
from kworkers.supervision import Supervisor

log = logging.getLogger("kworkers.consumer")

#: how long one fresh lag query may take before the partition is left unjudged this round
QUERY_TIMEOUT_S = 5.0


class LagSource(Protocol):
    """Fresh figures from the broker, from a client of its own (``kafka.offsets``): the
    worker's consumer answers only its poll thread."""

    def latest(self, tps: list[TP], timeout: float) -> dict[TP, int]: ...
    def committed(self, group: str, tps: list[TP], timeout: float) -> dict[TP, int | None]: ...


class Flag(Protocol):
    """A gauge child per partition (1 stalled, 0 not)."""

    def set(self, value: float) -> None: ...


class StallWatch:
    def __init__(self, group: str, bound: float, views: Callable[[], Sequence[PartitionView]],
                 source: LagSource | None, clock: Clock, supervisor: Supervisor,
                 flag: Callable[[TP], Flag]) -> None:
        self.group = group
        self.bound = bound
        self.views = views
        self.source = source
        self.clock = clock
        self.supervisor = supervisor
        self.flag = flag
        #: the partitions stalled at the last check
        self.stalled: dict[TP, Stall] = {}
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kworkers-stall-{group}",
                                        daemon=True)

    @property
    def every(self) -> float:
        return max(0.2, min(5.0, self.bound / 4))

    def start(self) -> StallWatch:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        self.supervisor.recover(self._component)

    @property
    def _component(self) -> str:
        return f"partitions of {self.group}"

    def alive(self) -> bool:
        return self._thread.is_alive() or self._closed.is_set()

    def _run(self) -> None:
        while not self._closed.wait(self.every):
            try:
                self.check()
            except Exception:  # a query the client refused: judge again next round
                log.debug("stall check failed", exc_info=True)

    def lag(self, cands: list[PartitionView]) -> dict[TP, int | None]:
        """Fresh high watermark minus the position: the worker's own (past transaction
        markers, see ``Processor``), else the group's committed offset, else the log start
        (``auto.offset.reset=earliest``, taken as 0 here: an over-estimate only for a log whose
        start was deleted, which a committed offset then corrects). None where the broker did
        not answer, or no source is set. Only for candidates holding no records of their own:
        the others are judged by what they hold, whatever the broker says."""
        cands = [v for v in cands if v.held <= 0]
        if not cands or self.source is None:
            return {}
        his = self.source.latest([v.tp for v in cands], QUERY_TIMEOUT_S)
        unknown = [v.tp for v in cands if v.position is None]
        remote = self.source.committed(self.group, unknown, QUERY_TIMEOUT_S) if unknown else {}
        out: dict[TP, int | None] = {}
        for v in cands:
            hi = his.get(v.tp)
            pos = v.position if v.position is not None else remote.get(v.tp)
            out[v.tp] = None if hi is None else hi - (pos or 0)
        return out

    def check(self) -> list[Stall]:
        now = self.clock.monotonic()
        cands = candidates(self.views(), now, self.bound)
        found = {s.tp: s for s in judge(cands, self.lag(cands))}
        for tp, s in found.items():
            if tp not in self.stalled:
                log.error("%s: partition stalled: %s", self.group, s.describe(now))
                self.flag(tp).set(1)
        for tp in self.stalled.keys() - found.keys():
            log.warning("%s: partition %s/%d moves again", self.group, *tp)
            self.flag(tp).set(0)
        self.stalled = found
        if found:
            worst = min(found.values(), key=lambda s: s.since)
            why = f"{len(found)} stalled: {worst.describe(now)}"
            self.supervisor.degrade(self._component, why)
            if now - worst.since >= UNHEALTHY_AFTER * self.bound:
                self.supervisor.fail(self._component, f"stuck past {UNHEALTHY_AFTER} stall "
                                                      f"bounds ({self.bound:.0f}s): {why}")
        else:
            self.supervisor.recover(self._component)
        return list(found.values())
