"""Redrive planning: which dead letters an operator's redrive selects, and where they go."""

from __future__ import annotations

import dataclasses

import pytest

from kworkers.dlq import DeadLetter, RedriveFilter
from kworkers.dlq.redrive_plan import Refused, check_target, ledger_key, plan, redrive_target
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


# --- where a replay goes: the DLQ's name decides, never a dead letter's headers -------------


@pytest.mark.parametrize("origin", ["orders", "orders.retry.5s", "orders.retry.500ms"])
def test_the_default_target_is_the_dlqs_source(origin: str) -> None:
    d = dataclasses.replace(BASE, original_topic=origin)
    assert redrive_target("orders.dlq", d) == "orders"


@pytest.mark.parametrize("origin", ["victim", "bad topic!", "victim.retry.5s", "orders.dlq",
                                    "orders-2", "x" * 400])
def test_a_disagreeing_origin_is_refused_with_a_reason(origin: str) -> None:
    d = dataclasses.replace(BASE, original_topic=origin)
    refused = redrive_target("orders.dlq", d)
    assert isinstance(refused, Refused) and refused.dead == d
    assert "recorded origin" in refused.reason and "naming the target explicitly" in refused.reason
    assert len(refused.reason) < 300
    assert redrive_target("orders.dlq", d, to="audit") == "audit"  # the operator's choice


@pytest.mark.parametrize("dlq", ["orders", "orders.retry.5s.dlq", "weird"])
def test_a_dlq_not_named_after_a_source_has_no_default_target(dlq: str) -> None:
    refused = redrive_target(dlq, BASE)
    assert isinstance(refused, Refused) and "name one explicitly" in refused.reason


@pytest.mark.parametrize("to", ["orders.retry.5s", "orders.dlq", "bad topic!", ""])
def test_an_explicit_target_must_be_a_source_topic(to: str) -> None:
    with pytest.raises(ConfigError):
        check_target(to)
    with pytest.raises(ConfigError):
        plan("orders.dlq", [BASE], RedriveFilter(), set(), to, {to: 1})


def test_the_plan_replays_what_agrees_and_refuses_the_rest() -> None:
    forged = dataclasses.replace(BASE, dlq_offset=101, original_topic="victim")
    tier = dataclasses.replace(BASE, dlq_offset=102, original_topic="orders.retry.1s",
                               original_partition=4)
    done = dataclasses.replace(BASE, dlq_offset=103, original_topic="victim")  # in the ledger
    p = plan("orders.dlq", [BASE, forged, tier, done], RedriveFilter(),
             {ledger_key(done)}, None, {"orders": 3, "victim": 3})
    assert [(r.dead.dlq_offset, r.topic, r.partition) for r in p.todo] == [
        (100, "orders", 1),  # its original partition
        (102, "orders", None),  # from a tier: its partition number is the tier's, so by key
    ]
    assert [r.dead.dlq_offset for r in p.refused] == [101]
    assert p.skipped_already == 1 and len(p.selected) == 4
    # naming the target replays the refused one too (and nothing goes to "victim")
    explicit = plan("orders.dlq", [BASE, forged], RedriveFilter(), set(), "orders",
                    {"orders": 3, "victim": 3})
    assert [r.topic for r in explicit.todo] == ["orders", "orders"] and not explicit.refused


def test_only_a_dlq_is_a_dlq() -> None:
    from kworkers.errors import ConfigError
    from kworkers.topic_names import check_dlq

    assert check_dlq("orders.dlq") == "orders"
    assert check_dlq("my.orders.v2.dlq") == "my.orders.v2"
    for name, needle in [
        ("orders.retry.1s", "a retry tier of 'orders', not a DLQ; its DLQ is 'orders.dlq'"),
        ("orders", "'orders' is not a DLQ (a DLQ is named <source>.dlq)"),
        ("orders.dlq.redriven", "a redrive ledger, not a DLQ; its DLQ is 'orders.dlq'"),
        ("orders.retry.1s.dlq", "is not a DLQ"),
        ("bad name!", "is not a DLQ"),
    ]:
        with pytest.raises(ConfigError, match="not a DLQ") as err:
            check_dlq(name)
        assert needle in str(err.value)
