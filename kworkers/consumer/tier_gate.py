"""Retry-tier records wait in a timer heap until their due time, never running early.

Only the retry loop has a gate: it reads tier topics ahead into a bounded ``DelayBuffer`` and
releases each record when its ``kw-due-at`` passes, so records with different due times in one
tier complete out of order instead of blocking behind the head.

Tier records are checked before anything is believed (``retry_tiers.tier_record``): a record
whose kworkers headers are corrupt, out of bounds or name another origin is released at once as
``Poisoned`` (dead-lettered to its own source's DLQ with the reason); another consumer group's
retry (tier topics are shared by every group on a source) is completed without running, since
that group runs it.

The heap's bound: the records in the heap are fetched records not yet completed, so they count
in their partition's share (``backpressure``): each tier partition is paused at its share of
``capacity`` and one poll never takes more than the room left under it. The heap holds at most
``capacity`` plus ``max(capacity, partitions)`` (the overshoot ``backpressure`` explains), and
in practice about ``capacity`` plus one poll. The ``DelayBuffer`` is sized to that hard bound
(``resize`` follows the assignment); reaching it would mean the invariant broke, and its
``BufferError`` then stops the retry loop loudly (the worker turns unhealthy), never silently.

Per partition the gate keeps the due times of what it holds (``held``, ``earliest_due``): a
tier partition whose records wait for their due time is held on purpose, which the stall
detector must not take for a stall, but only until its earliest record is due: one still held
well past that (a timer that never fires) is a stall (``stall.overdue``). The dues are kept
apart from the heap, from what was admitted and released, so a heap that never gives a record
back is seen.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Iterable, Mapping
from typing import Protocol

from kworkers.clock import Clock
from kworkers.consumer.partition import Item, PartitionState, Poisoned
from kworkers.consumer.ports import TP
from kworkers.message import Message, with_attempt
from kworkers.retry_tiers.delay import DelayBuffer
from kworkers.retry_tiers.headers import due_at_of
from kworkers.retry_tiers.tier_record import CorruptTierRecord

log = logging.getLogger("kworkers.consumer")


class LatenessSink(Protocol):
    """Where the gate reports how late a record ran (a Prometheus histogram child)."""

    def observe(self, amount: float) -> None: ...


class Timed(Protocol):
    """What a check admits a record with: the attempt it runs as and when it is due."""

    @property
    def attempt(self) -> int: ...

    @property
    def due_at(self) -> float | None: ...


class RecordCheck(Protocol):
    """What a record read into the heap must satisfy: ``TierRules`` for retry tiers,
    ``kworkers.schedule.rules.ScheduleRules`` for a scheduler's delay topics. ``check``
    raises (``HeaderError``) for a corrupt or forged record, returns None for one that is not
    this worker's to run (completed unrun)."""

    def check(self, msg: Message, now: float) -> Timed | None: ...


class TierGate:
    def __init__(self, capacity: int, rules: RecordCheck, lateness: LatenessSink,
                 clock: Clock) -> None:
        #: what backpressure splits into the tier partitions' shares
        self.capacity = capacity
        self.buffer: DelayBuffer[tuple[PartitionState, Message]] = DelayBuffer(2 * capacity)
        #: due times of the records in the heap, per partition state (a heap each; by
        #: identity: a reassignment is another)
        self._dues: dict[PartitionState, list[float]] = {}
        #: what a tier record must satisfy to run (the router's own ``rules``)
        self.rules = rules
        #: another group's records completed unrun since the processor last took the count
        self.skipped = 0
        self.lateness = lateness
        self.clock = clock

    def __len__(self) -> int:
        return len(self.buffer)

    def resize(self, partitions: int) -> None:
        """The hard bound under an assignment of ``partitions`` (see the module doc)."""
        self.buffer.capacity = self.capacity + max(self.capacity, partitions)

    def held(self, ps: PartitionState) -> int:
        """How many of ``ps``'s records wait in the heap for their due time."""
        return len(self._dues.get(ps, ()))

    def earliest_due(self, ps: PartitionState) -> float | None:
        """When the earliest of ``ps``'s waiting records is due (epoch seconds); None: none
        waits."""
        dues = self._dues.get(ps)
        return dues[0] if dues else None

    def admit(self, ps: PartitionState, m: Message, now: float) -> Item | None:
        """The item to run now, or None when ``m`` waits in the heap until due (or is another
        group's, completed here on the poll thread, which owns the offset tracker)."""
        try:
            info = self.rules.check(m, now)
        except Exception as exc:  # HeaderError, or anything a check did not foresee: never
            # crash the loop over one record; it goes to its own DLQ with the reason. DEBUG: a
            # flood of corrupt records must not flood the log (the hand-off step summarises
            # what it dead-letters, with the error type, per interval)
            log.debug("%s/%d@%d has corrupt kworkers headers (%s): dead-lettering it",
                      m.topic, m.partition, m.offset, exc)
            return Poisoned(m, CorruptTierRecord(exc))
        if info is None:
            log.debug("%s/%d@%d is another group's retry: skipped", m.topic, m.partition,
                      m.offset)
            ps.tracker.complete(m.offset)
            ps.progressed(self.clock.monotonic())
            self.skipped += 1
            return None
        m = with_attempt(m, info.attempt)
        due = info.due_at
        if due is not None and due > now:
            self.buffer.push(due, (ps, m))
            heapq.heappush(self._dues.setdefault(ps, []), due)
            return None
        if due is not None:
            self.lateness.observe(max(0.0, now - due))
        return m

    def take_skipped(self) -> int:
        """How many records were skipped since the last call (they count towards a commit)."""
        n, self.skipped = self.skipped, 0
        return n

    def release_due(
        self, parts: Mapping[TP, PartitionState]
    ) -> list[tuple[PartitionState, Message]]:
        """Records now due whose partition is still owned under the same assignment."""
        if not len(self.buffer):
            return []
        now = self.clock.now()
        out: list[tuple[PartitionState, Message]] = []
        dues = self._dues
        for ps, m in self.buffer.pop_due(now):
            mine = dues.get(ps)
            if mine:
                heapq.heappop(mine)  # the heap gives a partition's records in due order
                if not mine:
                    del dues[ps]
            if parts.get(ps.tp) is not ps:
                continue
            d = due_at_of(m.headers)
            if d is not None:
                self.lateness.observe(max(0.0, now - d))
            out.append((ps, m))
        return out

    def wait_bound(self, default: float) -> float:
        """How long the poll may block without making the next due record late."""
        due = self.buffer.next_due()
        if due is None:
            return default
        return max(0.0, min(default, due - self.clock.now()))

    def forget(self, targets: Iterable[PartitionState]) -> None:
        states = list(targets)
        gone = {id(ps) for ps in states}
        if gone:
            self.buffer.drop(lambda item: id(item[0]) in gone)
            for ps in states:
                self._dues.pop(ps, None)
