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
from kworkers.consumer import backpressure, observe
from kworkers.consumer.breaker import State
from kworkers.consumer.buffered import BufferedHandOffs
from kworkers.consumer.commit import CommitOutcome, Run
from kworkers.consumer.committer import Committer
from kworkers.consumer.dispatch import Dispatcher
from kworkers.consumer.fencing import Membership
from kworkers.consumer.lag_view import Facts, Figures, LagView
from kworkers.consumer.partition import PartitionState
from kworkers.consumer.poll_loop import VIEWS_INTERVAL_S, PollLoop
from kworkers.consumer.ports import TP, ConsumerPort, TransactionPort
from kworkers.consumer.runner import Runner
from kworkers.consumer.settings import POLL_TIMEOUT_S, LoopSettings
from kworkers.consumer.stall import UNHEALTHY_AFTER
from kworkers.consumer.stall_watch import LagSource
from kworkers.consumer.tier_gate import TierGate
from kworkers.consumer.transactional import TransactionalCommitter
from kworkers.memory import RECORD_COST
from kworkers.metrics import Metrics, observe_all
from kworkers.supervision import Supervisor

log = logging.getLogger("kworkers.consumer")

#: how often the consumer-lag gauge is refreshed (from the client's cached watermarks)
LAG_INTERVAL_S = 5.0
#: how often a fenced member whose coordinator answers again asks whether it is a member
PROBE_EVERY_S = 1.0
#: an idle wait woken by a completion gathers the others arriving this long after it
IDLE_SETTLE_S = 0.002
#: the longest idle wait while some partitions are not paused (then the client is asked again)
IDLE_POLL_S = 0.005
#: with a partition paused, wait for a completion rather than inside the client's poll
#: (``_step``); False only in the canary that shows the test of it has teeth
IDLE_WAITS_FOR_COMPLETIONS = True
#: the longest a hold lasts before its partitions are paused (``backpressure``): about what
#: a pause's refetch costs (librdkafka's ``fetch.wait.max.ms``, 500 ms by default); the
#: client's commit outcomes and statistics wait while a hold lasts (a rebalance does not:
#: librdkafka pauses the assignment itself before it)
HOLD_S = 0.5
#: hold partitions at their share rather than pause them when no other wants records; False
#: only in the canary that shows the test of it has teeth
HOLDS = True


