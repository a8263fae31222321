"""Where runners execute: daemon threads for sync handlers, one asyncio loop for async ones.

Each runtime only *drives* ``Runner.steps`` (the one runner skeleton): it runs the records the
skeleton yields, and has everything else it asks answered by ``kworkers.consumer.answers``
(written once), doing the waits with plain calls or with awaits.

Daemon threads on purpose: a handler stuck past its deadline must not keep the process from
exiting after a drain; ``concurrent.futures`` joins its threads at exit.

Supervised: a runner that raises (a bug, or a handler raising a ``BaseException`` such as
``SystemExit``) leaves its lane marked running and its partition stalled, so it is reported to
the ``Supervisor`` (the worker turns unhealthy and stops), never swallowed. ``stalled`` tells
the poll loop about a handler call running past a bound, or an event loop blocked by one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from queue import SimpleQueue
from typing import Any, cast

from kworkers.clock import Clock
from kworkers.consumer.answers import aresolve, resolve
from kworkers.consumer.calls import CallWatch
from kworkers.consumer.partition import Item, Lane
from kworkers.consumer.ports import TP
from kworkers.consumer.runner import current_lane
from kworkers.consumer.steps import Job, TimedOut
from kworkers.message import Message
from kworkers.supervision import Supervisor

log = logging.getLogger("kworkers.runtime")


class _Call:
    """What one pool thread runs now (read by ``stalled``; written by its own thread only)."""

    __slots__ = ("lane", "msg", "started")

    def __init__(self) -> None:
        self.msg: Message | None = None
        self.started = 0.0
        #: the lane of the call (its ``started`` moves with the handler's heartbeats)
        self.lane: Lane | None = None


def _running(name: str, msg: Message, started: float, lane: Lane | None,
             now: float, bound: float) -> str | None:
    """A call running ``bound`` s since it started or since its last heartbeat (the lane's
    ``touch``), described; else None. A heartbeat says the handler is alive: a long job that
    checkpoints is not hung."""
    beat = lane.started if lane is not None and lane.started > started else None
    if now - (started if beat is None else beat) <= bound:
        return None
    since = ("no heartbeat" if beat is None else
             f"its last heartbeat {now - beat:.0f}s ago")
    return (f"{name} has been running {msg.topic}/{msg.partition}@{msg.offset} for "
            f"{now - started:.0f}s ({since})")


class ThreadRuntime:
    """A pool of daemon threads; a runner occupies one thread while its lane has work, and
    gives it up between two passes over its lane when other runners wait for one
    (``contended``): with more lanes than threads and a backlog, a lane's queue never empties,
    so a runner that kept its thread would starve every lane queued behind it."""

    is_async = False
    is_inline = False

    def __init__(self, size: int, supervisor: Supervisor, clock: Clock,
                 name: str = "kworkers-handler") -> None:
        self.supervisor = supervisor
        self.clock = clock
        self._q: SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]] | None] = SimpleQueue()
        self._calls = [_Call() for _ in range(size)]
        self._threads = [
            threading.Thread(target=self._work, args=(call,), name=f"{name}-{i}", daemon=True)
            for i, call in enumerate(self._calls)
        ]
        for t in self._threads:
            t.start()

    def run(self, runner: Job, lane: Lane, items: list[Item], inc: int,
            timed_out: TimedOut | None) -> None:
        self._q.put((_drive_sync, (runner, lane, items, inc, timed_out)))

    def _work(self, call: _Call) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            fn, args = job
            try:
                fn(*args, call)
            except BaseException as exc:
                self.supervisor.fail(threading.current_thread().name,
                                     f"a runner raised {type(exc).__name__}: {exc}")
                log.error("handler runner crashed", exc_info=exc)

    def alive(self) -> bool:
        return all(t.is_alive() for t in self._threads)

    def contended(self) -> bool:
        return not self._q.empty()

    def calling(self) -> set[TP]:
        return _calling(self._calls)

    def stalled(self, bound: float) -> str | None:
        """A handler call running for longer than ``bound`` seconds (since it started or its
        last heartbeat), described; else None."""
        now = self.clock.monotonic()
        for t, call in zip(self._threads, self._calls, strict=True):
            msg = call.msg
            if msg is not None:
                found = _running(t.name, msg, call.started, call.lane, now, bound)
                if found is not None:
                    return found
        return None

    def shutdown(self) -> None:
        for _ in self._threads:
            self._q.put(None)


def _drive_sync(runner: Job, lane: Lane, items: list[Item], inc: int,
                timed_out: TimedOut | None, call: _Call, deadline: float | None = None) -> None:
    """Drives ``Runner.steps`` with plain calls. ``deadline``: the inline runtime's per-call
    bound, judged when the call returns (nothing can interrupt the poll thread): an overrun is
    a ``TimeoutError`` attempt, its result discarded, as the threaded watchdog would have it."""
    current_lane.set(lane)
    call.lane = lane
    steps = runner.steps(lane, items, inc, timed_out)
    send = steps.send
    handler, invoke, ps = runner.handler, runner.invoke, lane.part
    now = runner.clock.monotonic
    try:
        req = next(steps)
        while True:
            # a record (or a batch) to run is by far the most frequent request: tested first,
            # by exact type (a decoded record is a Message too), the rest only otherwise
            if type(req) is Message:
                call.msg = req
            elif type(req) is list:
                call.msg = req[0]
            else:
                req = send(resolve(runner, ps, req))
                continue
            call.started = started = now()
            result: BaseException | None = None
            try:
                invoke(handler, req)
            except Exception as exc:
                result = exc
            call.msg = None
            if deadline is not None and now() - started > deadline:
                result = TimeoutError(f"handler exceeded its {deadline}s deadline")
            req = send(result)
    except StopIteration:
        pass
    except BaseException:
        _abandon(lane, call)
        raise


def _calling(calls: Iterable[_Call]) -> set[TP]:
    """The partitions a handler call runs for now (each slot written by its own thread)."""
    out: set[TP] = set()
    for call in calls:
        msg = call.msg
        if msg is not None:
            out.add((msg[0], msg[1]))
    return out


def _abandon(lane: Lane, call: _Call | None = None) -> None:
    """A runner crashed: its lane is idle again (its unfinished records are never completed,
    so never committed; the worker is stopping because of it)."""
    if call is not None:
        call.msg = None
    lane.abandon()


class InlineRuntime:
    """Runs each runner on the thread that starts it: the poll thread (``execution="inline"``).

    Opt-in, for fast sync handlers: no hand-over between threads, no GIL ping-pong, so a
    handler costs little more than the poll itself. The price: while a handler runs, nothing
    polls, so a handler must stay well inside ``max.poll.interval.ms``. The deadline is kept:
    a call past ``message_timeout`` becomes a ``TimeoutError`` attempt when it returns (its
    result discarded); and a watchdog thread reports a call hung past the stall bound to the
    supervisor (``/healthz`` 503), since the poll thread itself cannot.
    """

    is_async = False
    is_inline = True

    def __init__(self, supervisor: Supervisor, clock: Clock, deadline: float | None,
                 stall_bound: float | None, slow_bound: float | None = None) -> None:
        self.supervisor = supervisor
        self.clock = clock
        self.deadline = deadline
        self.stall_bound = stall_bound
        #: readiness names a call running this long (``kworkers.consumer.calls``)
        self.slow_bound = slow_bound
        #: per poll thread (the main loop's and the retry loop's)
        self._calls: dict[int, _Call] = {}
        self._closed = threading.Event()
        self._watch = threading.Thread(target=self._watchdog, name="kworkers-inline-watch",
                                       daemon=True)
        if stall_bound is not None:
            self._watch.start()

    def run(self, runner: Job, lane: Lane, items: list[Item], inc: int,
            timed_out: TimedOut | None) -> None:
        call = self._calls.get(threading.get_ident())
        if call is None:
            call = self._calls[threading.get_ident()] = _Call()
        try:
            _drive_sync(runner, lane, items, inc, timed_out, call, self.deadline)
        except BaseException as exc:
            self.supervisor.fail("poll thread (inline handler)",
                                 f"a runner raised {type(exc).__name__}: {exc}")
            log.error("inline runner crashed", exc_info=exc)

    def _watchdog(self) -> None:
        assert self.stall_bound is not None
        watch = CallWatch(self, self.supervisor, self.slow_bound, self.stall_bound, self.clock,
                          every=0.0, what="poll thread (inline handler)")
        while not self._closed.wait(1.0):
            watch.check()

    def alive(self) -> bool:
        return True

    def contended(self) -> bool:
        return False

    def calling(self) -> set[TP]:
        return _calling(list(self._calls.values()))

    def stalled(self, bound: float) -> str | None:
        now = self.clock.monotonic()
        for call in list(self._calls.values()):
            msg = call.msg
            if msg is not None:
                found = _running("a poll thread", msg, call.started, call.lane, now, bound)
                if found is not None:
                    return found
        return None

    def shutdown(self) -> None:
        self._closed.set()


#: a lane waiting to start on the event loop: ``AsyncRuntime.run``'s arguments
_Start = tuple[Job, Lane, list[Item], int, "TimedOut | None"]


class _Slots:
    """At most ``n`` handler calls at once on the event loop, first come first served: what an
    ``asyncio.Semaphore`` does, without the scan of its waiters that each acquire pays (a
    tenth of an async no-op record's CPU). Used on the loop's thread only, so plain fields.

    Two kinds wait in one queue, so arrival order holds between them: a running lane's next
    call (a future its task awaits), and a lane not started yet (its start, launched with the
    slot when one is handed to it). A lane gets its task only with a slot: with more lanes
    ready than slots (10,000 keys at 5,000 in flight), a task per waiting lane was thousands
    of tasks, coroutines and contexts alive at once for the cyclic collector to walk and
    carry into its old generation (issue #50)."""

    __slots__ = ("free", "launch", "loop", "waiters")

    def __init__(self, n: int, loop: asyncio.AbstractEventLoop,
                 launch: Callable[[_Start], None] | None = None) -> None:
        self.free = n
        self.loop = loop
        #: starts a lane's task that holds the slot it was handed
        self.launch = launch
        self.waiters: deque[asyncio.Future[None] | _Start] = deque()

    def take(self) -> bool:
        """A slot at once, if one is free and nobody queues for one."""
        if self.free > 0 and not self.waiters:
            self.free -= 1
            return True
        return False

    def wait(self) -> asyncio.Future[None]:
        """Queue for a slot: the future ``release`` completes when it hands one over. A future,
        not a coroutine: one object fewer alive per waiting call. Its awaiter passes
        ``cancelled`` its future when it is cancelled."""
        fut: asyncio.Future[None] = self.loop.create_future()
        self.waiters.append(fut)
        return fut

    def cancelled(self, fut: asyncio.Future[None]) -> None:
        """The awaiter of ``fut`` was cancelled: a slot already handed to it goes to the next
        one (a cancelled waiter still queued is skipped by ``release``)."""
        if fut.done() and not fut.cancelled():
            self.release()

    def queue(self, start: _Start) -> None:
        """A lane to launch, with its slot, once one is handed to it."""
        self.waiters.append(start)

    def release(self) -> None:
        waiters = self.waiters
        while waiters:
            waiter = waiters.popleft()
            if type(waiter) is tuple:
                assert self.launch is not None
                self.launch(waiter)
                return
            fut = cast("asyncio.Future[None]", waiter)
            if not fut.done():
                fut.set_result(None)
                return
        self.free += 1


#: the deadline sweep sleeps at least this long between two passes (calls due within it are
#: cut off up to this late: a deadline is a bound on a stuck call, not a timer to the ms)
SWEEP_MIN_S = 0.01


class AsyncRuntime:
    """One event loop in a thread of its own; the poll thread submits runners to it."""

    is_async = True
    is_inline = False

    def __init__(self, concurrency: int, supervisor: Supervisor, clock: Clock) -> None:
        self.supervisor = supervisor
        self.clock = clock
        self._pinged = self._answered = clock.monotonic()
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kworkers-asyncio", daemon=True)
        self._thread.start()
        self._ready.wait()
        self.slots = _Slots(concurrency, self.loop, self._launch)
        #: handler calls under way per partition (written on the loop's thread only)
        self._calls: dict[TP, int] = {}
        #: each handler call under way: its record and when it started, by its lane (a lane
        #: runs one call at a time; written on the loop's thread only, ``stalled`` copies
        #: them). Two maps, not one of tuples: a tuple per call alive as long as the call was
        #: one more object per record in flight for the collector to walk (issue #50)
        self._running: dict[Lane, Message] = {}
        self._since: dict[Lane, float] = {}
        #: lanes to start on the loop (``run``), and whether the loop was woken to start them
        self._starts: deque[_Start] = deque()
        self._woken = False
        #: the runners' tasks under way (held here: the loop's reference is weak)
        self._tasks: set[asyncio.Task[None]] = set()
        #: one bound method for every task's done callback, not one made per task (an object
        #: alive per record for the cyclic collector to walk: issue #50)
        self._on_done = self._done
        #: the calls with a deadline under way, by lane, with the task each runs in; the
        #: lanes whose call the sweep cancelled; the shortest deadline seen; the sweep's timer
        self._bounded: dict[Lane, asyncio.Task[None]] = {}
        self._expired: set[Lane] = set()
        self._shortest = float("inf")
        self._sweep: asyncio.TimerHandle | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.run_forever()

    def run(self, runner: Job, lane: Lane, items: list[Item], inc: int,
            timed_out: TimedOut | None) -> None:
        # Lanes are handed to the loop in batches: the first lane of a batch wakes the loop
        # (one write to its self-pipe), the others join it. One ``run_coroutine_threadsafe``
        # per lane cost the poll thread a wake-up each, and with thousands of keys nearly every
        # record starts a lane: 56 % of the poll thread at 5,000 in flight (``benchmarks
        # iobound --profile``). The flag is cleared before the batch is taken, so a lane added
        # meanwhile is either in this batch or wakes the loop again.
        self._starts.append((runner, lane, items, inc, timed_out))
        if not self._woken:
            self._woken = True
            self.loop.call_soon_threadsafe(self._start_lanes)

    def _start_lanes(self) -> None:
        self._woken = False
        starts, slots = self._starts, self.slots
        while starts:
            start = starts.popleft()
            if slots.take():
                self._launch(start)
            else:
                slots.queue(start)  # its task is made when a slot is handed to it

    def _launch(self, start: _Start) -> None:
        """A lane's task, holding a slot for its first handler call."""
        task = self.loop.create_task(self._drive(*start, True))
        self._tasks.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(self._on_done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._crashed(task)

    def _crashed(self, fut: Any) -> None:
        if not fut.cancelled() and fut.exception() is not None:
            exc = fut.exception()
            self.supervisor.fail("kworkers-asyncio",
                                 f"a runner raised {type(exc).__name__}: {exc}")
            log.error("async runner crashed", exc_info=exc)

    def alive(self) -> bool:
        return self._thread.is_alive()

    def contended(self) -> bool:
        return False  # runners share the loop: the semaphore is first come, first served

    def calling(self) -> set[TP]:
        for _ in range(3):  # the loop's thread may change the dict meanwhile
            try:
                return {tp for tp, n in self._calls.items() if n > 0}
            except RuntimeError:
                continue
        return set()

    def stalled(self, bound: float) -> str | None:
        """The event loop blocked (a handler that never awaits) for longer than ``bound``, or
        a handler call awaiting that long since it started or its last heartbeat."""
        now = self.clock.monotonic()
        if self._answered >= self._pinged:  # the last ping was answered: send another
            self._pinged = now
            self.loop.call_soon_threadsafe(self._answer)
        elif now - self._pinged > bound:
            return f"the asyncio loop has not run for {now - self._pinged:.0f}s"
        for _ in range(3):  # the loop's thread may change the maps meanwhile
            try:
                return self._oldest_stalled(now, bound)
            except RuntimeError:
                continue
        return None

    def _oldest_stalled(self, now: float, bound: float) -> str | None:
        """The first call running ``bound`` s, from the oldest on. ``_since`` holds its calls
        in the order they started (a call's entry is removed when it ends, before its lane's
        next one is added), so the walk stops at the first call started within the bound:
        every later one started later still. A heartbeat only makes a call younger. Copying
        both maps whole, as before, walked every call in flight each time, four times a
        second on each poll thread, holding the GIL: 1.1 ms a check at 5,000 calls in flight
        against 0.006 ms now, and growing with them (issue #50;
        ``tests/unit/test_async_stall_scan.py``)."""
        running, since = self._running, self._since
        for lane, started in since.items():
            if now - started <= bound:
                return None
            msg = running.get(lane)
            if msg is None or since.get(lane) != started:
                continue  # ended (and maybe its lane's next call began) as it was read
            found = _running("an async handler", msg, started, lane, now, bound)
            if found is not None:
                return found
        return None

    # ------------------------------------------------------------------ deadlines

    def _arm(self, timeout: float) -> None:
        """A call whose deadline is ``timeout`` starts with no sweep armed, or with a deadline
        shorter than any before (the sweep armed may be later than it): arm it for then."""
        if timeout < self._shortest:
            self._shortest = timeout
        if self._sweep is not None:
            self._sweep.cancel()
        self._sweep = self.loop.call_later(timeout, self._sweep_deadlines)

    def _sweep_deadlines(self) -> None:
        """Cancels the calls past their deadline; then sleeps until the next one's. Calls are
        walked in the order they started (``_since``): once one started less than the
        shortest deadline ago, no later one can be due (a heartbeat only makes a call
        younger), so a sweep reads the few old calls, not every call in flight."""
        self._sweep = None
        bounded = self._bounded
        if not bounded:
            return
        now, shortest = self.clock.monotonic(), self._shortest
        due_next = now + shortest
        for lane, started in self._since.items():
            if started + shortest > now:
                due_next = min(due_next, started + shortest)
                break
            task = bounded.get(lane)
            if task is None:
                continue  # a call without a deadline
            beat = lane.started
            due = (beat if beat > started else started) + lane.deadline_s
            if due > now:
                due_next = min(due_next, due)
            elif lane not in self._expired:
                self._expired.add(lane)
                task.cancel()
        self._sweep = self.loop.call_later(max(due_next - now, SWEEP_MIN_S),
                                           self._sweep_deadlines)

    def _answer(self) -> None:
        self._answered = self.clock.monotonic()

    async def _drive(self, runner: Job, lane: Lane, items: list[Item], inc: int,
                     timed_out: TimedOut | None, held: bool) -> None:
        """Runs a lane's pass; ``held``: it was launched with a slot for its first call."""
        current_lane.set(lane)
        steps = runner.steps(lane, items, inc, timed_out)
        slots = self.slots
        timeout = runner.timeout
        handler, invoke, ps = runner.handler, runner.invoke, lane.part
        running, since, now = self._running, self._since, self.clock.monotonic
        bounded, expired = self._bounded, self._expired
        if timeout is not None:
            task = cast("asyncio.Task[None]", asyncio.current_task())
            lane.deadline_s = timeout
        try:
            req = next(steps)
            while True:
                # a record (or a batch) to run is by far the most frequent request: tested
                # first, by exact type (as ``_drive_sync`` does), the rest only otherwise
                if type(req) is not Message and type(req) is not list:
                    if held:  # a slot bounds handler calls, not what a lane waits for
                        held = False
                        slots.release()
                    req = steps.send(await aresolve(runner, ps, req))
                    continue
                result: BaseException | None = None
                calls = self._calls
                tp = ps.tp
                try:
                    if held:
                        held = False
                    elif not slots.take():
                        fut = slots.wait()
                        try:
                            await fut
                        except asyncio.CancelledError:
                            slots.cancelled(fut)
                            raise
                    try:
                        calls[tp] = calls.get(tp, 0) + 1
                        running[lane] = req[0] if isinstance(req, list) else req
                        since[lane] = now()
                        try:
                            coro = invoke(handler, req)
                            if timeout is None:
                                await coro
                            else:
                                # Past its deadline (from its start or its last heartbeat)
                                # the sweep cancels this task and the call raises
                                # TimeoutError. One sweep for every call, not a timer per
                                # call (``asyncio.timeout``: a handle, a context and a
                                # ``Timeout`` each) nor a task (``asyncio.wait_for`` on 3.11):
                                # objects per record in flight for the collector (issue #50).
                                # Here, not in a coroutine of its own: one more per call.
                                bounded[lane] = task
                                if self._sweep is None or timeout < self._shortest:
                                    self._arm(timeout)
                                try:
                                    await coro
                                except asyncio.CancelledError:
                                    if lane not in expired:
                                        raise
                                    expired.discard(lane)
                                    if task.uncancel() > 0:
                                        raise  # cancelled from elsewhere too: that one wins
                                    raise TimeoutError(
                                        f"handler exceeded its {timeout}s deadline") from None
                                finally:
                                    del bounded[lane]
                                    if lane in expired:  # a swallowed cancel: the call's
                                        expired.discard(lane)  # own outcome holds
                                        task.uncancel()
                        finally:
                            del running[lane], since[lane]
                            left = calls[tp] - 1
                            if left:
                                calls[tp] = left
                            else:
                                del calls[tp]
                    finally:
                        slots.release()
                except Exception as exc:
                    result = exc
                req = steps.send(result)
        except StopIteration:
            pass
        except BaseException:
            _abandon(lane)
            raise
        finally:
            if held:  # ended before its first call
                slots.release()

    def shutdown(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
