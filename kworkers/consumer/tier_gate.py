"""Retry-tier records wait in a timer heap until their due time, never running early.

Only the retry loop has a gate: it reads tier topics ahead into a bounded ``DelayBuffer`` and
releases each record when its ``kw-due-at`` passes, so records with different due times in one
tier complete out of order instead of blocking behind the head.

Tier records are checked before anything is believed (``retry_tiers.tier_record``): a record
whose kworkers headers are corrupt, out of bounds or name another origin is released at once as
``Poisoned`` (dead-lettered to its own source's DLQ with the reason); another consumer group's
retry (tier topics are shared by every group on a source) is completed without running, since
that group runs it.

The heap's bound: backpressure pauses every tier partition at the end of the poll step in which
the heap reached ``capacity``, and a paused partition returns no records, so the heap holds at
most ``capacity`` plus one fetched batch (``overshoot``). Records beyond it stay in Kafka. The
``DelayBuffer`` is sized to that hard bound; reaching it would mean the invariant broke, and its
``BufferError`` then stops the retry loop loudly (the worker turns unhealthy), never silently.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Protocol

from kworkers.clock import Clock
from kworkers.consumer.partition import Item, PartitionState, Poisoned
from kworkers.consumer.ports import TP
from kworkers.message import Message
from kworkers.retry_tiers.delay import DelayBuffer
from kworkers.retry_tiers.headers import due_at_of
from kworkers.retry_tiers.tier_record import TierRules, check_tier_record

log = logging.getLogger("kworkers.consumer")


class LatenessSink(Protocol):
    """Where the gate reports how late a record ran (a Prometheus histogram child)."""

    def observe(self, amount: float) -> None: ...


class TierGate:
    def __init__(self, capacity: int, overshoot: int, rules: TierRules, lateness: LatenessSink,
                 clock: Clock) -> None:
        #: where backpressure pauses the tier partitions
        self.capacity = capacity
        self.buffer: DelayBuffer[tuple[PartitionState, Message]] = DelayBuffer(
            capacity + overshoot)
        #: what a tier record must satisfy to run (the router's own ``rules``)
        self.rules = rules
        #: another group's records completed unrun since the processor last took the count
        self.skipped = 0
        self.lateness = lateness
        self.clock = clock

    def __len__(self) -> int:
        return len(self.buffer)

    def admit(self, ps: PartitionState, m: Message, now: float) -> Item | None:
        """The item to run now, or None when ``m`` waits in the heap until due (or is another
        group's, completed here on the poll thread, which owns the offset tracker)."""
        try:
            info = check_tier_record(m, self.rules, now)
        except Exception as exc:  # HeaderError, or anything a check did not foresee: never
            # crash the loop over one record; it goes to its own DLQ with the reason. DEBUG: a
            # flood of corrupt records must not flood the log (the hand-off step summarises
            # what it dead-letters, with the error type, per interval)
            log.debug("%s/%d@%d has corrupt kworkers headers (%s): dead-lettering it",
                      m.topic, m.partition, m.offset, exc)
            return Poisoned(m, exc)
        if info is None:
            log.debug("%s/%d@%d is another group's retry: skipped", m.topic, m.partition,
                      m.offset)
            ps.tracker.complete(m.offset)
            self.skipped += 1
            return None
        m = m._replace(attempt=info.attempt)
        due = info.due_at
        if due is not None and due > now:
            self.buffer.push(due, (ps, m))
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
        for ps, m in self.buffer.pop_due(now):
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
        gone = {id(ps) for ps in targets}
        if gone:
            self.buffer.drop(lambda item: id(item[0]) in gone)
