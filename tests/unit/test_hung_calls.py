"""A handler call that never returns, at the defaults (issue #43, item 1).

Before: with no ``message_timeout`` there was no bound at all; a handler blocked for good held
its partition while ``/readyz`` and ``/healthz`` answered 200 and nothing was logged. Now a
bound applies with or without a deadline, from the call's start or its last heartbeat:
readiness names the record past ``slow_call_bound`` (the stall bound: 60 s at the defaults),
health fails past ``hung_call_bound`` (three stall bounds: 180 s) and the worker stops,
committing what finished. The broker-level proof (``kworkers run``, ``/readyz`` over HTTP,
the exit status and the commits read back) is ``tests/faults/test_hung_handler.py``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from queue import SimpleQueue
from typing import Any, cast

import pytest

from kworkers import Worker, activity
from kworkers.clock import FakeClock
from kworkers.consumer import settings as loop_settings
from kworkers.consumer.calls import COMPONENT, CallWatch
from kworkers.consumer.partition import Item, PartitionState
from kworkers.consumer.runner import Runner
from kworkers.consumer.runtime import ThreadRuntime
from kworkers.consumer.settings import LoopSettings
from kworkers.consumer.steps import HandOffs
from kworkers.errors import WorkerFailed
from kworkers.message import Message
from kworkers.supervision import Supervisor
from tests.integration.conftest import start
from tests.unit.test_loop_with_fake_consumer import ScriptedConsumer
from tests.unit.test_supervision import _NoHandOffs


def test_the_bounds_apply_with_or_without_a_deadline() -> None:
    plain = LoopSettings()
    assert (plain.slow_call_bound(), plain.hung_call_bound()) == (60.0, 180.0)
    assert (LoopSettings(stall_timeout=2.0).slow_call_bound(),
            LoopSettings(stall_timeout=2.0).hung_call_bound()) == (2.0, 6.0)
    timed = LoopSettings(message_timeout=30.0)
    assert (timed.slow_call_bound(), timed.hung_call_bound()) == (60.0, 90.0)
    assert LoopSettings(message_timeout=5.0).hung_call_bound() == 60.0


def test_the_canarys_rule_is_the_old_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop_settings, "BOUND_WITHOUT_DEADLINE", False)
    assert LoopSettings().hung_call_bound() is None and LoopSettings().slow_call_bound() is None
    assert LoopSettings(message_timeout=30.0).hung_call_bound() == 90.0


class _Calls:
    def __init__(self) -> None:
        self.running: float | None = None

    def stalled(self, bound: float) -> str | None:
        ran = self.running
        return None if ran is None or ran <= bound else f"t/0@5 for {ran:.0f}s"


class _ReadTogether(Supervisor):
    """Both poll loops read ``degraded`` before either writes it: the interleaving that logged
    a slow call twice in a CI run (2026-12-05), forced by a barrier."""

    def __init__(self) -> None:
        super().__init__()
        self.barrier = threading.Barrier(2, timeout=5)

    @property
    def degraded(self) -> dict[str, str]:
        seen = super().degraded
        self.barrier.wait()
        return seen


def _two_loops_judge_one_slow_call(sup: Supervisor, old_rule: bool,
                                   caplog: pytest.LogCaptureFixture) -> int:
    calls = _Calls()
    calls.running = 61.0
    watches = [CallWatch(calls, sup, 60.0, 180.0, FakeClock(0.0), every=0.0) for _ in range(2)]

    def old_check(watch: CallWatch) -> None:  # the rule before: test, then set, apart
        why = calls.stalled(60.0)
        assert why is not None
        if COMPONENT not in sup.degraded:
            logging.getLogger("kworkers.consumer").error("a handler call runs on: %s", why)
        sup.degrade(COMPONENT, why)

    def judge(watch: CallWatch) -> None:
        if old_rule:
            old_check(watch)
        else:
            try:
                watch.check()
            finally:
                if isinstance(sup, _ReadTogether):
                    sup.barrier.abort()  # the fixed rule never reads ``degraded`` to log

    with caplog.at_level(logging.ERROR, logger="kworkers.consumer"):
        threads = [threading.Thread(target=judge, args=(w,)) for w in watches]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    return sum("a handler call runs on" in r.getMessage() for r in caplog.records)


def test_two_loops_seeing_one_slow_call_log_it_once(caplog: pytest.LogCaptureFixture) -> None:
    assert _two_loops_judge_one_slow_call(_ReadTogether(), False, caplog) == 1


def test_canary_testing_and_setting_apart_logs_it_twice(
        caplog: pytest.LogCaptureFixture) -> None:
    assert _two_loops_judge_one_slow_call(_ReadTogether(), True, caplog) == 2


def test_a_call_past_the_slow_bound_degrades_readiness_past_the_hung_bound_health() -> None:
    clock, sup, calls = FakeClock(0.0), Supervisor(), _Calls()
    watch = CallWatch(calls, sup, 60.0, 180.0, clock, every=0.0)
    calls.running = 59.0
    watch.check()
    assert sup.degraded == {} and sup.healthy
    calls.running = 61.0
    watch.check()
    why = sup.degraded[COMPONENT]
    assert "t/0@5 for 61s" in why and "stops past 180s" in why and sup.healthy
    calls.running = None  # it returned after all
    watch.check()
    assert sup.degraded == {}
    calls.running = 181.0
    watch.check()
    assert sup.fault is not None and sup.fault.component == "handler"
    assert "t/0@5" in sup.fault.reason and "bound 180s" in sup.fault.reason


def test_a_heartbeat_keeps_a_long_call_from_counting_as_hung() -> None:
    """The runtime measures from the call's start or its last heartbeat (``lane.touch``)."""
    clock, sup = FakeClock(0.0), Supervisor()
    rt = ThreadRuntime(1, sup, clock)
    beat, release, entered = threading.Event(), threading.Event(), threading.Event()

    def handle(msg: Message) -> None:
        entered.set()
        while not release.wait(0.01):
            if beat.is_set():
                beat.clear()
                activity.record_heartbeat(b"ckpt")

    from kworkers.activity import ActivityInvoker

    inv = ActivityInvoker()
    runner = Runner(handle, lambda h, m: inv.call_with(None, h, m),
                    cast(HandOffs, _NoHandOffs()), rt, clock, None, SimpleQueue())
    ps = PartitionState("t", 0, clock)
    items: list[Item] = [Message("t", 0, 5, b"k", b"v")]
    got = ps.lane.offer(items)
    assert got is not None
    runner.start(ps.lane, *got)
    try:
        assert entered.wait(10)
        clock.set(70.0)
        found = rt.stalled(60.0)
        assert found is not None and "t/0@5 for 70s (no heartbeat)" in found
        beat.set()
        _until(lambda: not beat.is_set())
        assert rt.stalled(60.0) is None  # alive: it checkpointed just now
        clock.set(150.0)
        found = rt.stalled(60.0)
        assert found is not None and "for 150s (its last heartbeat 80s ago)" in found
    finally:
        release.set()
        rt.shutdown()


