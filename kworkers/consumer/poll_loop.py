"""The skeleton both poll loops share: the consumer group's (``processor.Processor``) and the
share group's (``share.processor.ShareProcessor``).

What a loop does with a completion differs (commit an offset, or acknowledge one record), and
so do its step and its drain; how it lives does not: run steps until stopped, then drain, then
leave, with the stall watch started before the first step and closed after the last; handler
calls watched against their bounds every step; the same record counters. Written once here
(each loop had its own copy, issue #48), each loop fills in ``_open``, ``_step``, ``_drain``
and ``_leave``; the stall watch is closed even when leaving fails.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod

from kworkers.clock import Clock
from kworkers.consumer.calls import CallWatch
from kworkers.consumer.deadline import DeadlineWatch
from kworkers.consumer.runner import Runner
from kworkers.consumer.settings import LoopSettings
from kworkers.consumer.stall import PartitionView
from kworkers.consumer.stall_watch import LagSource, StallWatch
from kworkers.metrics import Metrics
from kworkers.supervision import Supervisor

#: how often the poll thread publishes its partitions' state for the stall watch
VIEWS_INTERVAL_S = 0.5


class PollLoop(ABC):
    def __init__(self, settings: LoopSettings, runner: Runner, metrics: Metrics, clock: Clock,
                 supervisor: Supervisor, group: str, deadline: float | None,
                 offsets: LagSource | None = None) -> None:
        self.settings = settings
        self.runner = runner
        self.metrics = metrics
        self.clock = clock
        self.supervisor = supervisor
        self.group = group
        #: handler calls running on: unready past one bound, unhealthy past the other
        self.calls = CallWatch(runner.runtime, supervisor, settings.slow_call_bound(),
                               settings.hung_call_bound(), clock)
        #: a call past its deadline is taken over (None: no deadline, or the runtime bounds
        #: each call itself)
        self.watch = (DeadlineWatch(deadline, clock, runner.start)
                      if runner.watched and deadline is not None else None)
        #: the partitions as the stall watch sees them (replaced whole, never mutated)
        self.stall_views: tuple[PartitionView, ...] = ()
        self._last_views = float("-inf")
        self.stall_watch = StallWatch(
            group, settings.partition_stall_bound(), lambda: self.stall_views, offsets, clock,
            supervisor, lambda tp: metrics.partition_stalled.labels(group, tp[0], str(tp[1])))
        self._m_ok = metrics.records.labels(group, "ok")
        self._m_retried = metrics.records.labels(group, "retried")
        self._m_dead = metrics.records.labels(group, "dead_lettered")
        self._m_duration = metrics.handler_duration.labels(group)
        self._m_in_flight = metrics.in_flight.labels(group)
        self._m_fenced = metrics.fenced.labels(group)
        self._draining = False
        self._stop = threading.Event()
        self.ready = threading.Event()
        self.closed = threading.Event()

    def stop(self) -> None:
        """Begin a graceful stop (any thread, a signal handler included): the loop finishes
        its step, then drains and leaves."""
        self._stop.set()

    def run(self) -> None:
        self._open()
        self.stall_watch.start()
        self.supervisor.watch(f"kworkers-stall-{self.group}", self.stall_watch.alive)
        try:
            while not self._stop.is_set():
                self._step()
            self._drain()
        finally:
            try:
                self._leave()
            finally:
                self.stall_watch.close()
                self.closed.set()

    def _supervise(self) -> None:
        self.supervisor.check()
        self.calls.check()

    @abstractmethod
    def _open(self) -> None:
        """Join the group (subscribe) and start what runs beside the loop."""

    @abstractmethod
    def _step(self) -> None:
        """One turn: poll, hand records to lanes, settle what completed."""

    @abstractmethod
    def _drain(self) -> None:
        """A graceful stop: start nothing more, settle what started (bounded)."""

    @abstractmethod
    def _leave(self) -> None:
        """Leave the group and let go of every partition (also after a crash of a step)."""
