"""Lag math as KEDA's Kafka scaler does it, on hand-worked cases."""

from __future__ import annotations

import pytest

from kworkers.errors import ConfigError
from kworkers.lag import PartitionLag, count_waiting, group_lag, partition_lag


@pytest.mark.parametrize(("latest", "committed", "policy", "zero", "lag"), [
    # committed: latest - committed, whatever the policy
    (100, 40, "latest", False, 60),        # 100 - 40
    (100, 40, "earliest", False, 60),
    (100, 40, "latest", True, 60),         # scaleToZero only concerns missing commits
    (100, 100, "latest", False, 0),        # caught up
    (0, 0, "latest", False, 0),            # empty partition, committed at 0
    (5, 7, "latest", False, -2),           # KEDA does not clamp (e.g. a recreated topic)
    # no commit (None, or Kafka's -1 / librdkafka's -1001)
    (100, None, "latest", False, 1),       # "latest": 1, so the group gets a pod
    (100, -1, "latest", False, 1),
    (100, -1001, "latest", False, 1),
    (0, None, "latest", False, 1),         # even with nothing in the partition
    (100, None, "earliest", False, 100),   # "earliest": the whole log, latest itself
    (0, None, "earliest", False, 0),
    (100, None, "latest", True, 0),        # scaleToZeroOnInvalidOffset
    (100, None, "earliest", True, 0),
])
def test_partition_lag(latest: int, committed: int | None, policy: str, zero: bool,
                       lag: int) -> None:
    assert partition_lag(latest, committed, policy, zero) == lag  # type: ignore[arg-type]


def test_unknown_policy() -> None:
    with pytest.raises(ConfigError):
        partition_lag(1, 0, "newest")  # type: ignore[arg-type]


def test_count_waiting() -> None:
    now = 1000.0
    # 1001 and 2000 are ahead; 1000 is due exactly now; None has no due time (due)
    assert count_waiting([999.0, 1000.0, 1001.0, 2000.0, None], now) == 2
    assert count_waiting([], now) == 0


def test_group_lag_sorts_totals_and_splits_waiting() -> None:
    rows = [("t.retry.1s", 1, 10, None), ("t.retry.1s", 0, 50, 20), ("t.retry.5s", 0, 8, 8)]
    waiting = {("t.retry.1s", 0): (25, False), ("t.retry.1s", 1): (3, True)}
    g = group_lag("g.retry", rows, "latest", False, waiting)
    assert [(p.topic, p.partition) for p in g.partitions] == [
        ("t.retry.1s", 0), ("t.retry.1s", 1), ("t.retry.5s", 0)]
    p0, p1, q0 = g.partitions
    assert p0 == PartitionLag("t.retry.1s", 0, 20, 50, 30, 25, False)  # 50 - 20 = 30
    assert p0.due == 5                                                  # 30 - 25
    # no commit under "latest": KEDA counts 1, so at most 1 of the 3 read can be "waiting"
    assert (p1.lag, p1.waiting, p1.due, p1.truncated) == (1, 1, 0, True)
    assert (q0.lag, q0.waiting, q0.due) == (0, 0, 0)  # not read: nothing after the commit
    assert (g.total, g.waiting, g.truncated) == (31, 26, True)


def test_group_lag_without_waiting() -> None:
    g = group_lag("g", [("t", 0, 10, 4), ("t", 1, 10, -1001)], "earliest")
    assert [p.lag for p in g.partitions] == [6, 10]
    assert [p.committed for p in g.partitions] == [4, None]
    assert g.partitions[0].waiting is None and g.partitions[0].due is None
    assert (g.total, g.waiting, g.truncated) == (16, 0, False)


def test_agrees_with_the_keda_replica_calculator() -> None:
    """kworkers.keda has its own per-partition rule (with persistent lag); they must agree."""
    keda = pytest.importorskip("kworkers.keda")
    for latest, committed in [(100, 40), (100, None), (0, None), (7, 7)]:
        for policy in ("latest", "earliest"):
            for zero in (False, True):
                s = keda.ScalerSettings(offset_reset_policy=policy,
                                        scale_to_zero_on_invalid_offset=zero)
                p = keda.PartitionOffsets("t", 0, latest, committed)
                assert keda.partition_lag(s, p, None)[0] == partition_lag(
                    latest, committed, policy, zero)


def test_tiers_are_shown_by_delay_not_as_text() -> None:
    """`10m` sorts before `1s` as text; a pipeline reads source, tiers by delay, DLQ."""
    from kworkers.console.groups import tier_backlogs
    from kworkers.topic_names import topic_order

    names = ["o.retry.10m", "o.dlq", "o.retry.1s", "o.retry.500ms", "o", "o.retry.2h",
             "o.retry.30s"]
    assert sorted(names, key=topic_order) == [
        "o", "o.retry.500ms", "o.retry.1s", "o.retry.30s", "o.retry.10m", "o.retry.2h", "o.dlq"]
    rows = [(t, 0, 5, 1) for t in ("o.retry.10m", "o.retry.1s", "o.retry.2m")]
    g = group_lag("g.retry", rows, "earliest", False, {})
    assert [p.topic for p in g.partitions] == ["o.retry.1s", "o.retry.2m", "o.retry.10m"]
    assert [b.topic for b in tier_backlogs(g)] == ["o.retry.1s", "o.retry.2m", "o.retry.10m"]


def test_time_lag_of_kworkers_lag_counts_from_the_record_at_the_committed_position() -> None:
    """``kworkers lag``'s time lag (issue #47 item 1): now minus the time of the record at the
    committed position; 0 with no lag; a tier record not due is 0; None where not read."""
    from kworkers.lag import lag_seconds

    assert lag_seconds(100.0, 0, None) == 0.0          # caught up: 0, nothing read
    assert lag_seconds(100.0, 5, 40.0) == 60.0
    assert lag_seconds(100.0, 5, 130.0) == 0.0         # not due yet / a clock ahead
    assert lag_seconds(100.0, 5, None) is None
    g = group_lag("g", [("t", 0, 10, 4), ("t", 1, 10, 10), ("t", 2, 10, 2)],
                  times={("t", 0): 70.0, ("t", 2): 90.0}, now=100.0)
    assert [p.time_lag for p in g.partitions] == [30.0, 0.0, 10.0]
    assert g.time_lag == 30.0                            # the group's: the largest
    assert group_lag("g", [("t", 0, 10, 4)]).time_lag is None
