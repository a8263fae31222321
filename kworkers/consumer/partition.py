"""Per-partition state owned by the poll thread: offsets, lanes, pause flag, fencing.

A new ``PartitionState`` is made for every assignment; work carries a reference to the one it
was dispatched under, so a result for a partition revoked (or revoked and assigned again) in the
meantime is recognised as stale by identity and fenced out.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from kworkers.clock import Clock, SystemClock
from kworkers.consumer.offsets import OffsetTracker
from kworkers.consumer.time_lag import Stamps
from kworkers.memory import RECORD_COST
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

    Who changes it, always through these methods and under ``lock``: the poll thread offers
    records (``offer``), restarts a lane a breaker held (``offer`` with nothing new), drops the
    queue at a halt (``drop_queue``) and takes the lane over from a runner stuck past its
    deadline (``take_over``, which bumps the incarnation, so the stuck runner's late results are
    fenced); the one runner whose turn it is takes more records (``next_batch``, ``take``),
    marks the record it calls the handler for (``begin``, ``end``) and gives the lane back
    (``finish``, ``hold``, ``abandon``). A runner passes the incarnation it started under, and
    a method that finds it moved on does nothing.
    """

    __slots__ = ("_batch", "_chunk", "_current", "_done", "_incarnation", "_pos", "_queue",
                 "_running", "_started", "deadline_s", "lock", "part")

    def __init__(self, part: Partition) -> None:
        self.part = part
        self.lock = threading.Lock()
        self._queue: list[Item] = []
        self._running = False
        #: bumped when a deadline takes the lane away from a stuck runner
        self._incarnation = 0
        # What the deadline watchdog reads (kept only while deadlines are on):
        self._current: Message | None = None
        self._started = 0.0
        #: None until a deadline's ``begin`` (a list per lane alive as long as its key has
        #: records in flight, for nothing, is one more object for the collector: issue #50)
        self._batch: list[Item] | None = None
        self._pos = 0
        #: the records of the batch a batch handler runs now (None: single records)
        self._chunk: list[Message] | None = None
        #: offsets the current runner finished but has not reported yet; a revoke reads it so
        #: records done ahead of a slow one are committed, not redelivered
        self._done: Sequence[int] = ()
        #: the deadline of the async call running (the async runtime's; a heartbeat moves
        #: its start: ``touch``)
        self.deadline_s = 0.0

    # ------------------------------------------------------------------ reading

    @property
    def running(self) -> bool:
        """A runner owns the lane (running, or queued for a place to run)."""
        return self._running

    @property
    def incarnation(self) -> int:
        return self._incarnation

    @property
    def current(self) -> Message | None:
        """The record whose handler runs now (while deadlines are on)."""
        return self._current

    @property
    def started(self) -> float:
        """When the current record's deadline started (``touch`` restarts it)."""
        return self._started

    @property
    def done(self) -> Sequence[int]:
        return self._done

    def idle(self) -> bool:
        return not self._running and not self._queue

    def queued(self) -> list[Item]:
        """A copy of what waits behind the runner."""
        with self.lock:
            return list(self._queue)

    def held(self) -> bool:
        """Records wait with no runner (a runner put them back: the breaker was open)."""
        return bool(self._queue) and not self._running

    # ------------------------------------------------------------------ the poll thread

    def offer(self, items: list[Item]) -> tuple[list[Item], int] | None:
        """Queues ``items``. When no runner owns the lane it is owned from now on, and what
        to start it with is returned (records held back first), with the incarnation."""
        with self.lock:
            if self._running:
                self._queue.extend(items)
                return None
            if self._queue:  # records a runner held back (breaker open) go first
                items, self._queue = self._queue + items, []
            if not items:
                return None
            self._running = True
            return items, self._incarnation

    def drop_queue(self) -> None:
        with self.lock:
            self._queue = []

    def reclaim(self) -> list[Item] | None:
        """A lane no runner owns any more gives up what it still queues (share mode's held
        records go back to its backlog); None while a runner owns it."""
        with self.lock:
            if self._running:
                return None
            rest, self._queue = self._queue, []
            return rest

    def take_over(self, cur: Message
                  ) -> tuple[list[Item], int, Message | list[Message]] | None:
        """The deadline watchdog takes the lane from the runner stuck on ``cur``: (the records
        after it, the new incarnation, what timed out); None if that runner moved on."""
        with self.lock:
            if self._current is not cur or not self._running:
                return None
            self._incarnation += 1
            rest = (self._batch or [])[self._pos + 1:] + self._queue
            timed_out: Message | list[Message] = self._chunk or cur
            self._queue, self._batch, self._current, self._chunk = [], None, None, None
            return rest, self._incarnation, timed_out

    def expire(self) -> None:
        """Ends the current record's deadline now (share mode: its lock is about to go)."""
        self._started = float("-inf")

    # ------------------------------------------------------------------ the runner

    def begin(self, inc: int, msg: Message, now: float, batch: list[Item], pos: int,
              chunk: list[Message] | None = None) -> bool:
        """The handler is about to run ``msg`` (``pos`` in ``batch``; ``chunk`` for a batch
        handler): what the watchdog needs. False if the lane was taken over meanwhile."""
        with self.lock:
            if self._incarnation != inc:
                return False
            self._current, self._started, self._batch, self._pos = msg, now, batch, pos
            self._chunk = chunk
            return True

    def end(self) -> None:
        self._current = self._chunk = None

    def touch(self) -> None:
        """Restarts the current record's deadline (a heartbeat from the handler): what the
        deadline watchdog reads for a sync call and the async runtime's sweep for an async
        one."""
        self._started = self.part.clock.monotonic()

    def reporting(self, done: Sequence[int]) -> None:
        """The list the runner appends finished offsets to until it reports them."""
        self._done = done

    def next_batch(self, inc: int) -> list[Item] | None:
        """What the runner runs next; None: the lane is idle again (or was taken over)."""
        with self.lock:
            if self._incarnation != inc:
                return None
            if self._queue and not self.part.halted:
                batch, self._queue = self._queue, []
                return batch
            self._running = False
            return None

    def take(self, inc: int, n: int) -> list[Item] | None:
        """Up to ``n`` more queued records for a batch being filled (None: taken over)."""
        with self.lock:
            if self._incarnation != inc:
                return None
            more, self._queue = self._queue[:n], self._queue[n:]
            return more

    def finish(self, inc: int) -> None:
        """The runner stops early (revoke, stop, abandoned hand-off): the queue is dropped."""
        with self.lock:
            if self._incarnation == inc:
                self._queue = []
                self._running = False

    def hold(self, inc: int, rest: list[Item]) -> None:
        """The breaker is open: the records not started go back to the head, in order, and
        the lane waits for the poll loop to offer it again."""
        with self.lock:
            if self._incarnation == inc:
                self._queue = rest + self._queue
                self._running = False

    def abandon(self) -> None:
        """The runner crashed: the lane is idle again (its unfinished records are never
        completed, so never committed; the worker is stopping because of it)."""
        with self.lock:
            self._running = False
            self._current = None


