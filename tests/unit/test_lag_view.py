"""The lag gauge's figure (issue #46, bug 3): right from the first report after a restart on a
caught-up group, the worker's own position once it has one, series gone on revoke.

The restart check reads every value the gauge showed (the registry's samples), never a count
kept by the code under test. Its canary is the rule before the fix (the log end when the
worker has no position of its own), kept beside it and caught showing the whole log as lag.
The broker's part is tests/integration/test_lag_gauge.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import cast

import pytest
from prometheus_client import CollectorRegistry, Gauge

from kworkers.consumer.lag_view import LagView, Read, owned_lag
from kworkers.consumer.partition import PartitionState
from kworkers.consumer.ports import TP, ConsumerPort

Views = Callable[..., LagView]


class Source:
    """A ``LagSource`` double: what the broker says, answered once ``go`` is set."""

    def __init__(self, committed: dict[TP, int | None], latest: dict[TP, int]) -> None:
        self._committed, self._latest = committed, latest
        self.go = threading.Event()
        self.go.set()
        self.asked: list[list[TP]] = []

    def committed(self, group: str, tps: list[TP], timeout: float) -> dict[TP, int | None]:
        self.go.wait(10)
        self.asked.append(list(tps))
        return {tp: self._committed.get(tp) for tp in tps}

    def latest(self, tps: list[TP], timeout: float) -> dict[TP, int]:
        return {tp: self._latest[tp] for tp in tps if tp in self._latest}


class Consumer:
    """The part of ``ConsumerPort`` the view reads: cached log ends (none at first)."""

    def __init__(self) -> None:
        self.ends: dict[TP, int] = {}

    def watermarks(self, tp: TP, timeout: float) -> tuple[int, int]:
        if tp not in self.ends:
            raise LookupError("nothing cached")
        return 0, self.ends[tp]


def _port(consumer: Consumer) -> ConsumerPort:
    return cast(ConsumerPort, consumer)


def _gauge() -> tuple[Gauge, CollectorRegistry]:
    r = CollectorRegistry()
    return Gauge("kworkers_consumer_lag", "lag", ["group", "topic", "partition"], registry=r), r


def _shown(r: CollectorRegistry) -> dict[TP, float]:
    return {(s.labels["topic"], int(s.labels["partition"])): s.value
            for m in r.collect() for s in m.samples if s.name == "kworkers_consumer_lag"}


def _settle(view: LagView) -> None:
    for _ in range(1000):
        if view.fresh:
            return
        threading.Event().wait(0.005)
    raise AssertionError("the read at assignment never arrived")


class OldRule(LagView):
    """The canary: the figure before the fix (no read at assignment: the log end minus 0)."""

    def figure(self, ps: PartitionState, consumer: ConsumerPort) -> int | None:
        try:
            _lo, hi = consumer.watermarks(ps.tp, 0.0)
        except Exception:
            return None
        if hi < 0:
            return None
        base = ps.tracker.committed if ps.tracker.committed is not None else ps.tracker.position
        return max(0, hi - (base or 0))


def _restart_on_a_caught_up_group(make: Views) -> list[dict[TP, float]]:
    """A restarted worker's view of partitions whose committed offsets equal their log ends;
    returns what each report showed. The check: every value shown is 0, and something was."""
    tps = [("orders", 0), ("orders", 1), ("orders", 2)]
    ends = {tps[0]: 219, tps[1]: 188, tps[2]: 193}
    source = Source(dict(ends), dict(ends))
    source.go.clear()  # the broker answers the read only after the first report
    gauge, registry = _gauge()
    view = make("g", source, gauge)
    consumer = Consumer()
    parts = [PartitionState(*tp) for tp in tps]
    view.assigned(parts)
    seen = []
    view.report(parts, _port(consumer))
    seen.append(_shown(registry))
    consumer.ends.update(ends)  # the first fetches cached the log ends
    view.report(parts, _port(consumer))
    seen.append(_shown(registry))
    source.go.set()
    _settle(view)
    view.report(parts, _port(consumer))
    seen.append(_shown(registry))
    values = [v for s in seen for v in s.values()]
    assert values, "nothing was shown"
    assert seen[-1].keys() == set(tps), seen
    assert all(v == 0 for v in values), f"a caught-up group showed lag: {seen}"
    return seen


@pytest.mark.parametrize("canary", [False, True], ids=["view", "canary"])
def test_a_restart_on_a_caught_up_group_shows_lag_0_from_the_first_report(canary: bool) -> None:
    if not canary:
        seen = _restart_on_a_caught_up_group(LagView)
        assert seen[0] == {} and seen[1] == {}  # absent until known, never a guess
        return
    with pytest.raises(AssertionError, match="showed lag"):
        _restart_on_a_caught_up_group(OldRule)


def test_the_workers_own_position_wins_and_no_commit_is_the_whole_log() -> None:
    assert owned_lag(None, None, None) is None
    assert owned_lag(10, None, None) is None  # no base known: no figure
    assert owned_lag(10, None, Read(None, 10)) == 10  # never committed: KEDA's "earliest"
    assert owned_lag(10, None, Read(4, 8)) == 6  # the cached end is the newer one
    assert owned_lag(None, None, Read(4, 8)) == 4  # nothing cached yet: the end read
    assert owned_lag(10, 7, Read(4, 8)) == 3  # the worker's own position beats the read
    assert owned_lag(10, 12, None) == 0  # never below 0
    ps = PartitionState("t", 0)
    ps.tracker.track(5)
    ps.tracker.complete(5)
    gauge, registry = _gauge()
    view = LagView("g", None, gauge)
    consumer = Consumer()
    consumer.ends[("t", 0)] = 9
    view.report([ps], _port(consumer))
    assert _shown(registry) == {("t", 0): 3.0}


def test_a_revoked_partitions_series_goes_and_a_late_read_does_not_bring_it_back() -> None:
    tp = ("t", 0)
    source = Source({tp: 3}, {tp: 5})
    gauge, registry = _gauge()
    view = LagView("g", source, gauge)
    ps = PartitionState(*tp)
    view.assigned([ps])
    _settle(view)
    view.report([ps], _port(Consumer()))
    assert _shown(registry) == {tp: 2.0}
    view.forget([tp])
    assert _shown(registry) == {}
    again = PartitionState(*tp)  # assigned again later: the old read is not its own
    source.go.clear()
    view.assigned([again])
    view.report([again], _port(Consumer()))
    assert _shown(registry) == {}
    source.go.set()
