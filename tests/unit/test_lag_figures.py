"""The figures built on the lag (issue #47 items 1 and 2), as the worker's gauges show them:
time lag and drainable lag per partition, from the view the poll loop reports
(``kworkers.consumer.lag_view``), series gone on revoke, and no double counting under
``--processes``.

Every check reads the registry's samples (what a scrape would show), never a count kept by the
code under test. The multiprocess check runs two real processes writing prometheus-client's
files, as ``kworkers run --processes`` does, and reads them back through the collector the
pool's parent serves; its canary is the old way (remove the series), caught leaving the
moved partition's old value behind.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import cast

import pytest
from prometheus_client import CollectorRegistry, Gauge

from kworkers import TierLadder
from kworkers.clock import Clock
from kworkers.consumer.drainable import drainable
from kworkers.consumer.lag_view import Facts, Figures, LagView
from kworkers.consumer.partition import PartitionState
from kworkers.consumer.ports import TP, ConsumerPort
from kworkers.consumer.stall import Hold, PartitionView
from kworkers.consumer.tier_gate import TierGate
from kworkers.message import Message

NAMES = ("kworkers_consumer_lag", "kworkers_consumer_time_lag_seconds",
         "kworkers_drainable_lag", "kworkers_drainable_time_lag_seconds")


class FixedClock:
    def __init__(self, now: float) -> None:
        self.t = now

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


class Ends:
    def __init__(self, ends: dict[TP, int]) -> None:
        self.ends = ends

    def watermarks(self, tp: TP, timeout: float) -> tuple[int, int]:
        return 0, self.ends[tp]  # KeyError: nothing cached, as the client says it


def _view(clock: FixedClock) -> tuple[LagView, CollectorRegistry]:
    r = CollectorRegistry()
    g = [Gauge(n, n, ["group", "topic", "partition"], registry=r) for n in NAMES]
    return LagView("g", None, g[0], Figures(g[1], g[2], g[3]), cast(Clock, clock)), r


def _shown(r: CollectorRegistry) -> dict[str, dict[TP, float]]:
    out: dict[str, dict[TP, float]] = {n: {} for n in NAMES}
    for m in r.collect():
        for s in m.samples:
            if s.name in out:
                out[s.name][(s.labels["topic"], int(s.labels["partition"]))] = s.value
    return out


def _fetched(ps: PartitionState, first: int, n: int, t0: float, dt: float) -> None:
    """``n`` records fetched from ``first`` on, produced ``dt`` seconds apart from ``t0``."""
    msgs = [Message(ps.topic, ps.partition, first + i, None, b"", (),
                    int((t0 + i * dt) * 1000)) for i in range(n)]
    ps.tracker.track_many([m.offset for m in msgs])
    ps.tracker.mark_committed(first)  # where the group stood when they were fetched
    ps.stamps.add(msgs[0].offset, t0, msgs[-1].offset, t0 + (n - 1) * dt)


def _hold(tp: TP, hold: Hold | None) -> PartitionView:
    return PartitionView(tp, 0.0, False, hold, 0, None)


def test_time_lag_counts_from_the_oldest_record_not_completed() -> None:
    clock = FixedClock(10_000.0)
    view, r = _view(clock)
    a, b = PartitionState("t", 0), PartitionState("t", 1)
    _fetched(a, 0, 100, 9_000.0, 1.0)          # produced from 9,000 s on, one a second
    a.tracker.complete_many(list(range(40)))   # 0..39 done: the oldest outstanding is 40
    a.tracker.mark_committed(30)               # the commit lags behind: lag counts from 30
    _fetched(b, 0, 10, 9_990.0, 0.1)
    b.tracker.complete_many(list(range(10)))   # all done: caught up
    view.report([a, b], cast(ConsumerPort, Ends({a.tp: 150, b.tp: 10})))
    shown = _shown(r)
    assert shown["kworkers_consumer_lag"] == {a.tp: 120.0, b.tp: 10.0}  # b: commit pending
    assert shown["kworkers_consumer_time_lag_seconds"] == {a.tp: 10_000.0 - 9_040.0, b.tp: 0.0}
    # nothing held: every outstanding record drains (completed ones are nobody's work)
    assert shown["kworkers_drainable_lag"] == {a.tp: 110.0, b.tp: 0.0}
    assert shown["kworkers_drainable_time_lag_seconds"] == {a.tp: 960.0, b.tp: 0.0}


def test_a_held_partition_shows_its_lag_and_drains_nothing_and_revoke_removes_it() -> None:
    clock = FixedClock(10_000.0)
    view, r = _view(clock)
    a, b = PartitionState("t", 0), PartitionState("t", 1)
    _fetched(a, 0, 50, 9_900.0, 0.0)
    _fetched(b, 0, 50, 9_900.0, 0.0)
    facts = Facts({a.tp: _hold(a.tp, Hold.BREAKER), b.tp: _hold(b.tp, Hold.RATE_LIMIT)},
                  pool_rate_limit=True)
    view.report([a, b], cast(ConsumerPort, Ends({a.tp: 50, b.tp: 50})), facts)
    shown = _shown(r)
    assert shown["kworkers_consumer_lag"] == {a.tp: 50.0, b.tp: 50.0}
    assert shown["kworkers_consumer_time_lag_seconds"] == {a.tp: 100.0, b.tp: 100.0}
    assert shown["kworkers_drainable_lag"] == {a.tp: 0.0, b.tp: 0.0}
    assert shown["kworkers_drainable_time_lag_seconds"] == {a.tp: 0.0, b.tp: 0.0}
    view.forget([a.tp, b.tp])
    assert all(not v for v in _shown(r).values()), _shown(r)


def test_a_tier_partition_drains_only_its_due_records() -> None:
    clock = FixedClock(10_000.0)
    view, r = _view(clock)
    a = PartitionState("t.retry.1m", 0)
    _fetched(a, 0, 30, 10_030.0, 0.0)  # kw-due-at 30 s ahead: waiting in the heap
    facts = Facts({a.tp: _hold(a.tp, Hold.NOT_DUE)}, waiting=lambda ps: 30)
    view.report([a], cast(ConsumerPort, Ends({a.tp: 1000})), facts)
    shown = _shown(r)
    assert shown["kworkers_consumer_lag"] == {a.tp: 1000.0}
    assert shown["kworkers_consumer_time_lag_seconds"] == {a.tp: 0.0}
    assert shown["kworkers_drainable_lag"] == {a.tp: 0.0}


def _unseen_report(monkeypatch: pytest.MonkeyPatch, canary: bool) -> dict[str, dict[TP, float]]:
    """A tier partition just assigned (50 records behind, none fetched yet: the lag read at
    the assignment answers before the first fetch) beside a source partition in the same
    state."""
    import kworkers.consumer.lag_view as lag_view_module

    class AtAssignment:  # the broker's answer to the read made at the assignment
        def latest(self, tps: list[TP], timeout: float) -> dict[TP, int]:
            return dict.fromkeys(tps, 50)

        def committed(self, group: str, tps: list[TP], timeout: float) -> dict[TP, int | None]:
            return dict.fromkeys(tps, 0)

    clock = FixedClock(10_000.0)
    view, r = _view(clock)
    view.source = AtAssignment()
    tier, source = PartitionState("t.retry.1m", 0), PartitionState("t", 0)
    view.assigned([tier, source])
    for _ in range(500):
        if view.fresh:
            break
        time.sleep(0.01)
    assert view.fresh
    ends = cast(ConsumerPort, Ends({}))  # nothing fetched: the client caches no log end
    if canary:  # the rule before: an unseen partition judged by its hold alone
        monkeypatch.setattr(lag_view_module, "drainable",
                            lambda *a, unseen=False, **k: drainable(*a, **k))
    view.report([tier], ends, Facts({tier.tp: _hold(tier.tp, None)}, waiting=lambda ps: 0))
    view.report([source], ends, Facts({source.tp: _hold(source.tp, None)}))
    return _shown(r)


def test_an_unseen_tier_partition_drains_nothing_until_its_records_are_fetched(
        monkeypatch: pytest.MonkeyPatch) -> None:
    shown = _unseen_report(monkeypatch, canary=False)
    tier, source = ("t.retry.1m", 0), ("t", 0)
    assert shown["kworkers_consumer_lag"] == {tier: 50.0, source: 50.0}
    # the tier's records may all wait for due times nobody has read: nothing to drain yet;
    # a source partition's records are due when they arrive: all of them
    assert shown["kworkers_drainable_lag"] == {tier: 0.0, source: 50.0}


def test_canary_an_unseen_tier_partition_judged_by_its_hold_alone_counts_every_record(
        monkeypatch: pytest.MonkeyPatch) -> None:
    shown = _unseen_report(monkeypatch, canary=True)
    assert shown["kworkers_drainable_lag"][("t.retry.1m", 0)] == 50.0


def test_once_fetched_the_tier_partition_drains_its_due_records() -> None:
    clock = FixedClock(10_000.0)
    view, r = _view(clock)
    a = PartitionState("t.retry.1m", 0)
    _fetched(a, 0, 30, 9_000.0, 0.0)  # fetched and due (none waits in the heap): no hold
    view.report([a], cast(ConsumerPort, Ends({a.tp: 50})),
                Facts({a.tp: _hold(a.tp, None)}, waiting=lambda ps: 0))
    assert _shown(r)["kworkers_drainable_lag"] == {a.tp: 50.0}


_CHILD = textwrap.dedent('''
    import sys
    from prometheus_client import Gauge
    from kworkers.consumer.lag_view import Figures, LagView
    from kworkers.consumer.partition import PartitionState

    class Ends:
        def watermarks(self, tp, timeout):
            return 0, int(sys.argv[2])

    names = %r
    g = [Gauge(n, n, ["group", "topic", "partition"], multiprocess_mode="livemax")
         for n in names]
    view = LagView("g", None, g[0], Figures(g[1], g[2], g[3]))
    if sys.argv[3] == "canary":  # the old way: remove the series, as one process would
        def forget(tps):
            for tp in tps:
                for x in g:
                    x.remove("g", tp[0], str(tp[1]))
        view.forget = forget
    ps = PartitionState("t", 0)
    view.report([ps], Ends())  # never fetched, no commit: the gauge needs a read...
    ps.tracker.track(0)
    ps.tracker.complete(0)
    view.report([ps], Ends())
    if sys.argv[1] == "gives-up":
        view.forget([ps.tp])
''') % (NAMES,)


def _two_processes(tmp: Path, canary: bool) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The partition's first owner reports lag 500 and loses it; the next reports 20."""
    from prometheus_client import multiprocess

    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp), "PYTHONWARNINGS": "ignore"}
    how = "canary" if canary else "fixed"
    tmp.mkdir()
    for role, end in (("gives-up", "501"), ("takes-over", "21")):
        subprocess.run([sys.executable, "-c", _CHILD, role, end, how], check=True,
                       env={**env, "PATH": "/usr/bin:/bin"})
    r = CollectorRegistry()
    multiprocess.MultiProcessCollector(r, path=str(tmp))  # type: ignore[no-untyped-call]
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for m in r.collect():
        for s in m.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def test_under_processes_a_moved_partition_is_counted_once(tmp_path: Path) -> None:
    shown = _two_processes(tmp_path / "fixed", False)
    for name in ("kworkers_consumer_lag", "kworkers_drainable_lag"):
        series = shown[name]
        assert all("pid" not in labels for labels, _v in series), series  # livemax: no pid
        assert [v for _l, v in series] == [20.0], (name, series)


