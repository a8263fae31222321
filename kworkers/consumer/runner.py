"""How a lane's records are run: one skeleton for sync and async handlers.

``Runner.steps`` is the whole lifecycle of a runner over a lane, written once as a generator: it
yields each record whose handler must run (the runtime runs it and sends back the exception, or
None) and each failure to hand off (the runtime performs the hand-off and sends back where the
record went, or None). A thread pool drives it with plain calls, an asyncio loop with awaits
(``kworkers.consumer.runtime``), so revoke checks, deadlines, progress reports and the hand-off
rule live in one place, not in two near-copies.

A runner reports completions to the poll thread through the completion queue: per batch, or
sooner within a slow batch, so a revoke or a crash soon after does not redeliver the fast records
ahead of a slow one.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from queue import Empty, SimpleQueue

from kworkers.clock import Clock
from kworkers.consumer.batching import BatchPolicy
from kworkers.consumer.breaker import Breaker
from kworkers.consumer.partition import Item, Lane, PartitionState, Poisoned
from kworkers.consumer.ports import Completion, Handler, Invoker
from kworkers.consumer.steps import (
    WAIT,
    HandOffRequest,
    HandOffs,
    Progress,
    Runtime,
    Steps,
    TimedOut,
)
from kworkers.errors import BatchError
from kworkers.message import Message

#: the lane whose runner is calling the handler (the activity context reads it for fencing and
#: for heartbeats that extend the message deadline)
current_lane: contextvars.ContextVar[Lane | None] = contextvars.ContextVar(
    "kworkers_lane", default=None)


class Runner:
    """Runs one processor's lanes on a shared runtime and reports to its completion queue."""

    def __init__(self, handler: Handler, invoke: Invoker, hand_offs: HandOffs, runtime: Runtime,
                 clock: Clock, message_timeout: float | None, done: SimpleQueue[Completion],
                 breaker: Breaker | None = None,
                 retryable: Callable[[BaseException], bool] = lambda _e: True,
                 batch: BatchPolicy | None = None) -> None:
        self.handler = handler
        self.invoke = invoke
        self.hand_offs = hand_offs
        self.runtime = runtime
        self.clock = clock
        self.timeout = message_timeout
        #: sync handlers on threads are watched by the poll thread's deadline watchdog (async
        #: ones are bounded by ``asyncio.wait_for``, inline ones when their call returns)
        self.watched = (message_timeout is not None and not runtime.is_async
                        and not runtime.is_inline)
        #: where runners and the hand-off step report completions to the poll thread
        self.done = done
        self.breaker = breaker
        #: whether a failure counts against the dependency (the breaker ignores bad input)
        self.retryable = retryable
        #: set for a batch handler: how its batches are cut
        self.batch = batch

    def start(self, lane: Lane, items: list[Item], inc: int,
              timed_out: TimedOut | None = None) -> None:
        self.runtime.run(self, lane, items, inc, timed_out)

    def hand_off(self, ps: PartitionState, msg: Message, exc: BaseException) -> bool:
        return self.hand_offs.submit(ps, msg, exc)

    def completions(self, block: float = 0.0) -> Iterator[Completion]:
        """The completions reported so far, for the poll thread; with ``block`` it waits that
        long for the first one (the loop's idle wait)."""
        q = self.done
        try:
            yield q.get(timeout=block) if block > 0 else q.get_nowait()
            while True:
                yield q.get_nowait()
        except Empty:
            return

    def steps(self, lane: Lane, batch: list[Item], inc: int,
              timed_out: TimedOut | None) -> Steps:
        """A runner's whole pass over ``lane``, starting with ``batch`` (see the module doc).

        ``timed_out`` is the record (or batch) the deadline watchdog took this lane from a stuck
        runner for: it is handed off as a TimeoutError first. Whenever the lane's incarnation
        moves on (the watchdog took it), this runner stops and its later results are fenced.
        """
        if self.batch is not None:
            return self._batch_steps(lane, batch, inc, timed_out, self.batch)
        return self._record_steps(lane, batch, inc, timed_out)

    def _timed_out(self, timed_out: TimedOut) -> list[HandOffRequest]:
        records = timed_out if isinstance(timed_out, list) else [timed_out]
        what = "batch" if self.batch is not None else "handler"
        return [HandOffRequest(m, TimeoutError(f"{what} exceeded its {self.timeout}s deadline"))
                for m in records]

    def _record_steps(self, lane: Lane, batch: list[Item], inc: int,
                      timed_out: TimedOut | None) -> Steps:
        ps = lane.part
        watched = self.watched
        breaker = self.breaker
        now = self.clock.monotonic
        prog = Progress(self.done, lane, self.clock)
        for req in self._timed_out(timed_out) if timed_out is not None else ():
            if not (yield req):
                prog.finish(inc)
                return
        while True:
            stopped = False
            for i, item in enumerate(batch):
                if ps.halted:
                    stopped = True
                    break
                err: BaseException | None
                if isinstance(item, Poisoned):
                    msg, err = item.msg, item.exc
                else:
                    if breaker is not None and not breaker.admit():
                        prog.hold(inc, batch[i:])
                        return
                    msg = item
                    if watched:
                        with lane.lock:
                            if lane.incarnation != inc:
                                break
                            lane.current, lane.started, lane.batch, lane.pos = (
                                msg, now(), batch, i)
                    err = yield msg
                    if breaker is not None:
                        breaker.record(
                            True if err is None else False if self.retryable(err) else None)
                if watched and lane.incarnation != inc:
                    break  # the deadline already routed this record: a late result, fenced
                if err is None:
                    prog.record(msg.offset)
                elif not (yield HandOffRequest(msg, err)):
                    stopped = True
                    break
            if watched and lane.incarnation != inc:
                prog.post()
                return
            if watched:
                lane.current = None
            if stopped:
                prog.finish(inc)
                return
            prog.post()
            nxt = self._next_batch(lane, inc)
            if nxt is None:
                return
            batch = nxt

    def _batch_steps(self, lane: Lane, items: list[Item], inc: int,
                     timed_out: TimedOut | None, policy: BatchPolicy) -> Steps:
        """The runner of a batch handler: batches of at most ``max_size`` records of the lane,
        poisoned records handed off on their own first. Returning completes the whole batch; a
        ``BatchError`` hands off the records it names and completes the rest; any other
        exception hands off every record of the batch."""
        ps = lane.part
        watched, breaker, now = self.watched, self.breaker, self.clock.monotonic
        prog = Progress(self.done, lane, self.clock)
        for req in self._timed_out(timed_out) if timed_out is not None else ():
            if not (yield req):
                prog.finish(inc)
                return
        pending = items
        while True:
            if policy.max_wait_s is not None and len(pending) < policy.max_size:
                until = now() + policy.max_wait_s
                while len(pending) < policy.max_size and not ps.halted and now() < until:
                    more = self._take(lane, inc, policy.max_size - len(pending))
                    if more is None:
                        return  # the watchdog took the lane
                    if more:
                        pending = pending + more
                    else:
                        yield WAIT
            if ps.halted:
                prog.finish(inc)
                return
            chunk, pending = pending[:policy.max_size], pending[policy.max_size:]
            records: list[Message] = []
            for item in chunk:
                if isinstance(item, Poisoned):
                    if not (yield HandOffRequest(item.msg, item.exc)):
                        prog.finish(inc)
                        return
                else:
                    records.append(item)
            if records:
                if breaker is not None and not breaker.admit():
                    prog.hold(inc, [*records, *pending])
                    return
                if watched:
                    with lane.lock:
                        if lane.incarnation != inc:
                            return
                        lane.current, lane.chunk, lane.started = records[0], records, now()
                        lane.batch, lane.pos = pending, -1
                err = yield records
                if watched:
                    if lane.incarnation != inc:
                        prog.post()
                        return  # the deadline already routed this batch: late, fenced
                    lane.current, lane.chunk = None, None
                if breaker is not None:
                    breaker.record(
                        True if err is None else False if self.retryable(err) else None)
                failed: dict[Message, BaseException] = {}
                if isinstance(err, BatchError):
                    failed = err.failures
                elif err is not None:
                    failed = {m: err for m in records}
                for m in records:
                    exc = failed.get(m)
                    if exc is None:
                        prog.record(m.offset)
                    elif not (yield HandOffRequest(m, exc)):
                        prog.finish(inc)
                        return
            prog.post()
            if not pending:
                nxt = self._next_batch(lane, inc)
                if nxt is None:
                    return
                pending = nxt

    @staticmethod
    def _take(lane: Lane, inc: int, n: int) -> list[Item] | None:
        """Up to ``n`` more queued records for the batch being filled (None: lane taken)."""
        with lane.lock:
            if lane.incarnation != inc:
                return None
            more, lane.queue = lane.queue[:n], lane.queue[n:]
            return more

    @staticmethod
    def _next_batch(lane: Lane, inc: int) -> list[Item] | None:
        with lane.lock:
            if lane.incarnation != inc:
                return None
            if lane.queue and not lane.part.halted:
                batch, lane.queue = lane.queue, []
                return batch
            lane.running = False
            return None