class Partition:
    """A partition's lanes and fencing flags: what runners and the hand-off step see.

    ``PartitionState`` (a consumer group's partition: offsets, pause) and share mode's
    ``SharePartition`` (records lent one by one) build on it.
    """

    __slots__ = ("clock", "fenced", "halted", "lanes", "partition", "progress_at", "revoking",
                 "topic", "tp", "unacked")

    def __init__(self, topic: str, partition: int, clock: Clock = _SYSTEM_CLOCK) -> None:
        #: the worker's clock: deadlines of this partition's lanes are measured on it
        self.clock = clock
        self.topic = topic
        self.partition = partition
        self.tp = (topic, partition)
        self.lanes: dict[Any, Lane] = {}
        #: set when the partition is revoked or lost: its results are fenced, hand-offs in
        #: progress are abandoned (the next owner reads the record again)
        self.revoking = False
        #: set on a revoke and on a graceful stop: runners start no further record
        self.halted = False
        #: set while the member is fenced (``consumer.fencing``): runners start no further
        #: record and put what they hold back in the lane; cleared when contact returns
        self.fenced = False
        #: one entry per hand-off (or output) sent and not yet acknowledged: the one field
        #: written outside this class, by the hand-off step, from runner threads (appends) and
        #: delivery reports (pops) without a lock (each one step under the GIL; see
        #: ``HandOffStep``); ``handoffs`` is its length
        self.unacked: list[None] = []
        #: when the partition last made progress (assigned, records completed, or work
        #: dispatched while it held none): what the stall detector measures an idle partition
        #: from (``kworkers.consumer.stall``)
        self.progress_at = clock.monotonic()

    @property
    def handoffs(self) -> int:
        """Hand-offs and outputs sent and not yet acknowledged."""
        return len(self.unacked)

    def all_lanes(self) -> list[Lane]:
        return list(self.lanes.values())

    # The flags change only here (``unacked`` aside, see above). Each setter is one attribute
    # store (atomic under the GIL): safe from any thread; ``mark_halted`` from a signal handler
    # too, which ``halt`` is not (it drops lane queues, the poll thread's).

    def mark_halted(self) -> None:
        """No further record starts (a graceful stop); the poll thread's drain does the rest."""
        self.halted = True

    def set_fenced(self, fenced: bool) -> None:
        self.fenced = fenced

    def progressed(self, now: float) -> None:
        """Progress made at ``now`` (monotonic): the stall detector measures idleness from it."""
        self.progress_at = now

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
            lane.drop_queue()

    def running(self) -> int:
        """Work under way: lanes whose runner is busy, and unacknowledged hand-offs."""
        return self.handoffs + sum(1 for lane in self.all_lanes() if lane.running)

    def prune_idle_lanes(self) -> None:
        for key, lane in list(self.lanes.items()):
            with lane.lock:
                if lane.idle():
                    del self.lanes[key]