def _until(cond: Any, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_handler_that_never_returns_at_the_defaults_is_named_then_stops_the_worker(
        kind: str) -> None:
    """No ``message_timeout``: readiness names the record, then the worker stops unhealthy,
    having committed the records that finished (partition 1's, and partition 0's before the
    hung one)."""
    records = [Message("t", p, o, b"k", b"v") for o in range(4) for p in range(2)]
    main = ScriptedConsumer(records, [])
    tier = ScriptedConsumer([], [], "g.retry")
    for c in (main, tier):
        c.go.set()
    w = Worker(topics=["t"], group_id="g", concurrency=2, stall_timeout=0.5,
               drain_timeout=0.5, consumer=lambda g: main if g == "g" else tier,
               sender=cast(Any, _NoSender()))
    gone = threading.Event()  # released at the end of the test (a daemon thread regardless)
    if kind == "sync":
        @w.handler
        def handle(msg: Message) -> None:
            if (msg.partition, msg.offset) == (0, 2):
                gone.wait(60)
    else:
        @w.handler
        async def handle_async(msg: Message) -> None:
            if (msg.partition, msg.offset) == (0, 2):
                while not gone.is_set():
                    await asyncio.sleep(0.01)
    t, errors = start(w)
    reasons: list[str] = []
    try:
        _until(lambda: w.fault is not None or _seen(w, reasons))
        _until(lambda: not t.is_alive())
    finally:
        gone.set()
    assert any("t/0@2" in r and "(no heartbeat)" in r for r in reasons), reasons
    assert isinstance(errors[0], WorkerFailed) and "t/0@2" in str(errors[0])
    committed: dict[tuple[str, int], int] = {}
    for positions, _outcome in main.commits:
        committed.update(positions)
    assert committed == {("t", 0): 2, ("t", 1): 4}, main.commits


def _seen(w: Worker, reasons: list[str]) -> bool:
    why = w.unready_reason
    if why is not None and COMPONENT in why:
        reasons.append(why)
    return False


class _NoSender:
    def send(self, *a: Any, **k: Any) -> None:
        raise AssertionError("nothing fails here")
