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
from collections.abc import Callable, Generator, Iterator
from queue import Empty, SimpleQueue
from typing import Any, Protocol

from kworkers.clock import Clock
from kworkers.consumer.batching import BatchPolicy
from kworkers.consumer.breaker import Breaker
from kworkers.consumer.partition import Item, Lane, PartitionState, Poisoned
from kworkers.consumer.ports import Completion, Handler, Invoker
from kworkers.errors import BatchError
from kworkers.message import Message

#: a runner reports completions at least this often within a long batch
PARTIAL_POST_S = 0.05

#: the lane whose runner is calling the handler (the activity context reads it for fencing and
#: for heartbeats that extend the message deadline)
current_lane: contextvars.ContextVar[Lane | None] = contextvars.ContextVar(
    "kworkers_lane", default=None)


class HandOffRequest:
    """Asked of the runtime by ``Runner.steps``: hand this failed attempt off."""

    __slots__ = ("exc", "msg")

    def __init__(self, msg: Message, exc: BaseException) -> None:
        self.msg = msg
        self.exc = exc


class Wait:
    """Asked of the runtime by a batch runner filling a batch: pause a moment (sleep or await)."""

    SECONDS = 0.002


WAIT = Wait()
#: what ``Runner.steps`` yields: a record (or a batch of records) to run, a failure to hand off,
#: or a short wait while a batch fills
Request = Message | list[Message] | HandOffRequest | Wait
#: sent back: the handler's exception (or None) for a record or a batch; for a hand-off, True
#: when the hand-off step took it (it completes the offset on acknowledgement), False when
#: abandoned; nothing for a wait
Steps = Generator[Request, Any, None]
#: the record a watchdog took a lane for, or the whole batch
TimedOut = Message | list[Message]


class HandOffs(Protocol):
    """The hand-off step as runners see it (``kworkers.retry_tiers.handoff.HandOffStep``)."""

    def has_room(self) -> bool: ...
    def wait_room(self, ps: PartitionState) -> bool: ...
    def submit(self, ps: PartitionState, msg: Message, exc: BaseException) -> bool: ...
    def tick(self) -> None:
        """Called by the poll loop every step (retries due, summaries)."""
        ...


class Runtime(Protocol):
    """Where runners execute: ``ThreadRuntime`` (sync handlers) or ``AsyncRuntime``."""

    is_async: bool
    #: runners execute on the thread that starts them (the poll thread)
    is_inline: bool

    def run(self, runner: Runner, lane: Lane, items: list[Item], inc: int,
            timed_out: TimedOut | None) -> None: ...

    def alive(self) -> bool: ...

    def stalled(self, bound: float) -> str | None:
        """A handler call (or the event loop) busy for longer than ``bound`` s, described."""
        ...

    def shutdown(self) -> None: ...


class Progress:
    """A runner's handled offsets not yet reported (hand-offs report their own on
    acknowledgement).

    ``lane.done`` always names the current list, so a revoke can collect it from a runner that
    is stuck on a later record.
    """

    __slots__ = ("done", "lane", "now", "q", "t0")

    def __init__(self, q: SimpleQueue[Completion], lane: Lane, clock: Clock) -> None:
        self.q = q
        self.lane = lane
        self.now = clock.monotonic
        self._reset()

    def _reset(self) -> None:
        self.done: list[int] = []
        self.lane.done = self.done
        self.t0 = self.now()

    def record(self, offset: int) -> None:
        self.done.append(offset)
        if self.now() - self.t0 > PARTIAL_POST_S:
            self.post()

    def post(self) -> None:
        if self.done:
            self.q.put((self.lane.part, self.done, 0, 0, self.now() - self.t0))
        self._reset()

    def finish(self, inc: int) -> None:
        """The runner stops early (revoke, stop, abandoned hand-off): report, drop the queue."""
        self.post()
        lane = self.lane
        with lane.lock:
            if lane.incarnation == inc:
                lane.queue = []
                lane.running = False

    def hold(self, inc: int, rest: list[Item]) -> None:
        """The breaker is open: report, and put the records not started back at the head of
        the lane (in order); the poll loop restarts the lane when the breaker admits again."""
        self.post()
        lane = self.lane
        with lane.lock:
            if lane.incarnation == inc:
                lane.queue = rest + lane.queue
                lane.running = False


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
