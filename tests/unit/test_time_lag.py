"""Time lag (issue #47 item 1): how long the oldest record not yet completed has waited,
precisely as ``kworkers.consumer.time_lag`` defines it, and the worker's record of fetched
runs it is read from."""

from __future__ import annotations

import pytest

from kworkers.consumer.time_lag import Run, Stamps, time_lag

NOW = 1_000_000.0


def test_the_definition_case_by_case() -> None:
    assert time_lag(NOW, None, NOW - 5) is None            # lag unknown: no figure
    assert time_lag(NOW, 0, NOW - 5) == 0.0                # caught up (idle or not): 0
    assert time_lag(NOW, 12, NOW - 7.5) == 7.5             # the oldest outstanding record
    assert time_lag(NOW, 12, NOW + 30) == 0.0              # a producer clock ahead: 0
    assert time_lag(NOW, 1, NOW - 86_400) == 86_400        # an old producer timestamp counts
    # a retry tier record measured from kw-due-at: not due yet is 0, due is how late
    assert time_lag(NOW, 3, NOW + 60) == 0.0
    assert time_lag(NOW, 3, NOW - 2) == 2.0


def test_a_record_not_fetched_yet_is_bounded_by_what_came_before() -> None:
    # nothing known at all (just assigned): absent, never a guess
    assert time_lag(NOW, 5, None) is None
    # after the last record fetched (its time), and after the partition was last seen caught
    # up: the later of the two bounds it
    assert time_lag(NOW, 5, None, last_t=NOW - 3600, caught_up_at=NOW - 5) == 5.0
    assert time_lag(NOW, 5, None, last_t=NOW - 4) == 4.0
    assert time_lag(NOW, 5, None, caught_up_at=NOW - 6) == 6.0


def test_runs_interpolate_by_offset_and_drop_what_is_behind() -> None:
    s = Stamps()
    s.add(100, 10.0, 199, 20.0)
    s.add(200, 30.0, 200, 30.0)
    assert s.time_of(100) == 10.0
    assert s.time_of(150) == pytest.approx(10.0 + 50 / 99 * 10.0)
    assert s.time_of(199) == 20.0
    assert len(s) == 2
    assert s.time_of(200) == 30.0
    assert len(s) == 1  # the first run is wholly behind the oldest outstanding record
    assert s.time_of(250) is None
    assert s.last_t == 30.0


def test_a_run_with_a_missing_time_errs_towards_the_older() -> None:
    assert Run(0, None, 9, 5.0).time_of(3) == 5.0
    assert Run(0, 4.0, 9, None).time_of(9) == 4.0
    assert Run(0, None, 9, None).time_of(3) is None


def test_runs_are_bounded() -> None:
    s = Stamps()
    for i in range(Stamps.LIMIT + 10):
        s.add(i, float(i), i, float(i))
    assert len(s) == Stamps.LIMIT
