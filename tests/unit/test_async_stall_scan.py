"""The async runtime's hung-call check reads only the calls old enough to be hung.

Why (issue #50): ``AsyncRuntime.stalled`` runs four times a second on each poll thread (a
slow and a hung bound, every half second), and it copied both maps of calls under way whole
each time, holding the GIL: 1.1 ms a check at 5,000 async handlers in flight (0.006 ms now),
growing with them, for a bound of minutes that no call was near. Calls enter ``_since`` in the
order they start, so the check now stops at the first call started within the bound. These tests
hold the result (the same call found: the oldest past the bound, a heartbeat honoured, a call
that ended as it was read skipped) and the cost (calls visited, counted by the map itself); the
canary runs the whole-copy check of before and is seen visiting every call.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest

from kworkers.clock import FakeClock
from kworkers.consumer.partition import Lane
from kworkers.consumer.runtime import AsyncRuntime, _running
from kworkers.message import Message
from kworkers.supervision import Supervisor

CALLS = 5_000
BOUND = 60.0


class _Lane:
    """What the check reads of a lane: when its handler last sent a heartbeat."""

    def __init__(self, started: float = 0.0) -> None:
        self.started = started


class _Counted(dict[Any, float]):
    """``_since``, counting the calls a check visits."""

    visited = 0

    def items(self) -> Iterator[tuple[Any, float]]:  # type: ignore[override]
        for item in super().items():
            self.visited += 1
            yield item


def _whole_copy(self: AsyncRuntime, bound: float) -> str | None:
    """The canary: the check as it was, both maps copied whole."""
    now = self.clock.monotonic()
    running, since = list(self._running.items()), dict(self._since.items())
    for lane, msg in running:
        started = since.get(lane)
        if started is None:
            continue
        found = _running("an async handler", msg, started, lane, now, bound)
        if found is not None:
            return found
    return None


def _runtime(clock: FakeClock, starts: list[tuple[float, float]]
             ) -> tuple[AsyncRuntime, _Counted]:
    """A runtime whose calls under way started at ``starts`` (start, last heartbeat), in
    that order, as its event loop records them."""
    rt = AsyncRuntime(1, Supervisor(), clock)
    since = _Counted()
    for i, (started, beat) in enumerate(starts):
        lane = cast(Lane, _Lane(beat))
        rt._running[lane] = Message("t", 0, i, None, b"v")
        since[lane] = started
    rt._since = since
    return rt, since


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_thousands_of_young_calls_are_not_walked(clock: FakeClock) -> None:
    clock.advance(1_000)
    rt, since = _runtime(clock, [(1_000 - 1 + i / CALLS, 0.0) for i in range(CALLS)])
    try:
        assert rt.stalled(BOUND) is None
        assert rt.stalled(BOUND) is None  # the loop answered nothing yet: still only calls
        assert since.visited == 2, f"{since.visited} calls visited by two checks"
    finally:
        rt.shutdown()


def test_the_oldest_call_past_the_bound_is_named(clock: FakeClock) -> None:
    clock.advance(1_000)
    starts = [(900.0, 0.0), (910.0, 0.0)] + [(999.0, 0.0)] * CALLS
    rt, since = _runtime(clock, starts)
    try:
        found = rt.stalled(BOUND)
        assert found is not None and "t/0@0" in found and "100s" in found
        assert since.visited == 1
    finally:
        rt.shutdown()


def test_a_heartbeat_makes_an_old_call_young(clock: FakeClock) -> None:
    clock.advance(1_000)
    # the oldest sent a heartbeat a second ago; the next one is past the bound
    rt, since = _runtime(clock, [(900.0, 999.0), (910.0, 0.0), (999.0, 0.0)])
    try:
        found = rt.stalled(BOUND)
        assert found is not None and "t/0@1" in found
        assert since.visited == 2
    finally:
        rt.shutdown()


def test_a_call_that_ended_as_it_was_read_is_skipped(clock: FakeClock) -> None:
    clock.advance(1_000)
    rt, _ = _runtime(clock, [(900.0, 0.0), (999.0, 0.0)])
    try:
        oldest = next(iter(rt._running))
        del rt._running[oldest]  # its call ended: its start is read, its record is gone
        assert rt.stalled(BOUND) is None
    finally:
        rt.shutdown()


def test_canary_the_whole_copy_walks_every_call(clock: FakeClock,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(AsyncRuntime, "stalled", _whole_copy)
    clock.advance(1_000)
    rt, since = _runtime(clock, [(1_000 - 1 + i / CALLS, 0.0) for i in range(CALLS)])
    try:
        assert rt.stalled(BOUND) is None  # the same verdict ...
        assert since.visited == CALLS  # ... at the cost the first test rules out
    finally:
        rt.shutdown()
