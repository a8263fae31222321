"""Tier ladder: names, labels, the choice of tier and validation."""

from __future__ import annotations

import math

import pytest

from kworkers.errors import ConfigError
from kworkers.retry_tiers.tiers import Tier, TierLadder
from kworkers.topic_names import source_topic_of


def test_default_ladder_names() -> None:
    tiers = TierLadder().tiers("orders")
    assert [t.topic for t in tiers] == [
        "orders.retry.1s",
        "orders.retry.5s",
        "orders.retry.30s",
        "orders.retry.2m",
        "orders.retry.10m",
    ]
    assert [t.delay for t in tiers] == [1.0, 5.0, 30.0, 120.0, 600.0]
    assert tiers[3] == Tier(label="2m", delay=120.0, topic="orders.retry.2m")


@pytest.mark.parametrize(
    ("delay", "label"),
    [
        (0.5, "500ms"),
        (1.0, "1s"),
        (1.5, "1500ms"),
        (90.0, "90s"),
        (120.0, "2m"),
        (3600.0, "1h"),
        (5400.0, "90m"),
        (86400.0, "24h"),
        (0.001, "1ms"),
    ],
)
def test_labels_use_the_shortest_exact_unit(delay: float, label: str) -> None:
    (tier,) = TierLadder(delays=(delay,)).tiers("t")
    assert tier.label == label
    assert tier.topic == f"t.retry.{label}"


def test_dlq_and_all_topics() -> None:
    ladder = TierLadder(delays=(1.0, 60.0))
    assert ladder.dlq_topic("orders") == "orders.dlq"
    assert ladder.all_topics("orders") == ("orders.retry.1s", "orders.retry.1m", "orders.dlq")


@pytest.mark.parametrize(
    ("delay", "label"),
    [
        (0.0, "1s"),  # below every tier: the smallest
        (0.3, "1s"),
        (1.0, "1s"),
        (4.999, "1s"),
        (5.0, "5s"),
        (29.0, "5s"),
        (30.0, "30s"),
        (119.0, "30s"),
        (600.0, "10m"),
        (10_000.0, "10m"),
    ],
)
def test_tier_for_is_the_largest_not_above(delay: float, label: str) -> None:
    assert TierLadder().tier_for("orders", delay).label == label


@pytest.mark.parametrize(
    "delays",
    [
        (),
        (0.0, 1.0),
        (-1.0,),
        (5.0, 1.0),
        (1.0, 1.0),
        (1.0, math.inf),
        (math.nan,),
        (0.0005,),  # not a whole number of milliseconds: no exact label
    ],
)
def test_ladder_validation(delays: tuple[float, ...]) -> None:
    with pytest.raises(ConfigError):
        TierLadder(delays=delays)


def test_ladder_accepts_a_list_and_stays_hashable() -> None:
    ladder = TierLadder(delays=[1, 2])  # type: ignore[arg-type]
    assert ladder.delays == (1.0, 2.0)
    assert hash(ladder) == hash(TierLadder(delays=(1.0, 2.0)))


def test_bad_topic_names_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        TierLadder().tiers("")
    with pytest.raises(ConfigError):
        TierLadder().tiers("has space")
    with pytest.raises(ConfigError):
        TierLadder().tiers("x" * 249)  # the derived names would exceed Kafka's limit


@pytest.mark.parametrize(
    ("name", "source"),
    [
        ("orders.retry.5s", "orders"),
        ("orders.retry.500ms", "orders"),
        ("orders.retry.10m", "orders"),
        ("orders.dlq", "orders"),
        ("orders", "orders"),
        ("my.orders.v2.retry.1h", "my.orders.v2"),
        ("orders.retry", "orders.retry"),
        ("orders.retry.soon", "orders.retry.soon"),
        ("orders.retry.5s.dlq", "orders"),
    ],
)
def test_source_topic_of(name: str, source: str) -> None:
    assert source_topic_of(name) == source


def test_source_topic_of_inverts_every_generated_name() -> None:
    ladder = TierLadder(delays=(0.25, 1.0, 90.0, 7200.0))
    for name in ladder.all_topics("pay.events"):
        assert source_topic_of(name) == "pay.events"
