"""Liveness without a broker: a reassigned partition is resumed in the client, runners share
their threads, and a stalled partition is told apart from one held on purpose.

The fake consumer keeps an application pause across a revoke and a reassignment, as librdkafka
does (librdkafka #1849): a worker that assumes a new assignment starts unpaused never fetches
such a partition again. The same behaviours run on the real broker in
tests/faults/test_liveness.py.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, cast

import pytest

from kworkers import Worker
from kworkers.clock import FakeClock
from kworkers.consumer import backpressure, processor
from kworkers.consumer.ports import ConsumerPort
from kworkers.consumer.stall import (
    UNHEALTHY_AFTER,
    Hold,
    PartitionView,
    candidates,
    default_bound,
    judge,
)
from kworkers.consumer.stall_watch import StallWatch
from kworkers.consumer.tier_gate import TierGate
from kworkers.message import Message
from kworkers.supervision import Supervisor
from tests.unit.test_loop_with_fake_consumer import RecordingSender, _idle

TP = tuple[str, int]
Callback = Callable[[list[TP]], None]


class StickyConsumer:
    """A scripted consumer whose pauses survive revokes and reassignments, whose rebalances
    run on the poll thread (inside ``poll_batch``, as the client's callbacks do)."""

    def __init__(self, records: dict[TP, list[Message]], group: str = "g") -> None:
        self.group = group
        self.logs = {tp: list(ms) for tp, ms in records.items()}
        self.next = dict.fromkeys(self.logs, 0)
        self.assigned: set[TP] = set()
        self.paused: set[TP] = set()
        self.commits: dict[TP, int] = {}
        self.pending: list[tuple[list[TP], list[TP]]] = []
        self.callbacks: tuple[Callback, Callback, Callback] | None = None
        self.polls = 0
        self.results: list[tuple[dict[TP, int], BaseException | None]] = []
        self.lock = threading.Lock()
        #: whether ``caught_up`` tells (else it is always unsure, as without the events)
        self.reports_ends = False

    def subscribe(self, topics: Iterable[str], on_assign: Callback, on_revoke: Callback,
                  on_lost: Callback) -> None:
        self.callbacks = (on_assign, on_revoke, on_lost)
        self.rebalance([], sorted(self.logs))

    def rebalance(self, revoke: list[TP], assign: list[TP]) -> None:
        with self.lock:
            self.pending.append((revoke, assign))

    def _apply_rebalances(self) -> None:
        assert self.callbacks is not None
        on_assign, on_revoke, _lost = self.callbacks
        with self.lock:
            todo, self.pending = self.pending, []
        for revoke, assign in todo:
            if revoke:
                on_revoke(revoke)
                self.assigned -= set(revoke)
            for tp in assign:  # a new owner starts from the committed position
                self.next[tp] = self.commits.get(tp, 0)
            self.assigned |= set(assign)
            if assign:
                on_assign(assign)

    def poll_batch(self, n: int, timeout: float) -> list[Message]:
        self._apply_rebalances()
        out: list[Message] = []
        order = sorted(self.assigned - self.paused)
        self.polls += 1
        if order:  # partitions take turns at the head of a fetch, as fetch responses do
            k = self.polls % len(order)
            order = order[k:] + order[:k]
        for tp in order:
            log, i = self.logs[tp], self.next[tp]
            take = log[i:i + max(0, (n - len(out)) // 2 or n - len(out))]
            self.next[tp] = i + len(take)
            out += take
        if not out:
            time.sleep(min(timeout, 0.005))
        return out

    def commit_async(self, positions: dict[TP, int]) -> None:
        for tp, pos in positions.items():
            self.commits[tp] = max(pos, self.commits.get(tp, 0))
        self.results.append((dict(positions), None))

    def commit_results(self) -> list[tuple[dict[TP, int], BaseException | None]]:
        out, self.results = self.results, []
        return out

    def coordinator_contact(self) -> float | None:
        return None

    def session_timeout(self) -> float | None:
        return None

    def pause(self, tps: list[TP]) -> None:
        self.paused |= set(tps)

    def resume(self, tps: list[TP]) -> None:
        self.paused -= set(tps)

    def watermarks(self, tp: TP, timeout: float) -> tuple[int, int]:
        return 0, len(self.logs[tp])

    def caught_up(self, tp: TP) -> bool:
        """As librdkafka's end-of-partition events say it, when ``reports_ends``."""
        return self.reports_ends and self.next[tp] >= len(self.logs[tp])

    def position(self, tps: list[TP]) -> dict[TP, int | None]:
        return {tp: self.next.get(tp) for tp in tps}

    def close(self) -> None:
        pass

    def is_retryable(self, exc: BaseException) -> bool:
        return False

    def is_rebalancing(self, exc: BaseException) -> bool:
        return False


def _records(partitions: int, n: int) -> dict[TP, list[Message]]:
    return {("t", p): [Message("t", p, o, b"k%d" % o, b"") for o in range(n)]
            for p in range(partitions)}


def _run(consumer: StickyConsumer, handler: Callable[[Message], None],
         **cfg: Any) -> tuple[Worker, threading.Thread]:  # Worker's own **settings: Any
    # the sticky fake has no ``group_metadata`` (exactly-once only, never asked here)
    port = cast(ConsumerPort, consumer)
    w = Worker(topics=["t"], group_id="g", sender=RecordingSender(),
               consumer=lambda g: port if g == "g" else _idle(g), **cfg)
    w.handler(handler)
    t = threading.Thread(target=w.run, args=(False,), daemon=True)
    t.start()
    return w, t


def _wait(cond: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_a_partition_paused_before_its_revoke_runs_again_when_it_comes_back() -> None:
    consumer = StickyConsumer(_records(2, 60))
    ran: Counter[TP] = Counter()
    gate = threading.Event()

    def handle(msg: Message) -> None:
        ran[(msg.topic, msg.partition)] += 1
        if msg.partition == 0 and msg.offset == 0:
            gate.wait(10)

    # offset 0 of partition 0 holds its lane: the partition reaches its share and is paused
    w, t = _run(consumer, handle, max_in_flight=20, max_in_flight_per_partition=10,
                consume_batch=10, revoke_timeout=0.2)
    try:
        _wait(lambda: ("t", 0) in consumer.paused, "partition 0 paused by backpressure")
        consumer.rebalance([("t", 0)], [])  # revoked while paused
        _wait(lambda: ("t", 0) not in consumer.assigned, "revoked")
        gate.set()
        consumer.rebalance([], [("t", 0)])  # and assigned again: the pause is still set
        _wait(lambda: consumer.commits.get(("t", 0)) == 60 and
              consumer.commits.get(("t", 1)) == 60, "both partitions reach their end")
    finally:
        w.stop()
        t.join(30)
    assert ran[("t", 1)] == 60


def test_runners_share_the_threads_when_lanes_outnumber_them() -> None:
    """One thread, two partition lanes whose queues refill at every poll: before runners gave
    their thread up between passes, the first lane kept it until its backlog was gone."""
    consumer = StickyConsumer(_records(2, 400))
    order: list[int] = []

    def handle(msg: Message) -> None:
        order.append(msg.partition)
        time.sleep(0.0005)

    w, t = _run(consumer, handle, concurrency=1, consume_batch=10)
    try:
        _wait(lambda: len(order) >= 200, "200 records started")
    finally:
        w.stop()
        t.join(30)
    first = Counter(order[:200])
    assert min(first[0], first[1]) >= 50, first


# ---------------------------------------------------------------- the stall decision


def _view(p: int, since: float, busy: bool = False, hold: Hold | None = None, held: int = 0,
          position: int | None = 10) -> PartitionView:
    return PartitionView(("t", p), since, busy, hold, held, position)


def test_only_idle_partitions_nothing_explains_are_candidates() -> None:
    views = [_view(0, 0), _view(1, 0, busy=True), _view(2, 0, hold=Hold.BREAKER),
             _view(3, 0, hold=Hold.NOT_DUE), _view(4, 50), _view(5, 0, hold=Hold.DRAINING)]
    assert [v.tp for v in candidates(views, 60, 60)] == [("t", 0)]
    assert candidates(views, 59.9, 60) == []


def test_a_candidate_is_stalled_with_records_of_its_own_or_a_fresh_positive_lag() -> None:
    cands = [_view(0, 0, held=3), _view(1, 0), _view(2, 0), _view(3, 0)]
    stalls = judge(cands, {("t", 1): 5, ("t", 2): 0, ("t", 3): None})
    assert [(s.tp, s.lag) for s in stalls] == [(("t", 0), 3), (("t", 1), 5)]


def test_the_default_bound_is_a_minute_at_least_and_follows_the_deadline() -> None:
    assert default_bound(None, 1.0) == 60
    assert default_bound(45.0, 1.0) == 90
    assert default_bound(None, 30.0) == 300


class _Lag:
    def __init__(self, hi: int, committed: int | None = None) -> None:
        self.hi = hi
        self.committed_at = committed
        self.broken = False

    def latest(self, tps: list[TP], timeout: float) -> dict[TP, int]:
        return {} if self.broken else dict.fromkeys(tps, self.hi)

    def committed(self, group: str, tps: list[TP], timeout: float) -> dict[TP, int | None]:
        return dict.fromkeys(tps, self.committed_at)


class _Flag:
    def __init__(self) -> None:
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = value


def _watch(views: list[PartitionView], lag: _Lag, clock: FakeClock,
           sup: Supervisor) -> tuple[StallWatch, dict[TP, _Flag]]:
    flags: dict[TP, _Flag] = {}
    w = StallWatch("g", 60, lambda: views, lag, clock, sup,
                   lambda tp: flags.setdefault(tp, _Flag()))
    return w, flags


def test_a_stall_degrades_readiness_then_health_and_clears_when_it_moves() -> None:
    clock, sup = FakeClock(0), Supervisor()
    views = [_view(0, 0, position=None)]
    lag = _Lag(hi=7, committed=2)
    watch, flags = _watch(views, lag, clock, sup)
    clock.set(59)
    assert watch.check() == [] and sup.degraded == {}
    clock.set(61)
    [stall] = watch.check()
    assert stall.lag == 5  # fresh high watermark minus the group's committed offset
    assert flags[("t", 0)].value == 1
    assert "t/0" in sup.degraded["partitions of g"] and sup.healthy
    clock.set(UNHEALTHY_AFTER * 60 + 1)
    watch.check()
    assert sup.fault is not None and "stuck past" in sup.fault.reason
    views[0] = _view(0, UNHEALTHY_AFTER * 60 + 1)  # progress
    assert watch.check() == [] and sup.degraded == {} and flags[("t", 0)].value == 0


def test_an_unreachable_broker_or_no_lag_judges_nothing() -> None:
    clock, sup = FakeClock(100), Supervisor()
    lag = _Lag(hi=10)
    watch, _flags = _watch([_view(0, 0, position=10)], lag, clock, sup)
    assert watch.check() == []  # caught up: no lag, no stall
    lag.broken = True
    watch2, _ = _watch([_view(0, 0, position=3)], lag, clock, sup)
    assert watch2.check() == [] and sup.degraded == {}


@pytest.mark.parametrize("broken", [False, True])
def test_a_share_worker_holding_records_that_none_runs_is_stalled(broken: bool) -> None:
    """Share mode: the held records are the work waiting (no lag query). A runner that never
    starts (the canary: lanes fed, nothing run) turns readiness off; the control, the same
    worker with working runners, stays ready once it is done."""
    from tests.unit.test_share_loop import ModelShare, _stop, _until
    from tests.unit.test_share_loop import _worker as share_worker

    model = ModelShare(40, batch=40)
    started = threading.Event()

    def handle(msg: Message) -> None:
        started.set()

    model.lock_s = 120.0  # the lock must outlast the bound, or _feed releases the records
    waiting, model.available = model.available, []  # nothing to acquire until patched
    w, _s, t = share_worker(model, handle, concurrency=2, stall_timeout=0.5, drain_timeout=1.0)
    _until(lambda: bool(w.loops))
    if broken:
        w.loops[0].runner.start = lambda *_a, **_k: None  # type: ignore[method-assign]
    with model.lock:
        model.available = waiting
    if broken:
        _until(lambda: bool(w.supervisor.degraded))
        assert "stalled" in (w.unready_reason or "")
        assert not started.is_set() and w.fault is None
        w.stop()
        t.join(30)
    else:
        _until(model.settled)
        time.sleep(1.0)  # past the bound, idle with nothing held: not a stall
        assert w.supervisor.degraded == {} and w.ready
        _stop(w, t)


def test_tier_records_waiting_for_their_due_time_are_held_not_stalled() -> None:
    """The retry loop runs the same stall watch: a tier partition whose records wait in the
    timer heap is held on purpose. Without the ``not_due`` hold it would be flagged: it holds
    records, none runs, and nothing completes until they are due."""
    from kworkers import RetryPolicy, TierLadder
    from tests.tier_records import retry_record_headers
    from tests.unit.test_loop_with_fake_consumer import ScriptedConsumer
    from tests.unit.test_supervision import _worker as sup_worker

    tier_topic = "t.retry.1s"
    far = retry_record_headers(tier_topic, "g", time.time() + 3600)
    tier = ScriptedConsumer([Message(tier_topic, p, o, b"k", b"v", far)
                             for o in range(20) for p in range(2)], [], "g.retry")
    w = sup_worker(ScriptedConsumer([], []), tier, stall_timeout=0.3,
                   tiers=TierLadder((1.0,)), retry=RetryPolicy(max_interval=7200))
    w.handler(lambda msg: None)
    t = threading.Thread(target=w.run, args=(False,), daemon=True)
    t.start()
    try:
        _wait(lambda: len(w.loops) == 2 and w.loops[1].gate is not None
              and len(cast(TierGate, w.loops[1].gate)) == 40, "every tier record in the heap")
        time.sleep(1.5)  # five stall bounds with nothing completing
        views = w.loops[1].stall_views
        assert views and all(v.hold is Hold.NOT_DUE and v.held > 0 for v in views), views
        assert w.supervisor.degraded == {} and w.ready
    finally:
        w.stop()
        t.join(30)


def test_records_polled_during_a_drain_are_never_committed_past() -> None:
    """The drain polls (heartbeats, its commit's outcome) and gives what it fetches back: the
    consumer's position then runs ahead of the records that ran, so it may not stand in for
    a transaction marker there (the loss the rolling-SIGTERM test caught: the last records
    committed past, never run). Here the pause at the drain's start lands late, as
    librdkafka's can: records queued before it still come out of the next polls."""

    class LatePause(StickyConsumer):
        def pause(self, tps: list[TP]) -> None:
            pass

    consumer = LatePause(_records(1, 20))
    ran: list[int] = []
    last = threading.Event()

    def handle(msg: Message) -> None:
        ran.append(msg.offset)
        if msg.offset == 19:
            last.set()
            time.sleep(0.5)  # still running when the stop comes; the drain polls meanwhile

    w, t = _run(consumer, handle, consume_batch=50)
    assert last.wait(10)
    tp = ("t", 0)
    consumer.logs[tp] += [Message("t", 0, o, b"k", b"") for o in range(20, 50)]  # arriving
    w.stop()
    t.join(30)
    assert max(ran) == 19
    assert consumer.commits.get(tp) == 20, consumer.commits  # not 50: 20..49 never ran


class _TimedPolls(StickyConsumer):
    """Records each poll's timeout and whether an assigned partition was paused then."""

    def __init__(self, records: dict[TP, list[Message]]) -> None:
        super().__init__(records)
        self.waits: list[tuple[float, bool]] = []

    def poll_batch(self, n: int, timeout: float) -> list[Message]:
        self.waits.append((timeout, bool(self.assigned & self.paused)))
        return super().poll_batch(n, timeout)


def _paused_polls(monkeypatch: pytest.MonkeyPatch, waits_for_completions: bool
                  ) -> list[float]:
    """Partition 0 backlogged behind held handlers (paused at its share), partition 1 done
    and idle (not paused: nothing of it in flight); then let go. The timeouts of the polls
    made while partition 0 was paused."""
    monkeypatch.setattr(processor, "IDLE_WAITS_FOR_COMPLETIONS", waits_for_completions)
    records = _records(2, 60)
    records[("t", 1)] = records[("t", 1)][:3]
    consumer = _TimedPolls(records)
    gate = threading.Event()

    def handle(msg: Message) -> None:
        if msg.partition == 0:
            gate.wait(10)

    w, t = _run(consumer, handle, max_in_flight=20, max_in_flight_per_partition=10,
                consume_batch=10)
    try:
        _wait(lambda: ("t", 0) in consumer.paused and consumer.commits.get(("t", 1)) == 3,
              "partition 0 paused by backpressure, partition 1 done")
        _wait(lambda: sum(p for _, p in consumer.waits) >= 3, "polls made while paused")
        gate.set()
        _wait(lambda: consumer.commits.get(("t", 0)) == 60, "partition 0 reaches its end")
    finally:
        w.stop()
        t.join(30)
    return [timeout for timeout, paused in consumer.waits if paused]


def test_with_a_partition_paused_the_loop_waits_for_completions_not_in_the_poll(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A wait inside the client's poll while the partitions it could fetch from are idle
    outlasts the paused partition's work in flight: its lane ran dry at the resume mark while
    the poll slept on (at the end of a 1M-record benchmark, 75 polls of 0.1 s came back empty
    and took 7.8 of its 11.7 s; in production, a hot partition beside idle ones)."""
    paused = _paused_polls(monkeypatch, waits_for_completions=True)
    assert paused, "no poll was made with a partition paused: the check saw nothing"
    assert all(timeout == 0.0 for timeout in paused), paused


def test_canary_a_loop_that_waits_in_the_poll_while_paused_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    paused = _paused_polls(monkeypatch, waits_for_completions=False)
    assert paused and any(timeout > 0 for timeout in paused)


class _CountedPauses(StickyConsumer):
    def __init__(self, records: dict[TP, list[Message]]) -> None:
        super().__init__(records)
        self.reports_ends = True
        self.pauses: Counter[TP] = Counter()
        self.stops: Counter[str] = Counter()

    def pause(self, tps: list[TP]) -> None:
        self.pauses.update(tps)
        super().pause(tps)


def _hot_beside_idle(monkeypatch: pytest.MonkeyPatch, holds: bool) -> _CountedPauses:
    """Partition 0 holds a backlog far above its share (13 here), partitions 1 and 2 are
    idle at their end; a no-op handler. The hold's time bound is set out of reach, so what
    is counted is the rule, not the machine's speed."""
    monkeypatch.setattr(processor, "HOLDS", holds)
    monkeypatch.setattr(processor, "HOLD_S", 600.0)
    decide = backpressure.decide  # processor.backpressure: the same module
    stops: list[str] = []  # the scenario's precondition: partition 0 did reach its share

    def spy(limits: backpressure.Limits, load: backpressure.Load) -> backpressure.Decision:
        d = decide(limits, load)
        stops.extend(["held"] * (("t", 0) in d.held) + ["paused"] * (("t", 0) in d.pause))
        return d

    monkeypatch.setattr(backpressure, "decide", spy)
    records = _records(3, 600)
    records[("t", 1)] = records[("t", 2)] = []
    consumer = _CountedPauses(records)
    w, t = _run(consumer, lambda msg: None, max_in_flight=40,
                max_in_flight_per_partition=20, consume_batch=10)
    try:
        _wait(lambda: consumer.commits.get(("t", 0)) == 600, "partition 0 reaches its end")
        before_stop = Counter(consumer.pauses)  # the stop's drain pauses everything
    finally:
        w.stop()
        t.join(30)
    consumer.pauses = before_stop
    consumer.stops = Counter(stops)
    return consumer


def test_a_hot_partition_beside_idle_ones_is_held_at_its_share_not_paused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """librdkafka empties a paused partition's read-ahead and brings it back only with the
    next fetch response, which a fetch long-polling the idle partitions holds back up to
    ``fetch.wait.max.ms``: one hot partition then ran a share's worth of records and waited
    half a second, over and over. Nothing else wants records here, so it is held instead."""
    consumer = _hot_beside_idle(monkeypatch, holds=True)
    assert consumer.stops["held"] > 0, consumer.stops  # it did reach its share (13)
    assert consumer.pauses[("t", 0)] == 0, consumer.pauses  # counted by the client


def test_canary_a_loop_that_pauses_a_hot_partition_beside_idle_ones_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = _hot_beside_idle(monkeypatch, holds=False)
    assert consumer.pauses[("t", 0)] > 0


def test_a_hold_is_bounded_then_the_partition_is_paused_and_the_loop_polls_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A hold polls nothing, so the client's callbacks wait while it lasts: a handler stuck
    past ``HOLD_S`` turns it into a pause, and polling (heartbeat callbacks, rebalances,
    commit outcomes) goes on."""
    monkeypatch.setattr(processor, "HOLD_S", 0.05)
    records = _records(2, 100)
    records[("t", 1)] = []
    consumer = _CountedPauses(records)
    gate = threading.Event()

    def handle(msg: Message) -> None:
        gate.wait(30)

    w, t = _run(consumer, handle, max_in_flight=20, max_in_flight_per_partition=10,
                consume_batch=10)
    try:
        _wait(lambda: ("t", 0) in consumer.paused, "the held partition paused at the bound")
        polls = consumer.polls
        _wait(lambda: consumer.polls > polls + 2, "polls go on while it stays paused")
        gate.set()
        _wait(lambda: consumer.commits.get(("t", 0)) == 100, "partition 0 reaches its end")
    finally:
        gate.set()
        w.stop()
        t.join(30)

