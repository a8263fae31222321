"""The poll loop: polls, dispatches, applies completions, pauses/resumes, commits, rebalances.

The processor is the one place where pure logic meets the consumer. It never runs a handler:
records go to lanes (``dispatch``), runners execute them on a runtime (``runner``, ``runtime``)
and report completions back through a queue, so a slow handler never costs the group a
rebalance. What to pause is ``backpressure.decide``'s, when a tier record may run is the
``TierGate``'s, what a commit outcome means is the ``Committer``'s.

Commit order on revoke and on shutdown: stop dispatching the partitions concerned, wait
(bounded) for their in-flight records, apply completions, commit synchronously, then drop their
state. An offset is completed only when its handler returned or its failure was handed off and
acknowledged, so a commit never passes a record whose work is not durable.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from kworkers.clock import Clock
from kworkers.config import WorkerConfig
from kworkers.consumer import backpressure
from kworkers.consumer.breaker import State
from kworkers.consumer.commit import CommitOutcome
from kworkers.consumer.committer import Committer
from kworkers.consumer.deadline import DeadlineWatch
from kworkers.consumer.dispatch import Dispatcher
from kworkers.consumer.partition import PartitionState
from kworkers.consumer.ports import TP, ConsumerPort
from kworkers.consumer.runner import Runner
from kworkers.consumer.tier_gate import TierGate
from kworkers.metrics import Metrics
from kworkers.supervision import Supervisor

log = logging.getLogger("kworkers.consumer")

POLL_TIMEOUT = 0.1
#: how often the consumer-lag gauge is refreshed (from the client's cached watermarks)
LAG_INTERVAL_S = 5.0


class Processor:
    def __init__(self, config: WorkerConfig, consumer: ConsumerPort, topics: Iterable[str],
                 runner: Runner, metrics: Metrics, clock: Clock, supervisor: Supervisor,
                 gate: TierGate | None = None) -> None:
        self.config = config
        self.supervisor = supervisor
        #: a handler call running this long counts as a hung runner (None: no bound)
        self.stall_bound = config.stall_bound()
        self.consumer = consumer
        self.topics = list(topics)
        self.runner = runner
        self.clock = clock
        self.gate = gate
        self.group = group = consumer.group
        self.metrics = metrics
        self.parts: dict[TP, PartitionState] = {}
        self.committer = Committer(consumer, metrics, group)
        # batch handlers take whole partitions (keys stay in order inside a batch)
        key_lanes = config.ordering == "key" and runner.batch is None
        self.dispatcher = Dispatcher(self.parts, runner, key_lanes, gate, clock)
        self.watch = (DeadlineWatch(config.message_timeout, clock, runner.start)
                      if runner.watched and config.message_timeout is not None else None)
        self.limits = backpressure.Limits(config.max_in_flight, config.max_in_flight_per_partition,
                                          config.delay_buffer if gate is not None else None)
        self._m_ok = metrics.records.labels(group, "ok")
        self._m_retried = metrics.records.labels(group, "retried")
        self._m_dead = metrics.records.labels(group, "dead_lettered")
        self._m_skipped = metrics.records.labels(group, "skipped")
        self._m_duration = metrics.handler_duration.labels(group)
        self._m_in_flight = metrics.in_flight.labels(group)
        self._m_paused = metrics.paused.labels(group)
        self._m_fenced = metrics.fenced.labels(group)
        self._since_commit = 0
        self._last_commit = clock.monotonic()
        self._last_lag = float("-inf")
        self._buffer_full = False
        self._breaker_was_open = False
        self._draining = False
        self._stop = threading.Event()
        self.ready = threading.Event()
        self.closed = threading.Event()
        #: rebalance events as they happened ("assign" / "revoke" / "lost", partitions)
        self.history: list[tuple[str, list[TP]]] = []

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Begin a graceful stop: start no further record now (any thread, a signal handler
        included); the poll loop then drains, commits and leaves the group."""
        self._stop.set()
        for _ in range(3):  # the poll thread may be changing the assignment meanwhile
            try:
                for ps in list(self.parts.values()):
                    ps.halted = True
                return
            except RuntimeError:
                continue

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

    def _step(self) -> None:
        gate = self.gate
        timeout = POLL_TIMEOUT if gate is None else gate.wait_bound(POLL_TIMEOUT)
        msgs = self.consumer.poll_batch(self.config.consume_batch, timeout)
        self.ready.set()
        if msgs:
            self.dispatcher.dispatch(msgs)
            if gate is not None and gate.skipped:  # another group's retries, completed unrun
                skipped = gate.take_skipped()
                self._since_commit += skipped
                self._m_skipped.inc(skipped)
        self.runner.hand_offs.tick()
        self._apply_completions()
        if gate is not None:
            self.dispatcher.release(gate.release_due(self.parts))
        if self.watch is not None:
            self.watch.check(self.parts.values())
        self._breaker()
        self._supervise()
        self._backpressure()
        now = self.clock.monotonic()
        if now - self._last_lag >= LAG_INTERVAL_S:
            self._last_lag = now
            self._report_lag()
        if self.config.commit.should_commit(now, self._last_commit, self._since_commit):
            self._commit(list(self.parts.values()), "periodic")
            self._last_commit = now

    def _drain(self) -> None:
        """A graceful stop: start nothing more, finish what started, commit, then leave.

        Records fetched but not started cost nothing to give back: the next owner reads them
        again and none of their effects ran. So they are dropped at once, and only handler calls
        (and hand-offs) already under way are waited for, bounded by the per-message deadline
        when there is one and by ``drain_timeout`` in any case.
        """
        self._draining = True
        parts = list(self.parts.values())
        for ps in parts:
            ps.halt()
        self._backpressure()
        clock = self.clock
        deadline = clock.monotonic() + self.config.started_work_bound()
        while any(ps.running() for ps in self.parts.values()) and clock.monotonic() < deadline:
            self.consumer.poll_batch(self.config.consume_batch, 0.0)  # heartbeats, rebalances
            self.runner.hand_offs.tick()
            self._apply_completions(block=0.02)
        self._apply_completions()
        left = sum(ps.running() for ps in self.parts.values())
        if left:
            log.warning("drain deadline reached with %d handler calls still running; their "
                        "records will be redelivered", left)
        self._collect_unreported(list(self.parts.values()))
        # The last commit before leaving decides whether the next owner redelivers anything.
        # A rebalance in progress (other members bouncing) refuses commits until it settles,
        # and it only settles if this member keeps polling: so poll between attempts.
        deadline = clock.monotonic() + self.config.revoke_timeout
        while True:
            if self._commit(list(self.parts.values()), "drain") not in (
                    CommitOutcome.FAILED, CommitOutcome.DEFERRED):
                break
            if clock.monotonic() >= deadline:
                break
            self.consumer.poll_batch(self.config.consume_batch, 0.2)
            self._apply_completions()

    # ------------------------------------------------------------------ completions

    def _apply_completions(self, block: float = 0.0) -> None:
        parts = self.parts
        for ps, offsets, retried, dead, elapsed in self.runner.completions(block):
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

    # ------------------------------------------------------------------ flow control

    def _breaker(self) -> None:
        """Restarts lanes held back by an open breaker once it admits again (half-open: one
        probe; closed: all)."""
        b = self.runner.breaker
        if b is None:
            return
        is_open = b.state is not State.CLOSED
        if (is_open or self._breaker_was_open) and b.would_admit():
            self.dispatcher.kick()
        self._breaker_was_open = is_open

    def _supervise(self) -> None:
        sup = self.supervisor
        sup.check()
        if self.stall_bound is not None:
            stuck = self.runner.runtime.stalled(self.stall_bound)
            if stuck is not None:
                sup.fail("handler", f"{stuck} (bound {self.stall_bound:.0f}s)")

    def _backpressure(self) -> None:
        parts = list(self.parts.values())
        decision = backpressure.decide(self.limits, backpressure.Load(
            parts=[backpressure.PartitionLoad(ps.tp, ps.tracker.window, ps.paused)
                   for ps in parts],
            buffered=len(self.gate) if self.gate is not None else 0,
            buffer_full=self._buffer_full, draining=self._draining,
            breaker_open=self._breaker_was_open))
        self._buffer_full = decision.buffer_full
        if decision.pause:
            for tp in decision.pause:
                self.parts[tp].paused = True
            self.consumer.pause(list(decision.pause))
        if decision.resume:
            for tp in decision.resume:
                self.parts[tp].paused = False
            self.consumer.resume(list(decision.resume))
        self._m_in_flight.set(decision.in_flight)
        self._m_paused.set(sum(1 for ps in parts if ps.paused))

    def _report_lag(self) -> None:
        """High watermark minus committed position, per owned partition (no broker round trip:
        the client caches watermarks from its fetch responses)."""
        for ps in list(self.parts.values()):
            try:
                _lo, hi = self.consumer.watermarks(ps.tp, 0.0)
            except Exception:  # not fetched yet: nothing cached
                continue
            if hi < 0:
                continue
            base = ps.tracker.committed
            if base is None:
                base = ps.tracker.position
            lag = hi - base if base is not None else hi
            self.metrics.lag.labels(self.group, ps.topic, str(ps.partition)).set(max(0, lag))

    def _commit(self, targets: list[PartitionState], why: str) -> CommitOutcome | None:
        """The completion count restarts only when every owned partition's position went out:
        a deferred or failed commit keeps it, so the next interval tries again even if no
        record completes any more (the end of a backlog), and a revoke's commit of some
        partitions leaves the others' count alone."""
        outcome = self.committer.commit(targets, why)
        if outcome in (CommitOutcome.COMMITTED, None) and len(targets) == len(self.parts):
            self._since_commit = 0
        return outcome

    # ------------------------------------------------------------------ rebalance

    def _on_assign(self, tps: list[TP]) -> None:
        self.metrics.rebalances.labels(self.group, "assign").inc()
        self.history.append(("assign", sorted(tps)))
        for tp in tps:
            old = self.parts.get(tp)
            if old is not None:
                old.stop_dispatch()
            ps = self.parts[tp] = PartitionState(*tp, clock=self.clock)
            ps.paused = self._draining
            if self._draining:
                ps.halt()
        if self._draining and tps:
            self.consumer.pause(list(tps))
        log.info("%s assigned %s", self.group, sorted(tps))

    def _on_revoke(self, tps: list[TP]) -> None:
        self.metrics.rebalances.labels(self.group, "revoke").inc()
        self.history.append(("revoke", sorted(tps)))
        targets = [self.parts[tp] for tp in tps if tp in self.parts]
        for ps in targets:
            ps.stop_dispatch()
        deadline = self.clock.monotonic() + self.config.revoke_timeout
        while any(ps.busy() for ps in targets) and self.clock.monotonic() < deadline:
            self._apply_completions(block=0.02)
        self._apply_completions()
        self._collect_unreported(targets)
        self._commit(targets, "revoke")
        self._forget(targets)
        log.info("%s revoked %s", self.group, sorted(tps))

    def _on_lost(self, tps: list[TP]) -> None:
        """Lost, not revoked: another member may own them already; commit nothing."""
        self.metrics.rebalances.labels(self.group, "lost").inc()
        self.history.append(("lost", sorted(tps)))
        targets = [self.parts[tp] for tp in tps if tp in self.parts]
        for ps in targets:
            ps.stop_dispatch()
        self._forget(targets)
        log.warning("%s lost %s", self.group, sorted(tps))

    @staticmethod
    def _collect_unreported(targets: list[PartitionState]) -> None:
        """Completes offsets a runner still stuck on a later record finished but not reported."""
        for ps in targets:
            for lane in ps.all_lanes():
                for offset in list(lane.done):
                    ps.tracker.complete(offset)

    def _forget(self, targets: list[PartitionState]) -> None:
        for ps in targets:
            if self.parts.get(ps.tp) is ps:
                del self.parts[ps.tp]
        if self.gate is not None and targets:
            self.gate.forget(targets)
