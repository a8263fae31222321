"""The hand-off step of an exactly-once loop: nothing is sent now, everything waits for the
transaction that commits its record's offset.

At least once (``handoff``), a failed attempt's tier record and a successful call's outputs are
produced at once and their record completes on acknowledgement. Here they go into the loop's
``OutputBuffer`` and the record completes at once: its offset, its outputs and its hand-off are
then committed together, by the loop's next transaction (``transactional``), or not at all. A
worker killed before that commit leaves nothing visible to read_committed readers, and the
records run again on the next owner.

The buffer is bounded (``limit`` outputs): a loop whose transactions cannot commit (a frozen
broker) makes its runners wait for room instead of holding outputs without end.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from queue import SimpleQueue

from kworkers.clock import Clock
from kworkers.consumer.failure_log import FailureLog
from kworkers.consumer.handoff import plan_hand_off
from kworkers.consumer.outputs import Emitted, Entry, Output, OutputBuffer
from kworkers.consumer.partition import Partition
from kworkers.consumer.ports import Completion
from kworkers.errors import HandOffError, failure_type
from kworkers.message import Message
from kworkers.metrics import Metrics
from kworkers.retry_tiers.router import FailureRouter, HandOff
from kworkers.supervision import Supervisor

log = logging.getLogger("kworkers.handoff")


def _output(plan: HandOff) -> Output:
    return Output(plan.topic, plan.key, plan.value, plan.headers)


class BufferedHandOffs:
    def __init__(self, router: FailureRouter, buffer: OutputBuffer, metrics: Metrics,
                 group: str, completions: SimpleQueue[Completion], stop: threading.Event,
                 supervisor: Supervisor, limit: int, clock: Clock) -> None:
        self.router = router
        self.buffer = buffer
        self.metrics = metrics
        self.group = group
        self.completions = completions
        self.stop = stop
        self.supervisor = supervisor
        self.limit = limit
        self.failures = FailureLog(log, group, clock)

    def has_room(self) -> bool:
        return self.buffer.count < self.limit

    def wait_room(self, ps: Partition) -> bool:
        return self.buffer.wait_room(self.limit, lambda: ps.revoking or self.stop.is_set())

    def _room(self, ps: Partition) -> bool:
        """Room in the buffer, waited for when full (the count read without the lock first:
        the runners' common case takes no lock here)."""
        if ps.revoking or self.stop.is_set():
            return False
        return self.buffer.count < self.limit or self.wait_room(ps)

    def submit(self, ps: Partition, msg: Message, exc: BaseException) -> bool:
        if not self._room(ps):
            return False
        plan = plan_hand_off(self.router, msg, exc, self.supervisor)
        if plan is None:
            return False
        retry = plan.destination.retried
        self.buffer.add(ps, [Entry(msg.offset, msg, [_output(plan)], retried=int(retry),
                                   dead=int(not retry),
                                   falls_back=plan.destination.falls_back)])
        self.failures.handed(failure_type(exc), plan.topic)
        (self.metrics.retries if retry else self.metrics.dead_letters).labels(
            self.group, plan.label).inc()
        self.completions.put(Completion(ps, [msg.offset], int(retry), int(not retry), 0.0, 0))
        return True

    def emit(self, ps: Partition, emitted: list[Emitted],
             after: list[Callable[[], None]]) -> bool:
        if not self._room(ps):
            return False
        entries = [Entry(m.offset, m, outs) for m, outs in emitted]
        if after:  # the last record's transaction commits every record before it too
            last = entries[-1]
            entries[-1] = Entry(last.offset, last.msg, last.outputs, after=after)
        self.buffer.add(ps, entries)
        self.completions.put(Completion(ps, [e.offset for e in entries], 0, 0, 0.0, 0))
        return True

    def dead_letter(self, entry: Entry, err: BaseException) -> Entry:
        """An entry whose output (or tier record) the broker refused for good: its record goes
        to its own source's DLQ with the reason instead, in the next transaction."""
        topic = next((o.topic for o in entry.outputs), "?")
        log.warning("%s refused a record of %s/%d@%d for good (%s): dead-lettering the record "
                    "instead", topic, entry.msg.topic, entry.msg.partition, entry.msg.offset,
                    err)
        plan = self.router.dead_letter(entry.msg, HandOffError(f"{topic} refused: {err}"))
        self.metrics.dead_letters.labels(self.group, plan.label).inc()
        return Entry(entry.offset, entry.msg, [_output(plan)], dead=1,
                     falls_back=plan.destination.falls_back)

    def tick(self) -> None:
        self.failures.flush()

    def acknowledged(self) -> list[Completion]:
        return []  # completions are posted at once: the transaction holds the offsets
