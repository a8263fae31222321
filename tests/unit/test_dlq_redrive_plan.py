"""RedriveFilter: which dead letters an operator's redrive selects."""

from __future__ import annotations

import dataclasses

import pytest

from kworkers.dlq import DeadLetter, RedriveFilter
from kworkers.errors import ConfigError

BASE = DeadLetter(
    dlq_topic="orders.dlq",
    dlq_partition=0,
    dlq_offset=100,
    original_topic="orders",
    original_partition=1,
    original_offset=7,
    key=b"cust-1",
    value=b"{}",
    attempts=5,
    error_type="Timeout",
    error_message="slow",
    first_failure_at=900.0,
    last_failure_at=990.0,
    dead_lettered_at=1000.0,
    reason="exhausted",
    group="billing",
    headers=(),
)


def test_empty_filter_matches_everything() -> None:
    assert RedriveFilter().matches(BASE)
    assert RedriveFilter().matches(dataclasses.replace(BASE, key=None))


def test_error_type() -> None:
    assert RedriveFilter(error_type="Timeout").matches(BASE)
    assert not RedriveFilter(error_type="BadSpec").matches(BASE)
    assert not RedriveFilter(error_type="timeout").matches(BASE)  # types are exact


def test_key() -> None:
    assert RedriveFilter(key=b"cust-1").matches(BASE)
    assert not RedriveFilter(key=b"cust-2").matches(BASE)
    assert not RedriveFilter(key=b"cust-1").matches(dataclasses.replace(BASE, key=None))


def test_time_window_is_half_open_on_dead_lettered_at() -> None:
    assert RedriveFilter(since=1000.0).matches(BASE)
    assert not RedriveFilter(since=1000.001).matches(BASE)
    assert RedriveFilter(until=1000.001).matches(BASE)
    assert not RedriveFilter(until=1000.0).matches(BASE)
    assert RedriveFilter(since=999.0, until=1001.0).matches(BASE)
    # the first/last failure times are not what the window selects on
    assert not RedriveFilter(until=995.0).matches(BASE)


def test_offset_range_is_inclusive_on_the_dlq_offset() -> None:
    assert RedriveFilter(min_offset=100, max_offset=100).matches(BASE)
    assert not RedriveFilter(min_offset=101).matches(BASE)
    assert not RedriveFilter(max_offset=99).matches(BASE)
    assert not RedriveFilter(min_offset=7, max_offset=7).matches(BASE)  # not the original offset


def test_criteria_combine_with_and() -> None:
    f = RedriveFilter(error_type="Timeout", key=b"cust-1", since=0.0, min_offset=0)
    assert f.matches(BASE)
    assert not f.matches(dataclasses.replace(BASE, error_type="Other"))
    assert not f.matches(dataclasses.replace(BASE, key=b"x"))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"since": 10.0, "until": 10.0},
        {"since": 10.0, "until": 5.0},
        {"min_offset": 5, "max_offset": 4},
        {"min_offset": -1},
    ],
)
def test_impossible_filters_are_config_errors(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        RedriveFilter(**kwargs)  # type: ignore[arg-type]