def test_under_processes_canary_the_removed_series_stays_behind(tmp_path: Path) -> None:
    shown = _two_processes(tmp_path / "canary", True)
    assert [v for _l, v in shown["kworkers_drainable_lag"]] == [500.0]


def test_a_tier_partition_shows_its_waiting_and_due_records() -> None:
    """``kworkers_tier_waiting_records`` and ``kworkers_tier_due_records``: the gate's heap
    against what is fetched and not completed; gone on revoke like the lag."""
    r = CollectorRegistry()
    names = (*NAMES, "kworkers_tier_waiting_records", "kworkers_tier_due_records")
    g = [Gauge(n, n, ["group", "topic", "partition"], registry=r) for n in names]
    view = LagView("g.retry", None, g[0], Figures(g[1], g[2], g[3], g[4], g[5]),
                   cast(Clock, FixedClock(10_000.0)))
    a = PartitionState("t.retry.1m", 0)
    _fetched(a, 0, 30, 9_990.0, 0.0)
    a.tracker.complete_many([0, 1, 2])        # 27 outstanding: 20 wait in the heap, 7 due
    facts = Facts({a.tp: _hold(a.tp, Hold.NOT_DUE)}, waiting=lambda ps: 20)
    view.report([a], cast(ConsumerPort, Ends({a.tp: 30})), facts)

    def shown(name: str) -> dict[str, float]:
        return {s.labels["partition"]: s.value for m in r.collect() for s in m.samples
                if s.name == name}

    assert shown("kworkers_tier_waiting_records") == {"0": 20.0}
    assert shown("kworkers_tier_due_records") == {"0": 7.0}
    view.forget([a.tp])
    assert shown("kworkers_tier_waiting_records") == {} == shown("kworkers_tier_due_records")


