"""From a fetched batch to lanes: track offsets, pick each record's lane, start idle lanes.

A lane is an ordered queue run by one runner at a time: one per partition
(``ordering="partition"``) or one per key (``ordering="key"``, records of a key in order, keys
in parallel). Records of a revoked partition are dropped here (the next owner reads them
again); a refetch after pause/resume is recognised by the offset tracker and not run twice.
Each record's size is tracked with its offset (``kworkers.memory.record_sizes``, in C), so
backpressure bounds bytes as well as records.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import groupby
from operator import itemgetter

from kworkers.clock import Clock
from kworkers.consumer.partition import Item, Lane, PartitionState
from kworkers.consumer.ports import TP
from kworkers.consumer.runner import Runner
from kworkers.consumer.tier_gate import TierGate
from kworkers.memory import record_sizes
from kworkers.message import Message
from kworkers.retry_tiers.headers import HeaderError, due_at_of

#: key lanes that went idle are pruned every this many dispatched batches
PRUNE_EVERY = 100

_TP = itemgetter(0, 1)  # a Message's (topic, partition)
_OFFSET = itemgetter(2)


def _time_of(m: Message, gated: bool) -> float | None:
    """What a record's time lag counts from (``time_lag``): its ``kw-due-at`` in a gated loop
    (retry tiers, schedule rungs), else its Kafka timestamp."""
    if gated:
        try:
            return due_at_of(m.headers)
        except HeaderError:
            return None  # corrupt: dead-lettered at once by the gate, never waits
    return None if m.timestamp_ms is None else m.timestamp_ms / 1000.0


class Dispatcher:
    def __init__(self, parts: Mapping[TP, PartitionState], runner: Runner, key_mode: bool,
                 gate: TierGate | None, clock: Clock) -> None:
        self.parts = parts
        self.runner = runner
        self.key_mode = key_mode
        self.gate = gate
        self.clock = clock
        self._batches = 0
        #: keys, values and headers of the records the last ``dispatch`` tracked
        self.dispatched_bytes = 0

    def dispatch(self, msgs: list[Message]) -> None:
        parts = self.parts
        # Group by partition first: one tracker call and one lane hand-off per partition, not
        # per record (the hot path).
        # A fetch comes in runs of one partition: grouped run by run, in C (``groupby`` keyed
        # by ``itemgetter``), so the Python here runs per run, not per record.
        by_tp: dict[TP, list[Message]] = {}
        for tp, run in groupby(msgs, _TP):
            group = by_tp.get(tp)
            if group is None:
                by_tp[tp] = list(run)
            else:
                group.extend(run)
        key_mode, gate = self.key_mode, self.gate
        dispatched = 0
        now = self.clock.now()
        mono = self.clock.monotonic
        for tp, group in by_tp.items():
            ps = parts.get(tp)
            if ps is None:
                continue  # fetched before a revoke: the new owner reads it again
            offsets = list(map(_OFFSET, group))
            tracker = ps.tracker
            if not tracker.window:  # work for an idle partition: its stall clock restarts
                ps.progressed(mono())
            before = tracker.bytes_in
            tracked = tracker.track_many(offsets, record_sizes(group))
            dispatched += tracker.bytes_in - before
            if len(tracked) != len(offsets):  # a refetch after pause/resume
                keep = set(tracked)
                group = [m for m in group if m[2] in keep]
            if group:  # once per run, not per record: the times of its ends (``time_lag``)
                first, last = group[0], group[-1]
                ps.stamps.add(first.offset, _time_of(first, gate is not None), last.offset,
                              _time_of(last, gate is not None))
            if gate is None and not key_mode:
                self.enqueue(ps.lane, list(group))
                continue
            lanes: dict[Lane, list[Item]] = {}
            for m in group:
                item: Item | None = m if gate is None else gate.admit(ps, m, now)
                if item is None:
                    continue  # waits in the timer heap
                lane = ps.lane_for(m.key) if key_mode else ps.lane
                lanes.setdefault(lane, []).append(item)
            for lane, items in lanes.items():
                self.enqueue(lane, items)
        self.dispatched_bytes = dispatched
        self._batches += 1
        if key_mode and self._batches % PRUNE_EVERY == 0:
            for p in parts.values():
                p.prune_idle_lanes()

    def release(self, due: list[tuple[PartitionState, Message]]) -> None:
        """Tier records whose due time came (see ``TierGate.release_due``)."""
        groups: dict[Lane, list[Item]] = {}
        for ps, m in due:
            lane = ps.lane_for(m.key) if self.key_mode else ps.lane
            groups.setdefault(lane, []).append(m)
        for lane, items in groups.items():
            self.enqueue(lane, items)

    def enqueue(self, lane: Lane, items: list[Item]) -> None:
        start = lane.offer(items)
        if start is not None:
            self.runner.start(lane, *start)

    def kick(self) -> None:
        """Restarts lanes that hold records but no runner (held while the breaker was open)."""
        for ps in list(self.parts.values()):
            if ps.halted:
                continue
            for lane in ps.all_lanes():
                if lane.held():
                    self.enqueue(lane, [])
