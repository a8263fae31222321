"""Per-partition state owned by the poll thread: offsets, lanes, pause flag, fencing.

A new ``PartitionState`` is made for every assignment; work carries a reference to the one it
was dispatched under, so a result for a partition revoked (or revoked and assigned again) in the
meantime is recognised as stale by identity and fenced out.
"""

from __future__ import annotations

import threading
from typing import Any

from kworkers.clock import Clock, SystemClock
from kworkers.consumer.offsets import OffsetTracker
from kworkers.message import Message

_SYSTEM_CLOCK = SystemClock()


class Poisoned:
    """A record that failed before its handler could run (e.g. corrupt kworkers headers)."""

    __slots__ = ("exc", "msg")

    def __init__(self, msg: Message, exc: BaseException) -> None:
        self.msg = msg
        self.exc = exc


Item = Message | Poisoned


class Lane:
    """An ordered queue of records run one at a time (per partition, or per key).

    ``queue`` and ``running`` change under ``lock``, by the poll thread (enqueue) and by the
    runner (take the next batch, or go idle); everything else is the runner's own.
    """

    __slots__ = ("batch", "chunk", "current", "done", "incarnation", "lock", "part", "pos",
                 "queue", "running", "started")

    def __init__(self, part: PartitionState) -> None:
        self.part = part
        self.queue: list[Item] = []
        self.running = False
        self.lock = threading.Lock()
        #: bumped when a deadline takes the lane away from a stuck runner
        self.incarnation = 0
        # Watched by the deadline watchdog (only maintained when deadlines are on):
        self.current: Message | None = None
        self.started = 0.0
        self.batch: list[Item] = []
        self.pos = 0
        #: the records of the batch a batch handler runs now (None: single records)
        self.chunk: list[Message] | None = None
        #: offsets the current runner finished but has not reported yet; a revoke reads it so
        #: records done ahead of a slow one are committed, not redelivered
        self.done: list[int] = []

    def touch(self) -> None:
        """Restarts the current record's deadline (a heartbeat from the handler)."""
        self.started = self.part.clock.monotonic()


class PartitionState:
    __slots__ = ("clock", "halted", "handoffs", "lane", "lanes", "partition", "paused",
                 "revoking", "topic", "tp", "tracker")

    def __init__(self, topic: str, partition: int, clock: Clock = _SYSTEM_CLOCK) -> None:
        #: the worker's clock: deadlines of this partition's lanes are measured on it
        self.clock = clock
        self.topic = topic
        self.partition = partition
        self.tp = (topic, partition)
        self.tracker = OffsetTracker()
        self.lane = Lane(self)  # the partition lane (ordering="partition")
        self.lanes: dict[Any, Lane] = {}  # key lanes (ordering="key")
        self.paused = False
        #: set when the partition is revoked or lost: its results are fenced, hand-offs in
        #: progress are abandoned (the next owner reads the record again)
        self.revoking = False
        #: set on a revoke and on a graceful stop: runners start no further record
        self.halted = False
        #: hand-offs sent and not yet acknowledged (kept by the hand-off step, under its lock)
        self.handoffs = 0

    def lane_for(self, key: bytes | None) -> Lane:
        lane = self.lanes.get(key)
        if lane is None:
            lane = self.lanes[key] = Lane(self)
        return lane

    def all_lanes(self) -> list[Lane]:
        return [self.lane, *self.lanes.values()]

    def busy(self) -> bool:
        return self.handoffs > 0 or any(lane.running for lane in self.all_lanes())

    def stop_dispatch(self) -> None:
        """Revoked or lost: ``halt``, and fence whatever is still running."""
        self.revoking = True
        self.halt()

    def halt(self) -> None:
        """No further record starts; queued ones are dropped (never completed, so never
        committed past: the next owner reads them again, and no effect of theirs ran)."""
        self.halted = True
        for lane in self.all_lanes():
            with lane.lock:
                lane.queue = []

    def running(self) -> int:
        """Work under way: lanes whose runner is busy, and unacknowledged hand-offs."""
        return self.handoffs + sum(1 for lane in self.all_lanes() if lane.running)

    def prune_idle_lanes(self) -> None:
        for key, lane in list(self.lanes.items()):
            with lane.lock:
                if not lane.running and not lane.queue:
                    del self.lanes[key]
