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
from pathlib import Path
from typing import cast

from prometheus_client import CollectorRegistry, Gauge

from kworkers.clock import Clock
from kworkers.consumer.lag_view import Facts, Figures, LagView
from kworkers.consumer.partition import PartitionState
from kworkers.consumer.ports import TP, ConsumerPort
from kworkers.consumer.stall import Hold, PartitionView
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
        return 0, self.ends[tp]


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
