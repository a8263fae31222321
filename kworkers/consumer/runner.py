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
import time
from collections.abc import Callable, Generator, Iterator
from queue import Empty, SimpleQueue
from typing import Any, cast

from kworkers.clock import Clock
from kworkers.consumer.batching import BatchPolicy
from kworkers.consumer.breaker import Breaker
from kworkers.consumer.outputs import Sink, current_sink, of_batch, of_record
from kworkers.consumer.partition import Item, Lane, Partition, Poisoned
from kworkers.consumer.ports import Completion, Handler, Invoker
from kworkers.consumer.steps import (
    WAIT,
    Decoder,
    DecodeRequest,
    EmitRequest,
    HandOffRequest,
    HandOffs,
    LeaseWait,
    Pacer,
    PaceRequest,
    Progress,
    Request,
    Runtime,
    Steps,
    TimedOut,
)
from kworkers.errors import BatchError, LeaseBusy, keep_checkpoint
from kworkers.message import Message

#: a runner gives its thread up after this long on one lane when other runners wait for one
#: (``Runtime.contended``): fairness between lanes under a backlog, at the cost of one
#: hand-over between threads per quantum
QUANTUM_S = 0.02

#: the lane whose runner is calling the handler (the activity context reads it for fencing and
#: for heartbeats that extend the message deadline)
current_lane: contextvars.ContextVar[Lane | None] = contextvars.ContextVar(
    "kworkers_lane", default=None)


#: sent in place of a handler's result once its outputs went to the hand-off step
_EMITTED = BaseException("outputs emitted")
#: what a pass leaves in its batch where a record it finished was
_SPENT = cast("Item", None)

#: a record whose key another attempt holds (``LeaseBusy``) waits in its lane for the lease's
#: end, asking again at least this often (the holder may finish sooner), and no attempt is
#: spent; False only in the canary that shows the lease test has teeth (the rule before issue
#: #43: a busy lease was a failed attempt, and a short policy dead-lettered it as LeaseBusy)
LEASES_WAIT = True
RECLAIM_S = 1.0
#: how long after the lease's end it asks again (the store's clock and this one may differ)
LEASE_SLACK_S = 0.05

#: what a lease wait may end in besides the handler's result
_HALTED = BaseException("halted while waiting for a lease")
_FENCED = BaseException("fenced while waiting for a lease")
_TAKEN = BaseException("the lane was taken over while waiting for a lease")


def _sink() -> Sink:
    """A runner pass's output sink, where ``activity.produce`` appends during each call (one
    per pass, not per call: a call stuck past its deadline keeps writing to a pass its lane
    has left)."""
    sink = Sink()
    current_sink.set(sink)
    return sink