class Processor(PollLoop):
    def __init__(self, settings: LoopSettings, consumer: ConsumerPort, topics: Iterable[str],
                 runner: Runner, metrics: Metrics, clock: Clock, supervisor: Supervisor,
                 gate: TierGate | None = None, offsets: LagSource | None = None,
                 membership: Membership | None = None,
                 transactions: TransactionPort | None = None,
                 lag_source: LagSource | None = None) -> None:
        group = consumer.group
        super().__init__(settings, runner, metrics, clock, supervisor, group, runner.timeout,
                         offsets)
        self.consumer = consumer
        self.topics = list(topics)
        self.gate = gate
        self.parts: dict[TP, PartitionState] = {}
        self.committer: Committer | TransactionalCommitter
        if transactions is None:
            self.committer = Committer(consumer, metrics, group, clock,
                                       settings.commit.timeout_s)
        else:  # exactly once: positions, outputs and hand-offs in one transaction
            if not isinstance(runner.hand_offs, BufferedHandOffs):
                raise TypeError("an exactly-once loop's runner buffers its hand-offs "
                                "(BufferedHandOffs)")
            self.committer = TransactionalCommitter(
                consumer, transactions, runner.hand_offs, metrics, group, clock,
                settings.commit.timeout_s, supervisor,
                unhealthy_after=UNHEALTHY_AFTER * settings.partition_stall_bound())
        #: self-fencing (None: off, or the session timeout is not known)
        self.membership = membership
        #: completions counted in the periodic commit now in flight
        self._sent_count = 0
        #: a fenced member's question to the coordinator (``_fence``)
        self._probe: Run | None = None
        self._probe_at = float("-inf")
        # batch handlers take whole partitions (keys stay in order inside a batch)
        key_lanes = settings.ordering == "key" and runner.batch is None
        self.dispatcher = Dispatcher(self.parts, runner, key_lanes, gate, clock)
        self.limits = backpressure.Limits(
            settings.max_in_flight, settings.max_in_flight_per_partition,
            gate.capacity if gate is not None else None, settings.max_in_flight_bytes)
        #: records held at the last backpressure decision (what the next poll may add to)
        self._held = 0
        #: their bytes (``PartitionState.held_bytes``), and whether that is the loop's byte
        #: bound or more (``backpressure``: nothing taken, nothing resumed meanwhile)
        self._held_bytes = 0
        self._over = False
        #: what a record of the last poll cost on average (0: none yet), which sizes the next
        #: poll under the byte bound
        self._record_bytes = 0
        #: since when partitions are held (``backpressure``: the loop takes nothing meanwhile)
        self._hold_since: float | None = None
        #: the lag gauge, right from the first scrape (committed offsets read at assignment)
        self.lag_view = LagView(group, lag_source, metrics.lag,
                                Figures(metrics.time_lag, metrics.drainable,
                                        metrics.drainable_time_lag, metrics.tier_waiting,
                                        metrics.tier_due), clock)
        self._m_paused_by = {why: metrics.paused.labels(group, why)
                             for why in ("backpressure", "breaker", "draining", "fenced")}
        self._m_member_fenced = metrics.member_fenced.labels(group)
        self._m_member_fenced.set(0)
        self._m_skipped = metrics.records.labels(group, "skipped")
        self._m_in_flight_bytes = metrics.in_flight_bytes.labels(group)
        metrics.in_flight_bytes_bound.labels(group).set(settings.max_in_flight_bytes)
        self._since_commit = 0
        self._last_commit = clock.monotonic()
        self._last_lag = float("-inf")
        self._breaker_was_open = False
        #: the drain has waited for the work under way (and given up on what is left)
        self._drained = False
        #: rebalance events as they happened ("assign" / "revoke" / "lost", partitions)
        self.history: list[tuple[str, list[TP]]] = []

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Begin a graceful stop: start no further record now (any thread, a signal handler
        included); the poll loop then drains, commits and leaves the group."""
        super().stop()
        for _ in range(3):  # the poll thread may be changing the assignment meanwhile
            try:
                for ps in list(self.parts.values()):
                    ps.mark_halted()
                return
            except RuntimeError:
                continue

    def _open(self) -> None:
        self.consumer.subscribe(self.topics, self._on_assign, self._on_revoke, self._on_lost)

    def _leave(self) -> None:
        self._close()
        self.committer.close()
        for ps in self.parts.values():
            ps.stop_dispatch()
        self.parts.clear()

    def _step(self) -> None:
        gate = self.gate
        timeout = POLL_TIMEOUT_S if gate is None else gate.wait_bound(POLL_TIMEOUT_S)
        # A partition paused: a wait inside the client would outlast its work in flight (its
        # lane runs dry at the resume mark while the poll sleeps on, waiting for records of
        # the others, which may be idle). So poll without waiting (records already fetched,
        # callbacks, heartbeats) and wait for the next completion instead, which is what
        # resumes a partition.
        parts = self.parts
        hold_since = self._hold_since
        idle_wait = hold_since is not None or (
            IDLE_WAITS_FOR_COMPLETIONS and any(ps.paused for ps in parts.values()))
        if hold_since is not None:
            # held: no open partition wants records, so nothing is polled (a poll would hand
            # out the held partitions' records); the wait below ends at the hold's bound
            msgs = []
            timeout = max(0.0, min(timeout, hold_since + HOLD_S - self.clock.monotonic()))
        else:
            batch = self.settings.consume_batch
            # the least room matters only where the bound leaves less than a batch
            room = 1 if self.limits.bound() - self._held >= batch else backpressure.least_room(
                self.limits.share(len(parts)),
                (_counted(ps) for ps in parts.values() if not ps.paused and not ps.held))
            msgs = self.consumer.poll_batch(
                backpressure.poll_size(self.limits, self._held, batch, room, self._held_bytes,
                                       self._record_bytes, len(parts)),
                0.0 if idle_wait else timeout)
        self.ready.set()
        if msgs:
            self.dispatcher.dispatch(msgs)
            self._record_bytes = self.dispatcher.dispatched_bytes // len(msgs) + RECORD_COST
            if gate is not None and gate.skipped:  # another group's retries, completed unrun
                skipped = gate.take_skipped()
                self._since_commit += skipped
                self._m_skipped.inc(skipped)
        self.runner.hand_offs.tick()
        if idle_wait and not msgs:
            # while some partitions are not paused, look at the client again soon: their
            # records may come in meanwhile (a poll without a wait is cheap)
            everything = hold_since is not None or all(ps.paused for ps in parts.values())
            self._idle_wait(timeout if everything else min(timeout, IDLE_POLL_S))
        else:
            self._apply_completions()
        if gate is not None:
            self.dispatcher.release(gate.release_due(self.parts))
        if self.watch is not None:
            self.watch.check(self.parts.values())
        self._breaker()
        self._supervise()
        self._backpressure()
        now = self.clock.monotonic()
        # the drainable figure reads each partition's hold: judged now, never the views of up
        # to VIEWS_INTERVAL_S ago (a tier partition judged before its records reached the heap
        # would count every one of them as drainable: a scale-out on records not yet due)
        report = now - self._last_lag >= LAG_INTERVAL_S or self.lag_view.fresh
        if report or now - self._last_views >= VIEWS_INTERVAL_S:
            self._last_views = now
            decoder, pacer, breaker = self.runner.decoder, self.runner.pacer, self.runner.breaker
            self.stall_views = observe.stall_views(
                self.parts.values(), self.runner.runtime.calling(), self.gate,
                self._draining, self._breaker_was_open,
                decoder.waiting() if decoder is not None else frozenset(), self._fenced,
                pacer.waiting() if pacer is not None else frozenset(), clock=self.clock,
                breaker_ends=breaker.cooldown_ends() if breaker is not None else None,
                asked=pacer.asked() if pacer is not None else None, memory=self._over,
                registry_due=decoder.asks_due() if decoder is not None else None,
                leases=self.runner.lease_waits())
        if report:
            self._last_lag = now
            self.lag_view.report(self.parts.values(), self.consumer, self._facts())
        self._commits(now)

    def _facts(self) -> Facts:
        """What the drainable rule reads beyond the lag (``lag_view.Facts``)."""
        pacer, gate = self.runner.pacer, self.gate
        pool = pacer is not None and pacer.pool_wide
        return Facts({v.tp: v for v in self.stall_views},
                     gate.held if gate is not None else None, pool,
                     pool and pacer is not None and pacer.fixed is not None
                     and bool(pacer.waiting()))

    @property
    def _fenced(self) -> bool:
        return self.membership is not None and self.membership.fenced

    def _commits(self, now: float) -> None:
        """Commit outcomes in, the membership checked, then a periodic commit when due: sent,
        never waited for (the outcome arrives with a later poll). The completion count falls
        by what a commit covered only when it is committed, so a deferred or failed commit
        is tried again at the next interval even when nothing completes any more."""
        for run in self.committer.tick(self.parts):
            if run.outcome is not CommitOutcome.COMMITTED:
                continue
            if run.why == "periodic":
                self._since_commit = max(0, self._since_commit - self._sent_count)
            elif run.why == "probe":
                self._confirm(now)
        self._fence(now)
        if self._fenced or self.committer.periodic_in_flight:
            return
        if now - self._last_commit >= self.settings.commit.interval_s:
            self._since_commit += self.committer.advance_past_markers(list(self.parts.values()))
        if self.settings.commit.should_commit(now, self._last_commit, self._since_commit) or \
                (self._since_commit > 0 and self.committer.due):
            self._last_commit = now
            self._sent_count = self._since_commit
            if self.committer.start(list(self.parts.values()), "periodic") is None:
                self._since_commit = 0  # every position already committed

    def _fence(self, now: float) -> None:
        """Self-fencing (``kworkers.consumer.fencing``): once the coordinator was silent too
        long, no record starts and nothing is committed; when it answers again, a probe asks
        whether this member still is one, and only a yes (or a new assignment) ends it."""
        m = self.membership
        if m is None:
            return
        m.observe(self.consumer.coordinator_contact())
        if m.update(now):
            self._set_fenced(True)
            log.warning("%s: no word from the group coordinator for %.1fs (session %gs, margin "
                        "%gs): fenced: no record starts and nothing is committed until the "
                        "group confirms the membership", self.group, m.silent_for(now),
                        m.session_s, m.margin_s)
            self.supervisor.degrade(f"membership of {self.group}",
                                    f"fenced: coordinator silent for {m.silent_for(now):.0f}s")
            return
        probe = self._probe
        if m.may_probe(now) and (probe is None or probe.done) and \
                now - self._probe_at >= PROBE_EVERY_S:
            self._probe_at = now
            self._probe = self.committer.probe(list(self.parts.values()))
            if self._probe is None:  # nothing done to ask with: contact is all there is
                self._confirm(now)

    def _confirm(self, now: float) -> None:
        """The group confirmed this member (a commit accepted, an assignment)."""
        m = self.membership
        if m is None or not m.confirm(now):
            return
        self._set_fenced(False)
        log.warning("%s: the group confirms the membership again: working again", self.group)
        self.supervisor.recover(f"membership of {self.group}")
        self.dispatcher.kick()

    def _set_fenced(self, fenced: bool) -> None:
        for ps in self.parts.values():
            ps.set_fenced(fenced)
        self._m_member_fenced.set(1 if fenced else 0)

    def _drain(self) -> None:
        """A graceful stop: start nothing more, finish what started, commit, then leave.

        Records fetched but not started cost nothing to give back: the next owner reads them
        again and none of their effects ran. So they are dropped at once, and only handler calls
        (and hand-offs) already under way are waited for, bounded by the per-message deadline
        when there is one and by ``drain_timeout`` in any case.
        """
        self._draining = True
        for ps in list(self.parts.values()):
            ps.halt()
        self._backpressure()
        # The last commit before leaving decides whether the next owner redelivers anything.
        # A rebalance in progress (other members bouncing) refuses commits until it settles,
        # and it only settles if this member keeps polling: so poll between attempts.
        clock, settings = self.clock, self.settings
        run = self._finish(list(self.parts.values()), "drain", settings.started_work_bound(),
                           poll=True)
        self._drained = True  # the close's revoke must not wait for the same work again
        deadline = clock.monotonic() + settings.revoke_timeout - settings.close_budget()
        while run is not None and clock.monotonic() < deadline:
            self._poll_away(0.05)  # serves the outcome
            self.committer.tick(self.parts)
            if not run.done:
                continue
            if run.outcome not in (CommitOutcome.FAILED, CommitOutcome.DEFERRED):
                return
            run = self.committer.start(list(self.parts.values()), "drain", last_chance=True)
        if run is not None and not run.done:
            log.warning("%s: the drain's commit went unanswered for %.1fs; the next owner may "
                        "get those records again", self.group, settings.revoke_timeout
                        - settings.close_budget())

    def _close(self) -> None:
        """A clean leave, bounded: ``Consumer.close`` takes no timeout and hangs on a frozen
        broker, so it runs on a thread of its own and the worker leaves without it after
        ``close_budget`` (the group then expires the member after its session)."""
        def close() -> None:
            try:
                self.consumer.close()  # a clean leave; revokes what is left
            except Exception:
                log.exception("consumer close failed")

        t = threading.Thread(target=close, name=f"kworkers-close-{self.group}", daemon=True)
        t.start()
        t.join(self.settings.close_budget())
        if t.is_alive():
            log.warning("%s: the consumer did not close within %.1fs (is the broker "
                        "reachable?); leaving without it", self.group,
                        self.settings.close_budget())

    def _finish(self, targets: list[PartitionState], why: str, wait_s: float,
                poll: bool) -> Run | None:
        """The one sequence a partition's last commit follows, at a revoke and at the drain
        before leaving: wait up to ``wait_s`` for the work under way (handler calls and
        hand-offs; polling meanwhile when not inside a rebalance callback, which itself runs
        inside a poll), apply what completed, collect what runners finished but did not
        report, move past transaction markers, commit."""
        deadline = self.clock.monotonic() + wait_s
        while any(ps.busy() for ps in targets) and self.clock.monotonic() < deadline:
            if poll:
                self._poll_away(0.0)  # heartbeats, rebalances
            self.runner.hand_offs.tick()
            self._apply_completions(block=0.02)
        self._apply_completions()
        left = sum(ps.running() for ps in targets)
        if left:
            log.warning("%s: %s bound reached with %d handler calls or hand-offs still under "
                        "way; their records will be redelivered", self.group, why, left)
        self.committer.collect_unreported(targets)
        if why == "revoke":
            # Inside a rebalance callback, itself inside a poll: the consumer's position may
            # already count records of this very poll, not yet dispatched, so it does not
            # vouch for anything here; and the commit is sent while they are still ours,
            # never again after the callback.
            return self.committer.start(targets, why, resendable=False)
        self.committer.advance_past_markers(targets)
        return self.committer.start(targets, why, last_chance=True)

    def _poll_away(self, timeout: float) -> None:
        """A poll whose records are given back, not run (a drain polls for heartbeats and its
        commit's outcome): their partitions may no longer commit by the consumer's
        position."""
        for m in self.consumer.poll_batch(self.settings.consume_batch, timeout):
            ps = self.parts.get((m[0], m[1]))
            if ps is not None:
                ps.tracker.given_back()

    # ------------------------------------------------------------------ completions

    def _idle_wait(self, timeout: float) -> None:
        """With a partition paused and nothing polled: apply completions as they come, for up
        to ``timeout``, and end the wait as soon as one lets a paused partition resume. Not
        at every completion: hand-offs complete one record at a time, and a step per record
        took a storm's CPU per failed record from 41 to 51 us."""
        clock = self.clock
        until = clock.monotonic() + timeout
        while True:
            left = until - clock.monotonic()
            if left <= 0 or not self._apply_completions(block=left, settle=IDLE_SETTLE_S):
                return
            if self._resumable():
                return

    def _resumable(self) -> bool:
        """A paused or held partition is down to its resume marks, and the loop under its byte
        bound: what the step after the wait acts on (``backpressure.decide``)."""
        parts = self.parts
        marks = backpressure.Marks.of(self.limits, len(parts))
        if self._over and self.limits.over(sum(ps.held_bytes() for ps in parts.values())):
            return False
        return any((ps.paused or ps.held) and marks.down(_counted(ps), ps.held_bytes(),
                                                         ps.tracker.window)
                   for ps in parts.values())

    def _apply_completions(self, block: float = 0.0, settle: float = 0.0) -> int:
        """Applies the completions reported so far (waiting up to ``block`` for the first);
        how many reports there were."""
        parts = self.parts
        now = self.clock.monotonic()
        # counted over the whole drain, one update per counter: a storm's hand-offs complete
        # one record at a time, and each counter update takes a lock
        fenced = done = all_retried = all_dead = seen = 0
        durations: list[tuple[float, int]] = []
        for ps, offsets, retried, dead, elapsed, calls in self.runner.completions(block, settle):
            seen += 1
            n = len(offsets)
            if parts.get(ps.tp) is not ps:
                fenced += n
                continue
            ps.tracker.complete_many(offsets)
            ps.progressed(now)
            done += n
            all_retried += retried
            all_dead += dead
            if calls:
                durations.append((elapsed / calls, calls))
        if durations:
            observe_all(self._m_duration, durations)
        self._since_commit += done
        if fenced:
            self._m_fenced.inc(fenced)
        if done - all_retried - all_dead:
            self._m_ok.inc(done - all_retried - all_dead)
        if all_retried:
            self._m_retried.inc(all_retried)
        if all_dead:
            self._m_dead.inc(all_dead)
        return seen

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

    def _backpressure(self) -> None:
        parts = list(self.parts.values())
        now = self.clock.monotonic()
        since = self._hold_since
        decision = backpressure.decide(self.limits, backpressure.Load(
            parts=[backpressure.PartitionLoad(ps.tp, _counted(ps), ps.paused, ps.held,
                                              ps.held_bytes(), ps.tracker.window)
                   for ps in parts],
            draining=self._draining, breaker_open=self._breaker_was_open,
            fenced=self._fenced,
            may_hold=self._may_hold(now, since), wants=self._wants))
        self._held = decision.in_flight
        self._held_bytes, self._over = decision.bytes, decision.over
        held = decision.held
        if held or since is not None:
            for ps in parts:
                ps.set_held(False)
            for tp in held:
                self.parts[tp].set_held(True)
            self._hold_since = (since if since is not None else now) if held else None
        if decision.pause:
            for tp in decision.pause:
                self.parts[tp].paused = True
            self.consumer.pause(list(decision.pause))
        if decision.resume:
            for tp in decision.resume:
                self.parts[tp].paused = False
            self.consumer.resume(list(decision.resume))
        self._m_in_flight.set(decision.in_flight)
        self._m_in_flight_bytes.set(decision.bytes)
        paused = sum(1 for ps in parts if ps.paused) + len(held)
        why = observe.pause_reason(self._draining, self._breaker_was_open, self._fenced)
        for reason, gauge in self._m_paused_by.items():
            gauge.set(paused if reason == why else 0)

    def _may_hold(self, now: float, since: float | None) -> bool:
        """A hold may start or go on: within ``HOLD_S``, and never while self-fencing could
        come due meanwhile (a hold polls nothing, so the statistics that tell the
        coordinator's silence would arrive only after it)."""
        if not HOLDS or (since is not None and now - since >= HOLD_S):
            return False
        m = self.membership
        return m is None or m.may_wait(now, HOLD_S)

    def _wants(self, tp: TP) -> bool:
        """Whether the next poll may have records of ``tp`` to hand out (a hold asks this of
        the open partitions): unless the client caught up with its log's end, assume so."""
        return not self.consumer.caught_up(tp)

    # ------------------------------------------------------------------ rebalance

    def _on_assign(self, tps: list[TP]) -> None:
        self._confirm(self.clock.monotonic())  # an assignment: the group knows this member
        self.metrics.rebalances.labels(self.group, "assign").inc()
        self.history.append(("assign", sorted(tps)))
        for tp in tps:
            old = self.parts.get(tp)
            if old is not None:
                old.stop_dispatch()
            ps = self.parts[tp] = PartitionState(*tp, clock=self.clock)
            ps.set_fenced(self._fenced)
            ps.paused = self._draining
            if self._draining:
                ps.halt()
        # The client's pause state is set, never assumed: librdkafka keeps an application pause
        # across a revoke and a reassignment, and a partition the client holds paused while
        # the worker believes it running is never fetched again.
        if tps:
            if self._draining:
                self.consumer.pause(list(tps))
            else:
                self.consumer.resume(list(tps))
        if self.gate is not None:
            self.gate.resize(len(self.parts))
        self.lag_view.assigned([self.parts[tp] for tp in tps])
        log.info("%s assigned %s", self.group, sorted(tps))

    def _on_revoke(self, tps: list[TP]) -> None:
        self.metrics.rebalances.labels(self.group, "revoke").inc()
        self.history.append(("revoke", sorted(tps)))
        targets = [self.parts[tp] for tp in tps if tp in self.parts]
        for ps in targets:
            ps.stop_dispatch()
        wait = 0.0 if self._drained else self.settings.revoke_timeout
        run = self._finish(targets, "revoke", wait, poll=False)
        self.committer.wait(run, self.settings.revoke_timeout, self.parts)
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

    def _forget(self, targets: list[PartitionState]) -> None:
        self.committer.settle(targets)
        self.lag_view.forget(ps.tp for ps in targets)
        for ps in targets:
            if self.parts.get(ps.tp) is ps:
                del self.parts[ps.tp]
        if self.gate is not None and targets:
            self.gate.forget(targets)
            self.gate.resize(len(self.parts))


def _counted(ps: PartitionState) -> int:
    """What a partition's share counts (``backpressure``): its records not yet done; while one
    of its hand-offs waits for an acknowledgement, its whole window, as before issue #50. A
    failure the worker cannot place yet (an outage of the tier or DLQ topics holds it) is no
    I/O to overlap: running records past it only grows what waits behind it and what a crash
    runs again, so the partition stops at a share as it did (``tests/faults/
    test_handoff_faults.py``, ``test_broker_pause.py::test_dlq_outage_...``)."""
    tr = ps.tracker
    return tr.window if ps.handoffs else tr.in_flight
