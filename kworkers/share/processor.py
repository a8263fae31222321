"""The share-group poll loop: acquire, feed lanes, acknowledge what completed, release the rest.

Built from the consumer core's parts, not beside them: records run in ``Runner.steps`` on the
worker's ``ThreadRuntime`` or ``AsyncRuntime`` (activity context, idempotency store, deadlines,
breaker, tracing through the invoker), failures go through the same ``HandOffStep`` to a retry
tier or the DLQ, and everything reports back through the one completion queue. What differs is
what a completion means: not an offset to commit but one record to acknowledge.

The share consumer is single-threaded and not thread-safe, so every acknowledgement happens
here, on the poll thread, when its completion arrives:

- handler returned -> ACCEPT;
- failure handed to a retry tier or the DLQ -> ACCEPT once the broker acknowledged the hand-off
  (``HandOffStep`` posts the completion only then), so the record is never in neither place;
- a record too late to start under its lock (``LockGate``), or not started when the worker
  stops -> RELEASE: another member takes it now, and its delivery count goes up by one;
- a record near its delivery limit -> the DLQ first, unrun (``ShareRules``), then ACCEPT.

One more rule comes from the client (confluent-kafka 2.16.1, Preview): ``poll`` raises
``IllegalStateException`` while any record of the previous poll is unacknowledged. So a member
polls again only when everything it holds is settled; between polls it feeds lanes, applies
completions and sends acknowledgements (``flush``) so finished records do not wait for the slow
ones. Deadlines bound how long that takes; other members keep fetching meanwhile.

Lanes: a share group promises no order, so lanes exist only to run records in parallel. Idle
lanes are fed from the poll's backlog in chunks of about ``CHUNK_S`` of measured handler time,
at most ``concurrency`` lanes at once, so no record waits behind a slow one longer than that.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable

from kworkers.clock import Clock
from kworkers.consumer.partition import Item, Lane, Poisoned
from kworkers.consumer.poll_loop import VIEWS_INTERVAL_S, PollLoop
from kworkers.consumer.ports import TP
from kworkers.consumer.runner import Runner
from kworkers.consumer.settings import POLL_TIMEOUT_S, LoopSettings
from kworkers.consumer.stall import Hold, PartitionView
from kworkers.metrics import Metrics, observe_many
from kworkers.share.backlog import BacklogReporter
from kworkers.share.gate import LockGate
from kworkers.share.partition import SharePartition
from kworkers.share.ports import AckType, Acquired, RecordKey, SharePort
from kworkers.share.rules import ShareRules
from kworkers.supervision import Supervisor

log = logging.getLogger("kworkers.share")

#: while records are held, how long the loop waits for a completion before its other duties
WAIT_S = 0.02
#: acknowledgements pending while records are still held are sent at least this often
ACK_FLUSH_S = 0.2
#: refused acknowledgements are summarised in the log at most this often
ACK_LOG_S = 10.0


class ShareProcessor(PollLoop):
    def __init__(self, settings: LoopSettings, consumer: SharePort, topics: Iterable[str],
                 runner: Runner, gate: LockGate, rules: ShareRules, metrics: Metrics,
                 clock: Clock, supervisor: Supervisor) -> None:
        # settings: the loop's, with the handler deadline the share group's lock allows
        group = consumer.group
        super().__init__(settings, runner, metrics, clock, supervisor, group, rules.deadline_s)
        self.consumer = consumer
        self.topics = list(topics)
        self.gate = gate
        self.rules = rules
        #: records acquired and not yet acknowledged -> when (the gate reads it)
        self.held = gate.acquired
        self.parts: dict[TP, SharePartition] = {}
        #: acquired, not yet handed to a lane, in acquisition order
        self.backlog: deque[tuple[SharePartition, Item]] = deque()
        self.active: list[Lane] = []
        #: per partition, one past the highest offset this member acquired (backlog metric)
        self.positions: dict[TP, int] = {}
        #: measured handler seconds per record (None until the first completions)
        self.mean_s: float | None = None
        self.backlog_reporter = BacklogReporter(consumer, self.positions,
                                                metrics.share_backlog, group)
        self._m_acks = {kind: metrics.share_acks.labels(group, kind)
                        for kind in ("accept", "release", "reject")}
        self._m_ack_failures = metrics.share_ack_failures.labels(group)
        self._m_redelivered = metrics.share_redeliveries.labels(group)
        self._pending_acks = 0
        self._last_flush = clock.monotonic()
        self._refused = 0
        self._last_refusal = ""
        self._last_ack_log = float("-inf")
        # a partition holding acquired records with none running, and no progress for the
        # bound, is stalled (no lag query: the held records are the work waiting)

    # ------------------------------------------------------------------ lifecycle
    # (``stop`` is the skeleton's: the drain releases what has not started, finishes what
    # has, and leaves)

    def _open(self) -> None:
        self.consumer.subscribe(self.topics)
        self.backlog_reporter.start()

    def _leave(self) -> None:
        self.backlog_reporter.stop()
        try:
            self.consumer.close()  # sends what is left and leaves the group
        except Exception:
            log.exception("share consumer close failed")
        for ps in self.parts.values():
            ps.halt()

    def _step(self) -> None:
        if not self.held:
            got = self.consumer.poll(POLL_TIMEOUT_S)  # carries the pending acknowledgements
            self._pending_acks = 0
            self._last_flush = self.clock.monotonic()
            self.ready.set()
            if got:
                self._admit(got)
        else:
            self._apply_completions(block=WAIT_S)
        self.runner.hand_offs.tick()
        self._apply_completions()
        self._feed()
        self._cap_to_locks()
        if self.watch is not None:
            self.watch.check(self.parts.values())
        self._supervise()
        self._flush()
        self._report()
        now = self.clock.monotonic()
        if now - self._last_views >= VIEWS_INTERVAL_S:
            self._last_views = now
            self._publish_views()

    def _publish_views(self) -> None:
        """What the stall watch judges (``kworkers.consumer.stall``): per partition, the
        records held and whether a handler call runs for it."""
        held: dict[TP, int] = {}
        for topic, partition, _off in list(self.held):
            tp = (topic, partition)
            held[tp] = held.get(tp, 0) + 1
        calling = self.runner.runtime.calling()
        breaker = self.runner.breaker
        hold = (Hold.DRAINING if self._draining else
                Hold.BREAKER if breaker is not None and not breaker.would_admit() else None)
        pacer, decoder = self.runner.pacer, self.runner.decoder
        paced = pacer.waiting() if pacer is not None else frozenset()
        registry = decoder.waiting() if decoder is not None else frozenset()

        leases = self.runner.lease_waits()

        def hold_of(tp: TP) -> Hold | None:
            return (hold if hold is not None else Hold.REGISTRY if tp in registry
                    else Hold.RATE_LIMIT if tp in paced else Hold.LEASE if tp in leases
                    else None)

        self.stall_views = tuple(
            PartitionView(tp, ps.progress_at, tp in calling or ps.handoffs > 0,
                          hold_of(tp), held.get(tp, 0), None,
                          leases.get(tp) if hold_of(tp) is Hold.LEASE else None)
            for tp, ps in list(self.parts.items()))

    def _drain(self) -> None:
        """SIGTERM: release every record not started at once (another member takes it now),
        let started handler calls and hand-offs finish (bounded by the deadline and
        ``drain_timeout``), release whatever is still held, send it all, then leave."""
        self._draining = True
        for ps, item in self.backlog:
            self._release(_key_of(ps, item))
        self.backlog.clear()
        for ps in self.parts.values():
            ps.halt()
        self.consumer.flush()
        self._pending_acks = 0
        clock = self.clock
        deadline = clock.monotonic() + self.settings.started_work_bound()
        while any(ps.running() for ps in self.parts.values()) and clock.monotonic() < deadline:
            self.runner.hand_offs.tick()
            self._apply_completions(block=WAIT_S)
            self._flush()
        self._apply_completions()
        left = list(self.held)
        for key in left:
            self._release(key)
        if left:
            log.info("%s: released %d records not finished at stop", self.group, len(left))
        self.consumer.flush(wait=self.settings.revoke_timeout)
        self._report()

    # ------------------------------------------------------------------ acquisition

    def _admit(self, got: list[Acquired]) -> None:
        now = self.clock.monotonic()
        rules, held, parts, positions = self.rules, self.held, self.parts, self.positions
        again = 0
        for msg, deliveries in got:
            key = (msg.topic, msg.partition, msg.offset)
            tp = (msg.topic, msg.partition)
            ps = parts.get(tp)
            if ps is None:
                ps = parts[tp] = SharePartition(msg.topic, msg.partition, self.clock)
            if msg.offset >= positions.get(tp, 0):
                positions[tp] = msg.offset + 1
            if not ps.deliveries:  # work for a partition that held none: its stall clock
                ps.progressed(now)
            if deliveries > 1:
                again += 1
            ps.deliveries[msg.offset] = deliveries
            if key in held:
                # Ours again while its first run still goes on (its lock expired): that run's
                # completion acknowledges the new acquisition; do not run it twice here.
                held[key] = now
                continue
            held[key] = now
            if rules.is_last_delivery(deliveries):
                # first in line: the dead letter must be written while deliveries are left
                self.backlog.appendleft((ps, Poisoned(msg, rules.last_delivery(deliveries))))
            else:
                self.backlog.append((ps, msg))
        if again:
            self._m_redelivered.inc(again)

    def _feed(self) -> None:
        """Hands backlog records to idle lanes; releases those that can no longer start."""
        self._prune()
        backlog = self.backlog
        if not backlog or self._draining:
            return
        now = self.clock.monotonic()
        while backlog:
            ps, item = backlog[0]
            at = self.held.get(_key_of(ps, item))
            if at is None or isinstance(item, Poisoned) or now <= self.rules.latest_start(at):
                break
            backlog.popleft()
            self._release(_key_of(ps, item))
        breaker = self.runner.breaker
        if breaker is not None and not breaker.would_admit():
            return
        free = self.settings.concurrency - len(self.active)
        depth = self.rules.chunk(self.mean_s, len(backlog), free)
        while free > 0 and backlog:
            ps, first = backlog.popleft()
            items = [first]
            while len(items) < depth and backlog and backlog[0][0] is ps:
                items.append(backlog.popleft()[1])
            lane = ps.new_lane()
            start = lane.offer(items)
            assert start is not None  # a new lane has no runner yet
            self.active.append(lane)
            self.runner.start(lane, *start)
            free -= 1

    def _prune(self) -> None:
        """Forgets lanes whose runner finished; records a runner held back (open breaker) go
        back to the front of the backlog."""
        still: list[Lane] = []
        idle: set[SharePartition] = set()
        for lane in self.active:
            rest = lane.reclaim()
            if rest is None:
                still.append(lane)
                continue
            part = lane.part
            assert isinstance(part, SharePartition)
            idle.add(part)
            if rest:
                self.backlog.extendleft((part, item) for item in reversed(rest))
        self.active = still
        for ps in idle:
            ps.prune_idle_lanes()

    def _cap_to_locks(self) -> None:
        """A handler still running near its record's lock loses it to the deadline now, even
        if heartbeats kept extending the deadline (the client cannot renew the lock)."""
        if self.watch is None:
            return
        now = self.clock.monotonic()
        for lane in self.active:
            cur = lane.current
            if cur is None:
                continue
            at = self.held.get((cur.topic, cur.partition, cur.offset))
            if at is not None and now >= self.rules.latest_finish(at):
                lane.expire()

    # ------------------------------------------------------------------ acknowledgements

    def _apply_completions(self, block: float = 0.0) -> None:
        held, late = self.held, self.gate.late
        now = self.clock.monotonic()
        for ps, offsets, retried, dead, elapsed, calls in self.runner.completions(block):
            assert isinstance(ps, SharePartition)
            ps.progressed(now)
            topic, partition = ps.tp
            released = fenced = 0
            for off in offsets:
                key = (topic, partition, off)
                if held.pop(key, None) is None:
                    fenced += 1  # released at stop, or acknowledged already
                    continue
                ps.deliveries.pop(off, None)
                kind: AckType = "accept"
                if late and key in late:
                    late.discard(key)
                    kind = "release"
                    released += 1
                self._ack(key, kind)
            if fenced:
                self._m_fenced.inc(fenced)
            ok = len(offsets) - retried - dead - released - fenced
            if ok > 0:
                self._m_ok.inc(ok)
            if calls:
                per = elapsed / calls
                observe_many(self._m_duration, per, calls)
                self.mean_s = per if self.mean_s is None else 0.8 * self.mean_s + 0.2 * per
            if retried:
                self._m_retried.inc(retried)
            if dead:
                self._m_dead.inc(dead)

    def _release(self, key: RecordKey) -> None:
        if self.held.pop(key, None) is None:
            return
        self.gate.late.discard(key)
        ps = self.parts.get((key[0], key[1]))
        if ps is not None:
            ps.deliveries.pop(key[2], None)
        self._ack(key, "release")

    def _ack(self, key: RecordKey, kind: AckType) -> None:
        self.consumer.acknowledge(key, kind)
        self._m_acks[kind].inc()
        self._pending_acks += 1

    def _flush(self) -> None:
        if not self._pending_acks:
            return
        now = self.clock.monotonic()
        if now - self._last_flush >= ACK_FLUSH_S:
            self.consumer.flush()
            self._pending_acks = 0
            self._last_flush = now

    def _report(self) -> None:
        for f in self.consumer.ack_failures():
            n = len(f.offsets)
            self._m_ack_failures.inc(n)
            self._refused += n
            self._last_refusal = f.error
        now = self.clock.monotonic()
        if self._refused and now - self._last_ack_log >= ACK_LOG_S:
            log.warning("%s: the broker refused %d acknowledgements (last: %s); those records "
                        "are delivered again (the idempotency store absorbs a repeated "
                        "effect)", self.group, self._refused, self._last_refusal)
            self._refused = 0
            self._last_ack_log = now
        self._m_in_flight.set(len(self.held))


def _key_of(ps: SharePartition, item: Item) -> RecordKey:
    return (ps.topic, ps.partition, item.msg.offset if isinstance(item, Poisoned)
            else item.offset)