class Runner:
    """Runs one processor's lanes on a shared runtime and reports to its completion queue."""

    def __init__(self, handler: Handler, invoke: Invoker, hand_offs: HandOffs, runtime: Runtime,
                 clock: Clock, message_timeout: float | None, done: SimpleQueue[Completion],
                 breaker: Breaker | None = None,
                 retryable: Callable[[BaseException], bool] = lambda _e: True,
                 batch: BatchPolicy | None = None, decoder: Decoder | None = None,
                 pacer: Pacer | None = None) -> None:
        self.handler = handler
        self.invoke = invoke
        self.hand_offs = hand_offs
        self.runtime = runtime
        self.clock = clock
        self.timeout = message_timeout
        #: sync handlers on threads are watched by the poll thread's deadline watchdog (async
        #: ones by their runtime's deadline sweep, inline ones when their call returns)
        self.watched = (message_timeout is not None and not runtime.is_async
                        and not runtime.is_inline)
        #: where runners and the hand-off step report completions to the poll thread
        self.done = done
        self.breaker = breaker
        #: whether a failure counts against the dependency (the breaker ignores bad input)
        self.retryable = retryable
        #: set for a batch handler: how its batches are cut
        self.batch = batch
        #: the worker's deserializers: each record is decoded before its handler (and its
        #: deadline) starts; the handler sees the decoded copy, hand-offs the original
        self.decoder = decoder
        #: the worker's rate limit: each record takes a token before it starts (after its
        #: decoding, before its deadline)
        self.pacer = pacer
        #: a record whose key another attempt holds waits in its lane (nothing may wait on the
        #: poll thread: an inline handler's is retried as a failure instead)
        self.waits_leases = LEASES_WAIT and not runtime.is_inline
        #: the lanes waiting for a lease now: lane -> (partition, the lease's end, monotonic)
        self._leases: dict[Lane, tuple[tuple[str, int], float]] = {}

    def lease_waits(self) -> dict[tuple[str, int], float]:
        """The partitions whose next record waits for another attempt's lease, with the
        earliest end of those leases (monotonic): a hold until then (``Hold.LEASE``)."""
        out: dict[tuple[str, int], float] = {}
        for _ in range(3):  # runners change the dict meanwhile
            try:
                waits = list(self._leases.values())
                break
            except RuntimeError:
                continue
        else:
            return out
        for tp, end in waits:
            out[tp] = min(end, out.get(tp, end))
        return out

    def _lease_wait(self, lane: Lane, busy: LeaseBusy) -> Generator[Request, Any, bool]:
        """Waits (yields ``LeaseWait``) until ``busy``'s lease ends or ``RECLAIM_S`` passed;
        False when the partition halted or fenced meanwhile."""
        clock = self.clock
        left = max(0.0, busy.until - clock.now())
        self._leases[lane] = (lane.part.tp, clock.monotonic() + left)
        try:
            waited: bool = yield LeaseWait(min(left + LEASE_SLACK_S, RECLAIM_S))
        finally:
            self._leases.pop(lane, None)
        return waited

    def _run_again(self, lane: Lane, inc: int, msg: Message, shown: Message,
                   batch: list[Item], i: int, busy: LeaseBusy
                   ) -> Generator[Request, Any, BaseException | None]:
        """A record whose key another attempt holds: wait, run it again, until it runs (its
        result) or the wait ends another way (``_HALTED``, ``_FENCED``, ``_TAKEN``)."""
        watched, now = self.watched, self.clock.monotonic
        err: BaseException | None = busy
        while isinstance(err, LeaseBusy):
            if watched:
                lane.end()  # no deadline runs while it waits
            if not (yield from self._lease_wait(lane, err)):
                return _HALTED if _halted(lane.part) else _FENCED
            if watched and not lane.begin(inc, msg, now(), batch, i):
                return _TAKEN
            err = yield shown
        return err

    def start(self, lane: Lane, items: list[Item], inc: int,
              timed_out: TimedOut | None = None) -> None:
        self.runtime.run(self, lane, items, inc, timed_out)

    def hand_off(self, ps: Partition, msg: Message, exc: BaseException) -> bool:
        return self.hand_offs.submit(ps, msg, exc)

    def emit(self, ps: Partition, req: EmitRequest) -> bool:
        return self.hand_offs.emit(ps, req.emitted, req.after)

    def completions(self, block: float = 0.0, settle: float = 0.0) -> Iterator[Completion]:
        """The completions reported so far, for the poll thread; with ``block`` it waits that
        long for the first one (the loop's idle wait), and then ``settle`` more before taking
        the rest: hand-offs complete one record at a time, and a loop woken by each would run
        its whole step per record (a storm's CPU per failed record went from 37 to 68 us)."""
        q = self.done
        try:
            if block > 0:
                first = q.get(timeout=block)
                if settle > 0:
                    time.sleep(settle)
                yield first
            else:
                yield q.get_nowait()
            while True:
                yield q.get_nowait()
        except Empty:
            pass
        yield from self.hand_offs.acknowledged()

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
        decoding = self.decoder is not None
        pacer = self.pacer
        fixed = pacer.fixed if pacer is not None else None
        #: tokens this runner holds: how many, of which bucket, good until when
        tokens, bucket, until = 0, "", 0.0
        prog = Progress(self.done, lane, self.clock)
        sink = _sink()
        for req in self._timed_out(timed_out) if timed_out is not None else ():
            if not (yield req):
                prog.finish(inc)
                return
        while True:
            stopped = False
            rest: list[Item] | None = None
            t_pass = now()
            # by index, not ``enumerate``: its iterator and the list's are two more objects
            # alive per pass (the collector's walk, issue #50); nothing else writes ``batch``
            for i in range(len(batch)):
                item = batch[i]
                if ps.halted or ps.fenced:
                    if ps.halted:
                        stopped = True
                        break
                    prog.hold(inc, batch[i:])  # fenced: back in the lane until contact
                    return
                err: BaseException | None
                if isinstance(item, Poisoned):
                    msg, err = item.msg, item.exc
                else:
                    if breaker is not None and not breaker.admit():
                        prog.hold(inc, batch[i:])
                        return
                    msg = item
                    shown: Message | BaseException = item
                    if decoding:
                        got = yield DecodeRequest(msg)
                        if got is None:  # halted while the registry was away
                            stopped = True
                            break
                        shown = got
                    if isinstance(shown, BaseException):
                        err = shown  # cannot be decoded: dead-lettered, no handler call
                    else:
                        if pacer is not None:
                            name = fixed if fixed is not None else pacer.bucket_of(shown)
                            if name is None:
                                pass  # the record's name function exempts it
                            elif tokens and name == bucket and now() < until:
                                tokens -= 1
                            else:
                                got = yield PaceRequest(
                                    ps.tp, name, len(batch) - i if fixed is not None else 1)
                                if got is None:  # halted or fenced while it waited
                                    if _halted(ps):
                                        stopped = True
                                        break
                                    prog.hold(inc, batch[i:])
                                    return
                                tokens, bucket, until = got.count - 1, name, got.until
                        if watched and not lane.begin(inc, msg, now(), batch, i):
                            break
                        err = yield shown
                        if err is not None and type(err) is LeaseBusy and self.waits_leases:
                            err = yield from self._run_again(lane, inc, msg, shown, batch, i,
                                                             err)
                            if err is _HALTED:
                                stopped = True
                                break
                            if err is _FENCED:
                                prog.hold(inc, batch[i:])
                                return
                            if err is _TAKEN:
                                break
                        if sink.outputs:
                            if err is None and not (watched and lane.incarnation != inc):
                                emit = EmitRequest(of_record(msg, sink), sink.after or [])
                                sink.reset()
                                if not (yield emit):
                                    stopped = True
                                    break
                                prog.ran()
                                err = _EMITTED
                            else:
                                sink.reset()  # a failed attempt's outputs are never sent
                        elif err is not None:
                            prog.ran()
                        if breaker is not None:
                            breaker.record(
                                True if err is None or err is _EMITTED else
                        False if self.retryable(err) else None)
                if watched and lane.incarnation != inc:
                    break  # the deadline already routed this record: a late result, fenced
                if err is None:
                    prog.record(msg.offset)
                elif err is _EMITTED:
                    pass
                else:
                    cp = sink.checkpoint
                    if cp is not None and not isinstance(item, Poisoned):
                        sink.checkpoint = None
                        if cp[0] is shown:  # this call's last heartbeat: to the next attempt
                            keep_checkpoint(err, cp[1])
                    if not (yield HandOffRequest(msg, err)):
                        stopped = True
                        break
                # done with it: its memory goes now, not when the pass ends (a pass is all its
                # lane queued, up to a partition's share: issue #45's bound counts a record
                # until it completes); only what follows ``i`` is read from here on
                batch[i] = _SPENT
                if now() - t_pass >= QUANTUM_S and i + 1 < len(batch) and \
                        self.runtime.contended():
                    rest = batch[i + 1:]  # others wait for a thread: give this one up
                    break
            if watched and lane.incarnation != inc:
                prog.post()
                return
            if watched:
                lane.end()
            if stopped:
                prog.finish(inc)
                return
            prog.post()
            if rest is not None:
                self.runtime.run(self, lane, rest, inc, None)
                return
            nxt = lane.next_batch(inc)
            if nxt is None or self._requeued(lane, nxt, inc):
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
        sink = _sink()
        for req in self._timed_out(timed_out) if timed_out is not None else ():
            if not (yield req):
                prog.finish(inc)
                return
        pending = items
        while True:
            if policy.max_wait_s is not None and len(pending) < policy.max_size:
                until = now() + policy.max_wait_s
                while len(pending) < policy.max_size and not ps.halted and now() < until:
                    more = lane.take(inc, policy.max_size - len(pending))
                    if more is None:
                        return  # the watchdog took the lane
                    if more:
                        pending = pending + more
                    else:
                        yield WAIT
            if ps.halted:
                prog.finish(inc)
                return
            if ps.fenced:
                prog.hold(inc, pending)
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
            if records and breaker is not None and not breaker.admit():
                prog.hold(inc, [*records, *pending])
                return
            shown: list[Message] = records
            if records and self.decoder is not None:
                decoded = yield from self._decode_batch(records)
                if decoded is None:
                    prog.finish(inc)
                    return
                records, shown = decoded
            if records and self.pacer is not None:
                got = yield PaceRequest(ps.tp, self.pacer.fixed or "", 1)
                if got is None:  # halted or fenced while it waited
                    if _halted(ps):
                        prog.finish(inc)
                    else:
                        prog.hold(inc, [*records, *pending])
                    return
            if records:
                if watched and not lane.begin(inc, records[0], now(), pending, -1, records):
                    return
                sink.calling(shown)
                err = yield shown
                if watched:
                    if lane.incarnation != inc:
                        sink.reset()
                        prog.post()
                        return  # the deadline already routed this batch: late, fenced
                    lane.end()
                if breaker is not None:
                    breaker.record(
                        True if err is None else False if self.retryable(err) else None)
                failed: dict[Message, BaseException] = {}
                if isinstance(err, BatchError):
                    # keyed by what the handler saw: the original records are handed off
                    failed = {m: err.failures[s] for m, s in zip(records, shown, strict=True)
                              if s in err.failures}
                elif err is not None:
                    failed = {m: err for m in records}
                emit: EmitRequest | None = None
                if sink.outputs:
                    if err is None or isinstance(err, BatchError):
                        emit = EmitRequest(of_batch(records, shown, failed, sink), sink.after or [])
                    sink.reset()
                emitting = {m.offset for m, _ in emit.emitted} if emit is not None else ()
                #: records whose key another attempt holds: not run, run again after a wait
                busy = ({m: e for m, e in failed.items() if type(e) is LeaseBusy}
                        if failed and self.waits_leases else {})
                for m in busy:
                    del failed[m]
                prog.ran(len(failed) + len(emitting))
                if not failed and not emitting and not busy:  # the common case: one step
                    prog.record_many([m.offset for m in records])
                else:
                    for m in records:
                        if m in busy:
                            continue
                        exc = failed.get(m)
                        if exc is None:
                            if m.offset not in emitting:
                                prog.record(m.offset)
                        elif not (yield HandOffRequest(m, exc)):
                            prog.finish(inc)
                            return
                if emit is not None and emit.emitted and not (yield emit):
                    prog.finish(inc)
                    return
                if busy:
                    prog.post()
                    first = min(busy.values(), key=lambda e: e.until)
                    if not (yield from self._lease_wait(lane, first)):
                        if _halted(ps):
                            prog.finish(inc)
                        else:
                            prog.hold(inc, [*busy, *pending])
                        return
                    pending = [*busy, *pending]
            prog.post()
            if not pending:
                nxt = lane.next_batch(inc)
                if nxt is None:
                    return
                pending = nxt
            if self._requeued(lane, pending, inc):
                return

    def _decode_batch(self, records: list[Message]) -> Generator[
            Request, Any, tuple[list[Message], list[Message]] | None]:
        """Decodes a batch's records one by one (a generator the batch runner delegates to):
        the ones that cannot be decoded are handed off at once, the rest run. Returns (the
        originals that decoded, their decoded copies), or None when the runner must stop."""
        keep: list[Message] = []
        shown: list[Message] = []
        for m in records:
            got = yield DecodeRequest(m)
            if got is None:
                return None
            if isinstance(got, BaseException):
                if not (yield HandOffRequest(m, got)):
                    return None
            else:
                keep.append(m)
                shown.append(got)
        return keep, shown

    def _requeued(self, lane: Lane, items: list[Item], inc: int) -> bool:
        """Between two passes over a lane: when other runners wait for a place to run, queue
        this one again behind them with what it was about to run (the lane stays marked
        running, so records dispatched meanwhile join its queue), and stop here."""
        if not self.runtime.contended():
            return False
        self.runtime.run(self, lane, items, inc, None)
        return True


def _halted(ps: Partition) -> bool:
    """Read again after a wait (a plain ``ps.halted`` there is narrowed by the checks before
    the wait, as if nothing could have changed it meanwhile)."""
    return ps.halted
