"""The last check before a share record's handler runs: is its lock still long enough?

An ``Invoker`` around the worker's own (activity context, idempotency claim, recording): it runs
on the runner's thread at the moment the record would start, which is the only place that
knows, for a record fed to a lane behind others, when it really starts. A record too late to
finish under its lock is not run; it is marked, its runner reports it done like any record, and
the poll thread releases it instead of accepting it.
"""

from __future__ import annotations

from typing import Any

from kworkers.clock import Clock
from kworkers.consumer.ports import Handler, Invoker, Records
from kworkers.share.ports import RecordKey
from kworkers.share.rules import ShareRules


async def _skipped() -> None:
    return None


class LockGate:
    def __init__(self, inner: Invoker, rules: ShareRules, clock: Clock,
                 acquired: dict[RecordKey, float], is_async: bool) -> None:
        self.inner = inner
        self.rules = rules
        self.clock = clock
        #: record -> when it was acquired (the poll thread's; read here, never written)
        self.acquired = acquired
        self.is_async = is_async
        #: records refused here; the poll thread releases them (set.add is atomic)
        self.late: set[RecordKey] = set()

    def __call__(self, handler: Handler, msg: Records) -> Any:
        if isinstance(msg, list):  # batch handlers are refused in share mode (wiring)
            return self.inner(handler, msg)
        key = (msg.topic, msg.partition, msg.offset)
        at = self.acquired.get(key)
        if at is not None and self.clock.monotonic() > self.rules.latest_start(at):
            self.late.add(key)
            return _skipped() if self.is_async else None
        return self.inner(handler, msg)
