"""A hold must be true when it is claimed (issue #43, item 1).

A partition held on purpose is never taken for a stall; but a hold still claimed well past the
time it should have ended (a tier record due and never released, a breaker that never
half-opens, a rate-limited record that stopped asking for a token, a lease that expired) is a
stall like any other: ``/readyz`` 503 naming the partition and why, later ``/healthz`` 503.
The pure rule is ``stall.overdue``; where each hold's end comes from is ``observe.stall_views``.

Canary: a tier gate that never releases a due record (its heap never gives it back). On the
code before this rule the partition counted as ``not_due`` for as long as the record sat in
the heap, and the worker stayed ready.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Mapping
from typing import Any, cast

import pytest

from kworkers import RetryPolicy, TierLadder, Worker
from kworkers.clock import FakeClock
from kworkers.consumer import observe
from kworkers.consumer.breaker import Breaker, BreakerPolicy
from kworkers.consumer.partition import PartitionState
from kworkers.consumer.stall import UNHEALTHY_AFTER, Hold, PartitionView, candidates, judge
from kworkers.consumer.stall_watch import StallWatch
from kworkers.consumer.tier_gate import TierGate
from kworkers.message import Message
from kworkers.pace.bucket import LocalBuckets
from kworkers.pace.limit import RateLimit
from kworkers.pace.pacer import Pacer
from kworkers.retry_tiers.tier_record import TierRules
from kworkers.supervision import Supervisor
from tests.tier_records import retry_record, retry_record_headers
from tests.unit.test_loop_with_fake_consumer import ScriptedConsumer

TP = tuple[str, int]


def _view(hold: Hold | None, ends: float | None, since: float = 0.0, busy: bool = False,
          held: int = 1) -> PartitionView:
    return PartitionView(("t", 0), since, busy, hold, held, 10, ends)


# ---------------------------------------------------------------- the rule


@pytest.mark.parametrize("hold", [Hold.NOT_DUE, Hold.BREAKER, Hold.RATE_LIMIT, Hold.LEASE,
                                  Hold.REGISTRY])
def test_a_hold_past_its_end_by_the_bound_is_a_stall_and_says_which_hold(hold: Hold) -> None:
    # ends at 100, bound 60: a hold until 160, a stall from then on, whatever runs beside it
    assert candidates([_view(hold, 100.0, busy=True)], 159.9, 60) == []
    [cand] = candidates([_view(hold, 100.0, busy=True)], 160.0, 60)
    [stall] = judge([cand], {})
    assert stall.since == 100.0 and stall.overdue is hold and stall.lag == 1
    text = stall.describe(175.0)
    assert text.startswith("t/0: lag 1, held as ") and hold.value in text and "75s ago" in text


@pytest.mark.parametrize("hold", [Hold.DRAINING, Hold.FENCED, Hold.NOT_DUE])
def test_a_hold_with_no_known_end_is_true_while_claimed(hold: Hold) -> None:
    assert candidates([_view(hold, None)], 10_000.0, 60) == []


def test_an_overdue_hold_with_nothing_held_and_no_lag_is_no_stall() -> None:
    cands = candidates([_view(Hold.BREAKER, 0.0, held=0)], 100.0, 60)
    assert judge(cands, {("t", 0): 0}) == [] and judge(cands, {("t", 0): None}) == []


def test_an_overdue_hold_degrades_readiness_then_health() -> None:
    clock, sup = FakeClock(0.0), Supervisor()
    views = [_view(Hold.NOT_DUE, 5.0)]
    w = StallWatch("g.retry", 60, lambda: views, None, clock, sup, lambda tp: _Flag())
    clock.set(64)
    assert w.check() == [] and sup.degraded == {}
    clock.set(65)
    assert len(w.check()) == 1
    why = sup.degraded["partitions of g.retry"]
    assert "t/0" in why and "held as not_due" in why and sup.healthy
    clock.set(5 + UNHEALTHY_AFTER * 60)
    w.check()
    assert sup.fault is not None and "t/0" in sup.fault.reason


class _Flag:
    def set(self, value: float) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass


# ---------------------------------------------------------------- where each end comes from


def _state(clock: FakeClock) -> PartitionState:
    return PartitionState("t.retry.1s", 0, clock)


def _gate(clock: FakeClock) -> TierGate:
    rules = TierRules.of(RetryPolicy(max_interval=60), TierLadder((1.0,)), "g")
    return TierGate(100, rules, _Flag(), clock)


def test_the_gate_says_when_its_earliest_record_is_due_from_what_it_admitted() -> None:
    clock = FakeClock(1_000.0)
    gate, ps = _gate(clock), _state(clock)
    for o, due in enumerate((1_030.0, 1_010.0, 1_020.0)):
        ps.tracker.track(o)
        assert gate.admit(ps, retry_record("t.retry.1s", 0, o, "g", due, now=1_000.0),
                          1_000.0) is None
    assert gate.held(ps) == 3 and gate.earliest_due(ps) == 1_010.0
    [view] = observe.stall_views([ps], set(), gate, False, False, clock=clock)
    assert view.hold is Hold.NOT_DUE and view.hold_ends == 1_010.0
    clock.set(1_015.0)
    assert [m.offset for _ps, m in gate.release_due({ps.tp: ps})] == [1]
    assert gate.earliest_due(ps) == 1_020.0 and gate.held(ps) == 2
    gate.forget([ps])
    assert gate.earliest_due(ps) is None and gate.held(ps) == 0


def test_an_open_breaker_holds_until_its_cool_down_ends() -> None:
    clock = FakeClock(0.0)
    b = Breaker(BreakerPolicy(min_attempts=1, cooldown_s=5.0, max_cooldown_s=5.0), clock)
    assert b.cooldown_ends() is None
    b.record(False)  # one failure of one attempt: open
    ends = b.cooldown_ends()
    assert ends is not None and 5.0 <= ends <= 6.0
    ps = _state(clock)
    ps.tracker.track(0)
    [view] = observe.stall_views([ps], set(), None, False, True, clock=clock, breaker_ends=ends)
    assert view.hold is Hold.BREAKER and view.hold_ends == ends
    assert candidates([view], ends + 59, 60) == []
    assert [s.overdue for s in judge(candidates([view], ends + 61, 60), {})] == [Hold.BREAKER]
    clock.set(ends)
    assert b.admit()  # the probe: half-open, no longer an end to overrun
    assert b.cooldown_ends() is None


def test_a_rate_limited_record_asks_again_and_again_and_its_wait_ends_with_the_hold() -> None:
    clock = FakeClock(0.0)
    seen: list[Mapping[TP, float]] = []

    def sleep(s: float) -> None:
        clock.advance(s)
        seen.append(p.asked())

    p = Pacer(RateLimit(per_second=1, burst=2), LocalBuckets(clock), "g", clock, sleep=sleep)
    assert p.acquire(("t", 0), "g", 1, lambda: False) is not None  # the one token
    assert p.acquire(("t", 0), "g", 1, lambda: False) is not None  # waits for the next
    asks = [a[("t", 0)] for a in seen]
    assert len(asks) >= 4 and asks == sorted(asks)
    assert all(later - earlier <= 0.06 for earlier, later in itertools.pairwise(asks))
    assert p.asked() == {} and p.waiting() == set()


def test_a_record_waiting_for_the_registry_asks_again_and_again() -> None:
    """Between tries after a transient failure the record asks again at least every
    ``backoff.max`` and each try is answered within ``backoff.timeout``: the hold's end moves
    with each ask, and goes when the record decodes."""
    from kworkers.kafka.serialization import context
    from kworkers.payloads.decode import DecodeBackoff, RecordDecoder

    clock = FakeClock(0.0)
    dues: list[Mapping[TP, float]] = []
    tries = {"n": 0}

    def registry(data: bytes | None, ctx: Any) -> Any:
        tries["n"] += 1
        if tries["n"] < 4:
            raise TimeoutError("read timed out")
        return data

    def sleep(s: float) -> None:
        clock.advance(s)
        dues.append(d.asks_due())

    d = RecordDecoder(registry, context=context, backoff=DecodeBackoff(0.5, 1.0, timeout=2.0),
                      sleep=sleep, clock=clock.monotonic)
    got = d.decode(Message("t", 0, 0, None, b"x"), lambda: False)
    assert isinstance(got, Message) and tries["n"] == 4
    ends = sorted({due[("t", 0)] for due in dues if ("t", 0) in due})
    assert len(ends) == 3 and all(e - 3.0 <= clock.monotonic() for e in ends)  # max + timeout
    assert d.asks_due() == {}
    ps = _state(clock)
    ps.tracker.track(0)
    [view] = observe.stall_views([ps], set(), None, False, False, {ps.tp}, clock=clock,
                                 registry_due={ps.tp: 10.0})
    assert view.hold is Hold.REGISTRY and view.hold_ends == 10.0


# ---------------------------------------------------------------- the canary, on a worker


def _tier_worker(due_in: float, broken: bool) -> tuple[Worker, threading.Thread, list[int]]:
    from tests.unit.test_supervision import _worker as sup_worker

    tier_topic = "t.retry.1s"
    due = retry_record_headers(tier_topic, "g", time.time() + due_in)
    tier = ScriptedConsumer([Message(tier_topic, 0, o, b"k", b"v", due) for o in range(3)],
                            [], "g.retry")
    w = sup_worker(ScriptedConsumer([], []), tier, stall_timeout=0.3, tiers=TierLadder((1.0,)),
                   drain_timeout=1.0)
    ran: list[int] = []
    w.handler(lambda msg: ran.append(msg.offset))
    t = threading.Thread(target=w.run, args=(False,), daemon=True)
    t.start()
    _until(lambda: len(w.loops) == 2 and w.loops[1].gate is not None)
    if broken:  # the canary: the heap never gives a due record back
        gate = cast(TierGate, w.loops[1].gate)
        gate.release_due = lambda parts: []  # type: ignore[method-assign]
    return w, t, ran


def _until(cond: Any, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_canary_a_gate_that_never_releases_a_due_record_turns_readiness_off() -> None:
    w, t, ran = _tier_worker(0.5, broken=True)
    try:
        _until(lambda: w.unready_reason not in (None, "not consuming yet"))
        why = w.unready_reason or ""
        assert "t.retry.1s/0" in why and "held as not_due" in why, why
        assert ran == [] and w.fault is None
    finally:
        w.stop()
        t.join(30)


def test_control_the_same_records_with_a_working_gate_run_and_the_worker_stays_ready() -> None:
    w, t, ran = _tier_worker(0.5, broken=False)
    try:
        _until(lambda: sorted(ran) == [0, 1, 2])
        time.sleep(1.0)  # three stall bounds past the due time
        assert w.ready and w.supervisor.degraded == {}
    finally:
        w.stop()
        t.join(30)
