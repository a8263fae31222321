"""The poll loop: the one place where pure logic and broker I/O meet.

The poll thread only polls, dispatches into lanes, pauses/resumes, fires due timers, applies
completions and commits. Handlers run elsewhere (``runtime``), so a slow handler never costs the
group a rebalance. A record's offset is completed only when its handler returned, or when its
failure was handed to a retry tier or the DLQ and the broker acknowledged that hand-off.

Commit order on revoke and on shutdown: stop dispatching the partitions concerned, wait (bounded)
for their in-flight records, apply completions, commit synchronously, then drop their state.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from queue import Empty, SimpleQueue
from typing import Any, Literal, Protocol

from kworkers.clock import Clock
from kworkers.config import WorkerConfig
from kworkers.consumer.commit import CommitOutcome, commit_with_retry
from kworkers.consumer.partition import Item, Lane, PartitionState, Poisoned
from kworkers.consumer.runtime import AsyncRuntime, DaemonPool
from kworkers.message import Message
from kworkers.metrics import Metrics
from kworkers.retry_tiers.delay import DelayBuffer
from kworkers.retry_tiers.headers import HeaderError, attempt_of, check_due, due_at_of
from kworkers.retry_tiers.router import FailureRouter, Sender

log = logging.getLogger("kworkers.consumer")

TP = tuple[str, int]
Handler = Callable[[Message], Any]
Outcome = Literal["ok", "retry", "dlq"]
# (partition state, completed offsets, retried, dead-lettered, handler seconds)
Completion = tuple[PartitionState, list[int], int, int, float]

POLL_TIMEOUT = 0.1
HANDOFF_TIMEOUT = 60.0
#: how often the consumer-lag gauge is refreshed (from the client's cached watermarks)
LAG_INTERVAL_S = 5.0
#: a runner reports completions at least this often within a long batch
PARTIAL_POST_S = 0.05


#: the lane whose runner is calling the handler (the activity context reads it for fencing and
#: for heartbeats that extend the message deadline)
current_lane: contextvars.ContextVar[Lane | None] = contextvars.ContextVar(
    "kworkers_lane", default=None)


class ConsumerPort(Protocol):
    """What the loop needs from a consumer (``KafkaConsumerAdapter`` in production)."""

    group: str

    def subscribe(self, topics: Iterable[str], on_assign: Callable[[list[TP]], None],
                  on_revoke: Callable[[list[TP]], None],
                  on_lost: Callable[[list[TP]], None]) -> None: ...
    def poll_batch(self, n: int, timeout: float) -> list[Message]: ...
    def commit(self, positions: dict[TP, int]) -> None: ...
    def pause(self, tps: list[TP]) -> None: ...
    def resume(self, tps: list[TP]) -> None: ...
    def close(self) -> None: ...
    def is_retryable(self, exc: BaseException) -> bool: ...


class Invoker(Protocol):
    """Runs a handler for one record (the activity context wraps it; see ``kworkers.activity``)."""

    def __call__(self, handler: Handler, msg: Message) -> Any: ...


def plain_invoke(handler: Handler, msg: Message) -> Any:
    return handler(msg)


class _Progress:
    """A runner's unreported completions: posted per batch, or sooner within a slow batch so a
    revoke or a crash soon after does not redeliver the fast records ahead of a slow one.

    ``lane.done`` always names the current list, so a revoke can collect it from a runner that
    is stuck on a later record.
    """

    __slots__ = ("dead", "done", "lane", "q", "retried", "t0")

    def __init__(self, q: SimpleQueue[Completion], lane: Lane) -> None:
        self.q = q
        self.lane = lane
        self._reset()

    def _reset(self) -> None:
        self.done: list[int] = []
        self.lane.done = self.done
        self.retried = 0
        self.dead = 0
        self.t0 = time.perf_counter()

    def record(self, offset: int, outcome: Outcome) -> None:
        self.done.append(offset)
        if outcome == "retry":
            self.retried += 1
        elif outcome == "dlq":
            self.dead += 1
        if time.perf_counter() - self.t0 > PARTIAL_POST_S:
            self.post()

    def post(self) -> None:
        self.q.put((self.lane.part, self.done, self.retried, self.dead,
                    time.perf_counter() - self.t0))
        self._reset()

    def finish(self, inc: int, stop: bool) -> None:
        self.post()
        if stop:
            lane = self.lane
            with lane.lock:
                if lane.incarnation == inc:
                    lane.queue = []
                    lane.running = False


class ConsumerLoop:
    def __init__(
        self,
        config: WorkerConfig,
        consumer: ConsumerPort,
        topics: Iterable[str],
        handler: Handler,
        sender: Sender,
        router: FailureRouter,
        metrics: Metrics,
        clock: Clock,
        pool: DaemonPool | None,
        aio: AsyncRuntime | None,
        hard_stop: threading.Event,
        delayed: bool = False,
        invoke: Invoker = plain_invoke,
    ) -> None:
        self.config = config
        self.consumer = consumer
        self.topics = list(topics)
        self.handler = handler
        self.is_async = inspect.iscoroutinefunction(handler)
        if self.is_async and aio is None:
            raise ValueError("an async handler needs an AsyncRuntime")
        if not self.is_async and pool is None:
            raise ValueError("a sync handler needs a DaemonPool")
        self.sender = sender
        self.router = router
        self.clock = clock
        self.pool = pool
        self.aio = aio
        self.hard_stop = hard_stop
        self.invoke = invoke
        self.delayed = delayed
        self.buffer: DelayBuffer[tuple[PartitionState, Message]] | None = (
            DelayBuffer(config.delay_buffer) if delayed else None)
        self.max_ahead = max(config.tiers.delays) * 2 + config.retry.normalized().max_interval

        group = consumer.group
        self.group = group
        self.metrics = metrics
        self._m_ok = metrics.records.labels(group, "ok")
        self._m_retried = metrics.records.labels(group, "retried")
        self._m_dead = metrics.records.labels(group, "dead_lettered")
        self._m_duration = metrics.handler_duration.labels(group)
        self._m_in_flight = metrics.in_flight.labels(group)
        self._m_paused = metrics.paused.labels(group)
        self._m_fenced = metrics.fenced.labels(group)
        self._m_lateness = metrics.retry_lateness.labels(group)
        self._m_blocked = metrics.handoff_blocked.labels(group)

        self.parts: dict[TP, PartitionState] = {}
        self._done: SimpleQueue[Completion] = SimpleQueue()
        self._since_commit = 0
        self._last_commit = clock.monotonic()
        self._stop = threading.Event()
        self._buffer_paused = False
        self._draining = False
        self._last_watchdog = 0.0
        self._last_lag = 0.0
        self._dispatches = 0
        self.ready = threading.Event()
        self.closed = threading.Event()
        #: how commit retries wait (a seam: tests record the waits instead of sleeping)
        self.sleep: Callable[[float], None] = time.sleep
        #: rebalance events as they happened ("assign" / "revoke" / "lost", partitions)
        self.history: list[tuple[str, list[TP]]] = []

    # ------------------------------------------------------------------ public

    def stop(self) -> None:
        """Begin a graceful stop: fetch nothing more, drain, commit, leave the group."""
        self._stop.set()

    def run(self) -> None:
        self.consumer.subscribe(self.topics, self._on_assign, self._on_revoke, self._on_lost)
        try:
            while not self._stop.is_set():
                self._step()
            self._drain()
        finally:
            try:
                self.consumer.close()  # a clean leave; revokes (and commits) what is left
            except Exception:
                log.exception("consumer close failed")
            for ps in self.parts.values():
                ps.stop_dispatch()
            self.parts.clear()
            self.closed.set()

    # ------------------------------------------------------------------ loop

    def _step(self) -> None:
        msgs = self.consumer.poll_batch(self.config.consume_batch, self._poll_timeout())
        self.ready.set()
        if msgs:
            self._dispatch(msgs)
        self._apply_completions()
        if self.buffer is not None and len(self.buffer):
            self._fire_due()
        if self.config.message_timeout is not None and not self.is_async:
            self._watchdog()
        self._backpressure()
        now = self.clock.monotonic()
        if now - self._last_lag >= LAG_INTERVAL_S:
            self._last_lag = now
            self._report_lag()
        if self.config.commit.should_commit(now, self._last_commit, self._since_commit):
            self._commit(list(self.parts.values()), "periodic")
            self._last_commit = now

    def _poll_timeout(self) -> float:
        if self.buffer is not None:
            due = self.buffer.next_due()
            if due is not None:
                return max(0.0, min(POLL_TIMEOUT, due - self.clock.now()))
        return POLL_TIMEOUT

    def _drain(self) -> None:
        """SIGTERM: pause everything, let in-flight work finish (bounded), commit."""
        self._draining = True
        self._backpressure()
        deadline = self.clock.monotonic() + self.config.drain_timeout
        while self._in_flight_runnable() > 0 and self.clock.monotonic() < deadline:
            self.consumer.poll_batch(self.config.consume_batch, 0.05)  # heartbeats, rebalances
            self._apply_completions()
        left = self._in_flight_runnable()
        if left:
            log.warning("drain deadline reached with %d records in flight; they will be "
                        "redelivered", left)
        self._collect_unreported(list(self.parts.values()))
        # The last commit before leaving decides whether the next owner redelivers anything.
        # A rebalance in progress (other members bouncing) refuses commits until it settles,
        # and it only settles if this member keeps polling: so poll between attempts.
        deadline = self.clock.monotonic() + self.config.revoke_timeout
        while True:
            if self._commit(list(self.parts.values()), "drain") is not CommitOutcome.FAILED:
                break
            if self.clock.monotonic() >= deadline:
                break
            self.consumer.poll_batch(self.config.consume_batch, 0.2)
            self._apply_completions()

    def _in_flight_runnable(self) -> int:
        waiting = len(self.buffer) if self.buffer is not None else 0
        return sum(ps.tracker.in_flight for ps in self.parts.values()) - waiting

    # ------------------------------------------------------------------ dispatch

    def _dispatch(self, msgs: list[Message]) -> None:
        parts = self.parts
        # Group the fetched batch by partition first: one tracker call and one lane hand-off per
        # partition, not per record (the hot path).
        by_tp: dict[TP, list[Message]] = {}
        for m in msgs:
            tp = (m[0], m[1])
            group = by_tp.get(tp)
            if group is None:
                by_tp[tp] = [m]
            else:
                group.append(m)
        key_mode = self.config.ordering == "key"
        now = self.clock.now()
        for tp, group in by_tp.items():
            ps = parts.get(tp)
            if ps is None:
                continue  # fetched before a revoke: the new owner reads it again
            offsets = [m[2] for m in group]
            tracked = ps.tracker.track_many(offsets)
            if len(tracked) != len(offsets):  # a refetch after pause/resume
                keep = set(tracked)
                group = [m for m in group if m[2] in keep]
            if not self.delayed and not key_mode:
                self._enqueue(ps.lane, list(group))
                continue
            lanes: dict[Lane, list[Item]] = {}
            for m in group:
                item: Item = m
                if self.delayed:
                    gated = self._gate(ps, m, now)
                    if gated is None:
                        continue
                    item = gated
                lane = ps.lane_for(m.key) if key_mode else ps.lane
                batch = lanes.get(lane)
                if batch is None:
                    lanes[lane] = [item]
                else:
                    batch.append(item)
            for lane, items in lanes.items():
                self._enqueue(lane, items)
        self._dispatches += 1
        if key_mode and self._dispatches % 100 == 0:
            for p in parts.values():
                p.prune_idle_lanes()

    def _gate(self, ps: PartitionState, m: Message, now: float) -> Item | None:
        """Retry-tier records wait in the timer heap until due; never early."""
        try:
            m = m._replace(attempt=attempt_of(m.headers))
            due = due_at_of(m.headers)
            if due is not None:
                check_due(due, now, self.max_ahead)
        except HeaderError as exc:
            log.warning("%s/%d@%d has corrupt kworkers headers (%s): dead-lettering it",
                        m.topic, m.partition, m.offset, exc)
            return Poisoned(m, exc)
        if due is not None and due > now:
            assert self.buffer is not None
            self.buffer.push(due, (ps, m))
            return None
        if due is not None:
            self._m_lateness.observe(max(0.0, now - due))
        return m

    def _fire_due(self) -> None:
        assert self.buffer is not None
        now = self.clock.now()
        due = self.buffer.pop_due(now)
        if not due:
            return
        key_mode = self.config.ordering == "key"
        groups: dict[Lane, list[Item]] = {}
        for ps, m in due:
            if self.parts.get(ps.tp) is not ps:
                continue
            d = due_at_of(m.headers)
            if d is not None:
                self._m_lateness.observe(max(0.0, now - d))
            lane = ps.lane_for(m.key) if key_mode else ps.lane
            groups.setdefault(lane, []).append(m)
        for lane, items in groups.items():
            self._enqueue(lane, items)

    def _enqueue(self, lane: Lane, items: list[Item]) -> None:
        with lane.lock:
            if lane.running:
                lane.queue.extend(items)
                return
            lane.running = True
            inc = lane.incarnation
        self._start(lane, items, inc, None)

    def _start(self, lane: Lane, items: list[Item], inc: int, timed_out: Message | None) -> None:
        if self.is_async:
            assert self.aio is not None
            self.aio.submit(self._run_async(lane, items, inc))
        else:
            assert self.pool is not None
            self.pool.submit(self._run_sync, lane, items, inc, timed_out)

    # ------------------------------------------------------------------ runners

    def _next_batch(self, lane: Lane, inc: int) -> list[Item] | None:
        with lane.lock:
            if lane.incarnation != inc:
                return None
            if lane.queue and not lane.part.revoking:
                batch, lane.queue = lane.queue, []
                return batch
            lane.running = False
            return None

    def _run_sync(self, lane: Lane, batch: list[Item], inc: int,
                  timed_out: Message | None) -> None:
        ps = lane.part
        timed = self.config.message_timeout is not None
        handler = self.handler
        invoke = self.invoke
        current_lane.set(lane)
        prog = _Progress(self._done, lane)
        if timed_out is not None:  # the watchdog took this lane from a stuck runner
            first = self._fail(ps, timed_out, TimeoutError(
                f"handler exceeded its {self.config.message_timeout}s deadline"))
            if first is None:
                prog.finish(inc, stop=True)
                return
            prog.record(timed_out.offset, first)
        while True:
            stopped = False
            for i, item in enumerate(batch):
                if ps.revoking:
                    stopped = True
                    break
                msg = item.msg if isinstance(item, Poisoned) else item
                if timed:
                    with lane.lock:
                        if lane.incarnation != inc:
                            break
                        lane.current, lane.started, lane.batch, lane.pos = (
                            msg, time.monotonic(), batch, i)
                outcome: Outcome = "ok"
                try:
                    if isinstance(item, Poisoned):
                        raise item.exc
                    invoke(handler, msg)
                except Exception as exc:
                    if timed and lane.incarnation != inc:
                        break  # the deadline already routed this record
                    handed = self._fail(ps, msg, exc)
                    if handed is None:
                        stopped = True
                        break
                    outcome = handed
                else:
                    if timed and lane.incarnation != inc:
                        break  # late result of a record the deadline already routed: fenced
                prog.record(msg.offset, outcome)
            if timed and lane.incarnation != inc:
                prog.post()
                return
            if timed:
                lane.current = None
            if stopped:
                prog.finish(inc, stop=True)
                return
            prog.post()
            nxt = self._next_batch(lane, inc)
            if nxt is None:
                return
            batch = nxt

    async def _run_async(self, lane: Lane, batch: list[Item], inc: int) -> None:
        assert self.aio is not None
        current_lane.set(lane)
        ps = lane.part
        sem = self.aio.semaphore
        timeout = self.config.message_timeout
        handler = self.handler
        invoke = self.invoke
        prog = _Progress(self._done, lane)
        while True:
            stopped = False
            for item in batch:
                if ps.revoking:
                    stopped = True
                    break
                msg = item.msg if isinstance(item, Poisoned) else item
                outcome: Outcome = "ok"
                try:
                    if isinstance(item, Poisoned):
                        raise item.exc
                    async with sem:
                        coro: Awaitable[Any] = invoke(handler, msg)
                        if timeout is not None:
                            await asyncio.wait_for(coro, timeout)
                        else:
                            await coro
                except Exception as exc:
                    if isinstance(exc, TimeoutError):
                        exc = TimeoutError(f"handler exceeded its {timeout}s deadline")
                    handed = await asyncio.to_thread(self._fail, ps, msg, exc)
                    if handed is None:
                        stopped = True
                        break
                    outcome = handed
                prog.record(msg.offset, outcome)
            if stopped:
                prog.finish(inc, stop=True)
                return
            prog.post()
            nxt = self._next_batch(lane, inc)
            if nxt is None:
                return
            batch = nxt

    # ------------------------------------------------------------------ failures

    def _fail(self, ps: PartitionState, msg: Message, exc: BaseException) -> Outcome | None:
        """Hands a failed attempt to its tier or the DLQ; returns once the broker acknowledged.

        Returns None when the partition was revoked or the worker is stopping hard before the
        hand-off was acknowledged: the offset then stays uncommitted and the record is
        delivered again (never dropped).
        """
        plan = self.router.plan(msg, exc)
        log.warning("%s/%d@%d attempt %d failed (%s: %s) -> %s %s", msg.topic, msg.partition,
                    msg.offset, msg.attempt, type(exc).__name__, str(exc)[:200],
                    plan.destination, plan.topic)
        delay = 0.1
        blocked = False
        try:
            while True:
                if ps.revoking or self.hard_stop.is_set():
                    return None
                try:
                    self.sender.send(plan.topic, plan.key, plan.value, plan.headers).result(
                        timeout=HANDOFF_TIMEOUT)
                except Exception as err:
                    self.metrics.handoff_failures.labels(self.group, plan.destination).inc()
                    if not blocked:
                        blocked = True
                        self._m_blocked.inc()
                    log.error("hand-off of %s/%d@%d to %s failed (%s); retrying in %.1fs, the "
                              "source offset stays uncommitted", msg.topic, msg.partition,
                              msg.offset, plan.topic, err, delay)
                    if self.hard_stop.wait(delay):
                        return None
                    delay = min(delay * 2, 5.0)
                    continue
                if plan.destination == "retry":
                    self.metrics.retries.labels(self.group, plan.label).inc()
                else:
                    self.metrics.dead_letters.labels(self.group, plan.label).inc()
                return plan.destination
        finally:
            if blocked:
                self._m_blocked.dec()

    def _watchdog(self) -> None:
        """Sync handlers past their deadline: route the record as a TimeoutError failure and
        give the rest of the lane to a fresh runner (the stuck thread's result is fenced)."""
        now = time.monotonic()
        if now - self._last_watchdog < 0.05:
            return
        self._last_watchdog = now
        limit = self.config.message_timeout
        assert limit is not None
        for ps in list(self.parts.values()):
            for lane in ps.all_lanes():
                cur = lane.current
                if cur is None or now - lane.started < limit:
                    continue
                with lane.lock:
                    if lane.current is not cur or not lane.running:
                        continue
                    lane.incarnation += 1
                    rest = lane.batch[lane.pos + 1:] + lane.queue
                    lane.queue, lane.batch, lane.current = [], [], None
                    inc = lane.incarnation
                log.warning("%s/%d@%d exceeded its %.1fs deadline", cur.topic, cur.partition,
                            cur.offset, limit)
                self._start(lane, rest, inc, cur)

    # ------------------------------------------------------------------ completions

    def _apply_completions(self, block: float = 0.0) -> None:
        q = self._done
        parts = self.parts
        first = True
        while True:
            try:
                if first and block > 0:
                    ps, offsets, retried, dead, elapsed = q.get(timeout=block)
                else:
                    ps, offsets, retried, dead, elapsed = q.get_nowait()
            except Empty:
                break
            first = False
            n = len(offsets)
            if parts.get(ps.tp) is not ps:
                if n:
                    self._m_fenced.inc(n)
                continue
            ps.tracker.complete_many(offsets)
            self._since_commit += n
            ok = n - retried - dead
            if ok:
                self._m_ok.inc(ok)
                self._m_duration.observe(elapsed / max(1, n))
            if retried:
                self._m_retried.inc(retried)
            if dead:
                self._m_dead.inc(dead)

    # ------------------------------------------------------------------ backpressure

    def _backpressure(self) -> None:
        cfg = self.config
        parts = self.parts
        total = sum(ps.tracker.in_flight for ps in parts.values())
        if self.buffer is not None:
            if len(self.buffer) >= cfg.delay_buffer:
                self._buffer_paused = True
            elif len(self.buffer) <= cfg.delay_buffer // 2:
                self._buffer_paused = False
        global_pause = self._draining or self._buffer_paused or total >= cfg.max_in_flight
        global_ok = total <= cfg.max_in_flight // 2
        to_pause: list[TP] = []
        to_resume: list[TP] = []
        for ps in parts.values():
            n = ps.tracker.in_flight
            if not ps.paused and (global_pause or n >= cfg.max_in_flight_per_partition):
                ps.paused = True
                to_pause.append(ps.tp)
            elif (ps.paused and not global_pause and global_ok
                  and n <= cfg.max_in_flight_per_partition // 2):
                ps.paused = False
                to_resume.append(ps.tp)
        if to_pause:
            self.consumer.pause(to_pause)
        if to_resume:
            self.consumer.resume(to_resume)
        self._m_in_flight.set(total)
        self._m_paused.set(sum(1 for ps in parts.values() if ps.paused))

    def _report_lag(self) -> None:
        """High watermark minus committed position, per owned partition (no broker round trip:
        the client caches watermarks from its fetch responses)."""
        watermarks = getattr(self.consumer, "watermarks", None)
        if watermarks is None:
            return
        for ps in list(self.parts.values()):
            try:
                _lo, hi = watermarks(ps.tp, 0.0)
            except Exception:  # not fetched yet: nothing cached
                continue
            if hi < 0:
                continue
            base = ps.tracker.committed
            if base is None:
                base = ps.tracker.position
            lag = hi - base if base is not None else hi
            self.metrics.lag.labels(self.group, ps.topic, str(ps.partition)).set(max(0, lag))

    # ------------------------------------------------------------------ commits

    def _commit(self, targets: list[PartitionState], why: str) -> CommitOutcome | None:
        positions: dict[TP, int] = {}
        for ps in targets:
            pos = ps.tracker.committable()
            if pos is not None:
                positions[ps.tp] = pos
        self._since_commit = 0
        if not positions:
            return None
        result = commit_with_retry(lambda: self.consumer.commit(positions),
                                   self.consumer.is_retryable, self.sleep)
        if result.outcome is CommitOutcome.COMMITTED:
            for ps in targets:
                if ps.tp in positions:
                    ps.tracker.mark_committed(positions[ps.tp])
            self.metrics.commits.labels(self.group).inc()
        elif result.outcome is CommitOutcome.UNCERTAIN:
            self.metrics.commit_uncertain.labels(self.group).inc()
            log.warning("%s commit outcome uncertain after %d attempts (%s); a redelivery may "
                        "follow", why, result.attempts, result.error)
        else:
            self.metrics.commit_failures.labels(self.group).inc()
            log.warning("%s commit failed after %d attempts (%s); left to the next commit or "
                        "a redelivery", why, result.attempts, result.error)
        return result.outcome

    # ------------------------------------------------------------------ rebalance

    def _on_assign(self, tps: list[TP]) -> None:
        self.metrics.rebalances.labels(self.group, "assign").inc()
        self.history.append(("assign", sorted(tps)))
        for tp in tps:
            old = self.parts.get(tp)
            if old is not None:
                old.stop_dispatch()
            self.parts[tp] = PartitionState(*tp)
            if self._draining:
                self.parts[tp].paused = True
        if self._draining and tps:
            self.consumer.pause(list(tps))
        log.info("%s assigned %s", self.group, sorted(tps))

    def _on_revoke(self, tps: list[TP]) -> None:
        self.metrics.rebalances.labels(self.group, "revoke").inc()
        self.history.append(("revoke", sorted(tps)))
        targets = [self.parts[tp] for tp in tps if tp in self.parts]
        for ps in targets:
            ps.stop_dispatch()
        deadline = time.monotonic() + self.config.revoke_timeout
        while any(ps.busy() for ps in targets) and time.monotonic() < deadline:
            self._apply_completions(block=0.02)
        self._apply_completions()
        self._collect_unreported(targets)
        self._commit(targets, "revoke")
        self._forget(targets)
        log.info("%s revoked %s", self.group, sorted(tps))

    @staticmethod
    def _collect_unreported(targets: list[PartitionState]) -> None:
        """Completes offsets a runner still stuck on a later record finished but not reported."""
        for ps in targets:
            for lane in ps.all_lanes():
                for offset in list(lane.done):
                    ps.tracker.complete(offset)

    def _on_lost(self, tps: list[TP]) -> None:
        """Lost, not revoked: another member may own them already; commit nothing."""
        self.metrics.rebalances.labels(self.group, "lost").inc()
        self.history.append(("lost", sorted(tps)))
        targets = [self.parts[tp] for tp in tps if tp in self.parts]
        for ps in targets:
            ps.stop_dispatch()
        self._forget(targets)
        log.warning("%s lost %s", self.group, sorted(tps))

    def _forget(self, targets: list[PartitionState]) -> None:
        for ps in targets:
            if self.parts.get(ps.tp) is ps:
                del self.parts[ps.tp]
        if self.buffer is not None and targets:
            gone = {id(ps) for ps in targets}
            self.buffer.drop(lambda item: id(item[0]) in gone)
