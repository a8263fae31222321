"""The circuit breaker's state machine under a fake clock."""

from __future__ import annotations

import random
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kworkers.clock import FakeClock
from kworkers.consumer.breaker import Breaker, BreakerPolicy, State
from kworkers.errors import ConfigError


def _breaker(**kw: object) -> tuple[Breaker, FakeClock, list[tuple[str, str]]]:
    clock = FakeClock(1000.0)
    moves: list[tuple[str, str]] = []
    policy = BreakerPolicy(**{"min_attempts": 4, "window_s": 10, "cooldown_s": 5.0,
                              "max_cooldown_s": 20.0, **kw})  # type: ignore[arg-type]
    b = Breaker(policy, clock, lambda a, z, _why: moves.append((a.value, z.value)),
                random.Random(7))
    return b, clock, moves


def test_stays_closed_below_the_minimum_attempts() -> None:
    b, _clock, moves = _breaker()
    for _ in range(3):
        b.record(False)
    assert b.state is State.CLOSED and b.admit() and moves == []


def test_opens_at_the_ratio_and_starts_nothing_during_the_cool_down() -> None:
    b, clock, moves = _breaker(failure_ratio=0.5)
    for ok in (True, True, False, False):  # 2 of 4 failed: 0.5
        b.record(ok)
    assert b.state is State.OPEN and moves == [("closed", "open")]
    clock.advance(4.9)
    assert not b.admit() and not b.would_admit()


def test_half_open_admits_exactly_one_probe_and_its_success_closes() -> None:
    b, clock, moves = _breaker()
    for _ in range(4):
        b.record(False)
    clock.advance(6.1)  # 5 s + at most a fifth of jitter
    assert b.would_admit()
    assert b.admit() and b.state is State.HALF_OPEN
    assert not b.admit() and not b.would_admit()  # one probe only
    b.record(True)
    assert cast(State, b.state) is State.CLOSED and b.admit()  # re-read: record() moved it
    assert moves == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]


def test_a_failed_probe_reopens_for_twice_the_cool_down_up_to_the_max() -> None:
    b, clock, _moves = _breaker()
    for _ in range(4):
        b.record(False)
    waits = []
    for _ in range(4):
        t0 = clock.monotonic()
        while not b.would_admit():
            clock.advance(0.1)
        waits.append(clock.monotonic() - t0)
        assert b.admit()
        b.record(False)
    # 5, 10, 20, 20 s (each + up to a fifth of jitter)
    for got, base in zip(waits, (5, 10, 20, 20), strict=True):
        assert base <= got <= base * 1.2 + 0.11


def test_non_retryable_failures_do_not_count_and_an_inconclusive_probe_frees_the_slot() -> None:
    b, clock, _moves = _breaker()
    for _ in range(50):
        b.record(None)
    assert b.state is State.CLOSED
    for _ in range(4):
        b.record(False)
    clock.advance(6.1)
    assert b.admit()
    b.record(None)  # the probe hit bad input: says nothing about the dependency
    assert cast(State, b.state) is State.HALF_OPEN and b.admit()  # another record may probe


def test_old_failures_leave_the_window() -> None:
    b, clock, _moves = _breaker()
    for _ in range(3):
        b.record(False)
    clock.advance(11)
    b.record(False)  # 1 in the window, under the minimum
    assert b.state is State.CLOSED


def test_late_results_while_open_are_ignored() -> None:
    b, clock, _moves = _breaker()
    for _ in range(4):
        b.record(False)
    b.record(True)  # a record started before it opened
    assert b.state is State.OPEN
    clock.advance(1)
    assert not b.admit()


@pytest.mark.parametrize("kw", [
    {"failure_ratio": 0}, {"failure_ratio": 1.5}, {"window_s": 0}, {"window_s": 2.5},
    {"min_attempts": 0}, {"cooldown_s": -1}, {"cooldown_s": float("nan")},
    {"cooldown_s": 10, "max_cooldown_s": 5},
])
def test_bad_settings_are_one_clear_error(kw: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match=r"breaker\."):
        BreakerPolicy(**kw)  # type: ignore[arg-type]


@given(st.lists(st.sampled_from([True, False, None, "tick"]), max_size=200))
def test_admits_at_most_one_probe_while_half_open(events: list[object]) -> None:
    b, clock, _moves = _breaker()
    probes = 0
    for e in events:
        if e == "tick":
            clock.advance(1.7)
        else:
            b.record(e)  # type: ignore[arg-type]
        if b.state is State.HALF_OPEN and b.admit():
            probes += 1
            assert not b.admit()
        if b.state is not State.HALF_OPEN:
            probes = 0
        assert probes <= 1
