"""The topics plan: what `kworkers topics create` would create, as a pure function."""

from __future__ import annotations

import pytest

from kworkers.errors import ConfigError
from kworkers.retry_tiers.tiers import TierLadder
from kworkers.topic_plan import SourceShape, TopicSpec, plan_topics, specs

LADDER = TierLadder((1.0, 30.0))


def test_missing_source_needs_partitions() -> None:
    with pytest.raises(ConfigError, match="'orders' does not exist on b:1; pass --partitions"):
        plan_topics({}, ["orders"], LADDER, None, "b:1")


def test_new_source_with_its_tiers_and_dlq() -> None:
    plan = plan_topics({}, ["orders"], LADDER, 4)
    assert [(p.name, p.role, p.partitions, p.action) for p in plan] == [
        ("orders", "source", 4, "create"),
        ("orders.retry.1s", "tier 1s", 4, "create"),
        ("orders.retry.30s", "tier 30s", 4, "create"),
        ("orders.dlq", "dlq", 4, "create"),
    ]
    assert [(s.name, s.partitions, s.replication_factor) for s in specs(plan, 3)] == [
        ("orders", 4, 3), ("orders.retry.1s", 4, 3), ("orders.retry.30s", 4, 3),
        ("orders.dlq", 4, 3)]


def test_existing_topics_are_kept_and_sized_from_the_source() -> None:
    have = {"orders": 6, "orders.retry.1s": 3, "payments": 2}
    plan = plan_topics(have, ["orders", "payments", "orders"], LADDER, 12)
    by_name = {p.name: p for p in plan}
    assert by_name["orders"].action == "exists"
    assert "--partitions 12 ignored: it has 6" in by_name["orders"].note
    assert by_name["orders.retry.1s"].action == "exists"
    assert "has 3 partitions, source has 6" in by_name["orders.retry.1s"].note
    assert (by_name["orders.retry.30s"].partitions, by_name["orders.retry.30s"].action) == (
        6, "create")
    assert by_name["payments.dlq"].partitions == 2
    assert len(plan) == 8  # "orders" named twice, planned once
    assert [s.name for s in specs(plan)] == [
        "orders.retry.30s", "orders.dlq", "payments.retry.1s", "payments.retry.30s",
        "payments.dlq"]


@pytest.mark.parametrize(("sources", "match"), [
    ([], "at least one source topic"),
    (["orders.dlq"], "is a retry tier or DLQ"),
    (["orders.retry.1s"], "is a retry tier or DLQ"),
    (["bad name"], "not a legal Kafka topic name"),
])
def test_bad_sources(sources: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        plan_topics({}, sources, LADDER, 1)


def test_derived_topics_are_as_durable_as_their_source_never_a_silent_1() -> None:
    shapes = {"orders": SourceShape(3, "2")}
    plan = plan_topics({"orders": 6}, ["orders"], LADDER, None, shapes=shapes)
    made = specs(plan)
    assert [(s.name, s.partitions, s.replication_factor, dict(s.config)) for s in made] == [
        (name, 6, 3, {"min.insync.replicas": "2"})
        for name in ("orders.retry.1s", "orders.retry.30s", "orders.dlq")]
    assert {p.durability() for p in plan if p.action == "create"} == {
        "3, min.insync.replicas=2"}
    # the operator's --replication-factor wins; the source's min.insync.replicas stays
    assert {(s.replication_factor, s.config["min.insync.replicas"]) for s in specs(plan, 5)} == {
        (5, "2")}
    # nothing to copy (a new source, a source without an override): the broker's defaults
    fresh = plan_topics({}, ["new"], LADDER, 4)
    assert {(s.replication_factor, len(s.config)) for s in specs(fresh)} == {(-1, 0)}
    assert {p.durability() for p in fresh} == {"broker default"}
    assert TopicSpec("t").replication_factor == -1