class PartitionState(Partition):
    """A consumer group's partition, owned by the poll thread: offsets, its lanes, pause."""

    __slots__ = ("caught_up_at", "held", "lane", "paused", "stamps", "tracker")

    def __init__(self, topic: str, partition: int, clock: Clock = _SYSTEM_CLOCK) -> None:
        super().__init__(topic, partition, clock)
        self.tracker = OffsetTracker()
        #: the times of what it fetched, for its time lag (``time_lag``)
        self.stamps = Stamps()
        #: when it was last seen with nothing outstanding (epoch seconds; ``time_lag``)
        self.caught_up_at: float | None = None
        self.lane = Lane(self)  # the partition lane (ordering="partition")
        self.paused = False
        #: at its share and held rather than paused: the loop polls nothing meanwhile
        #: (``backpressure``; never paused and held at once)
        self.held = False

    def set_held(self, held: bool) -> None:
        """Held at its share instead of paused (``backpressure``)."""
        self.held = held

    def saw_caught_up(self, now: float) -> None:
        """Nothing outstanding at ``now``: what time lag is measured from (``lag_view``)."""
        self.caught_up_at = now

    def held_bytes(self) -> int:
        """What the partition's window costs in memory, as backpressure counts it: its records'
        keys, values and headers (``kworkers.memory.record_sizes``) and ``RECORD_COST`` each."""
        tr = self.tracker
        return tr.window_bytes + RECORD_COST * tr.window

    def lane_for(self, key: bytes | None) -> Lane:
        """The key lane of ``key`` (ordering="key")."""
        lane = self.lanes.get(key)
        if lane is None:
            lane = self.lanes[key] = Lane(self)
        return lane

    def all_lanes(self) -> list[Lane]:
        return [self.lane, *self.lanes.values()]