# ------------------------------------------------- on a worker: the hold judged at the report


def _tier_reading(monkeypatch: pytest.MonkeyPatch, views_judged: bool) -> list[float]:
    """A tier loop whose 3 records wait in the heap (due in 30 s), the lag reported at every
    tick and the stall views left to their own interval (pushed out of reach here, as a slow
    tick under load stretches the 0.5 s): every drainable reading of the tier partition."""
    from kworkers.consumer import observe, processor
    from tests.tier_records import retry_record_headers
    from tests.unit.test_loop_with_fake_consumer import ScriptedConsumer
    from tests.unit.test_supervision import _worker

    class Cached(ScriptedConsumer):
        def watermarks(self, tp: TP, timeout: float) -> tuple[int, int]:
            return 0, 3

    monkeypatch.setattr(processor, "VIEWS_INTERVAL_S", 1e9)
    monkeypatch.setattr(processor, "LAG_INTERVAL_S", 0.0)
    if not views_judged:  # the canary: the report reads views made before any record came
        monkeypatch.setattr(observe, "stall_views", lambda *a, **k: ())
    topic = "t.retry.1m"
    due = retry_record_headers(topic, "g", time.time() + 30)
    tier = Cached([Message(topic, 0, o, b"k", b"v", due) for o in range(3)], [], "g.retry")
    w = _worker(ScriptedConsumer([], []), tier, tiers=TierLadder((60.0,)), drain_timeout=1.0)
    w.handler(lambda msg: None)
    t = threading.Thread(target=w.run, args=(False,), daemon=True)
    t.start()
    readings: list[float] = []
    try:
        end = time.monotonic() + 20
        while len(readings) < 20:
            assert time.monotonic() < end, "timed out"
            loops = w.loops
            gate = cast(TierGate, loops[1].gate) if len(loops) == 2 else None
            ps = None if gate is None else loops[1].parts.get((topic, 0))
            if gate is not None and ps is not None and gate.held(cast(PartitionState, ps)) == 3:
                got = [s.value for m in w.metrics.registry.collect() for s in m.samples
                       if s.name == "kworkers_drainable_lag" and s.labels["topic"] == topic]
                readings += got
            time.sleep(0.01)
    finally:
        w.stop()
        t.join(30)
    return readings


def test_a_tier_partition_judged_at_the_report_drains_none_of_its_waiting_records(
        monkeypatch: pytest.MonkeyPatch) -> None:
    readings = _tier_reading(monkeypatch, views_judged=True)
    assert len(readings) >= 20 and set(readings) == {0.0}, readings


def test_canary_views_older_than_the_report_count_the_waiting_records(
        monkeypatch: pytest.MonkeyPatch) -> None:
    readings = _tier_reading(monkeypatch, views_judged=False)
    assert 3.0 in readings, readings
