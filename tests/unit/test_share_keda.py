"""Scaling a share-mode pool: the backlog query, the replica calculator, the rendered trigger.

Hand-worked cases; each comment shows the arithmetic KEDA's Prometheus trigger and the HPA do.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from kworkers.deploy import EXAMPLE_ARGS, cross_problems, example_config, keda_problems, manifests
from kworkers.deploy.samples import SHARE_EXAMPLE_ARGS, share_example_files
from kworkers.errors import ConfigError
from kworkers.keda import (
    SHARE_GROUP_MAX_SIZE,
    BacklogSample,
    PartitionOffsets,
    ScalerSettings,
    desired_replicas,
    desired_share_replicas,
    share_backlog,
    share_backlog_query,
)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
T = "orders"
PER_REPLICA = ScalerSettings(lag_threshold=100)


def samples(*rows: tuple[str, int, int]) -> list[BacklogSample]:
    return [BacklogSample(replica, T, partition, backlog) for replica, partition, backlog in rows]


def test_the_backlog_is_the_min_per_partition_over_replicas_summed() -> None:
    # p0: a says 900 (fetched a while ago), b says 400 (fetched last) -> 400
    # p1: only b fetched from it -> 300;   400 + 300 = 700, not 900 + 400 + 300
    got = samples(("a", 0, 900), ("b", 0, 400), ("b", 1, 300))
    assert share_backlog(got) == 700
    assert share_backlog([]) == 0
    assert share_backlog(samples(("a", 0, -5))) == 0


def test_a_share_pool_grows_beyond_its_partitions() -> None:
    # 2 partitions, 5000 waiting, 100 per replica: ceil(5000 / 100) = 50 replicas
    got = samples(("a", 0, 2500), ("b", 0, 2600), ("a", 1, 2500), ("c", 1, 2500))
    d = desired_share_replicas(PER_REPLICA, got, current_replicas=3, min_replicas=1,
                               max_replicas=200)
    assert (d.lag, d.active, d.replicas) == (5000, True, 50)
    # ... where the Kafka scaler on a consumer group with the same lag stops at 2
    kafka = desired_replicas(PER_REPLICA, [PartitionOffsets(T, 0, 5000, 2500),
                                           PartitionOffsets(T, 1, 5000, 2500)], None, 3, 1, 200)
    assert kafka.replicas == 2


def test_canary_summing_over_replicas_would_scale_on_its_own_output() -> None:
    """Three replicas that all see the same 1000 waiting: the query's answer is 10 replicas;
    a sum over replicas (the wrong query) asks for 30, and 90 once those 30 report."""
    same = samples(("a", 0, 1000), ("b", 0, 1000), ("c", 0, 1000))
    assert desired_share_replicas(PER_REPLICA, same, 3, 1, 200).replicas == 10
    wrong = sum(s.backlog for s in same)
    # "!= 10" compares two constants on purpose: the wrong query's answer beside the right one
    assert -(-wrong // 100) == 30 != 10  # type: ignore[comparison-overlap]


def test_canary_a_max_over_replicas_scales_on_a_stale_view() -> None:
    """Why min, not max: each replica's figure is an upper bound (log end minus what *it*
    acquired), and one that stopped fetching a partition keeps reporting a figure that grows
    with the log end. Two replicas drained p0 (the truth is 0); the third fetched from p0 long
    ago and reports 5000 for it: min answers 0 and keeps one replica, max would ask for 50."""
    stale = samples(("a", 0, 0), ("b", 0, 0), ("c", 0, 5000))
    assert desired_share_replicas(PER_REPLICA, stale, 3, 1, 200).replicas == 1
    worst = max(s.backlog for s in stale)
    # "!= 1" compares two constants on purpose: max's answer beside min's
    assert -(-worst // 100) == 50 != 1  # type: ignore[comparison-overlap]


def test_bounds_activation_and_tolerance() -> None:
    got = samples(("a", 0, 50))
    # below threshold but active: the floor of one replica
    assert desired_share_replicas(PER_REPLICA, got, 1, 1, 10).replicas == 1
    # capped by maxReplicaCount
    assert desired_share_replicas(PER_REPLICA, samples(("a", 0, 10_000)), 1, 1, 8).replicas == 8
    # activation threshold: 50 waiting is not > 60: inactive, and min 0 means zero replicas
    quiet = ScalerSettings(lag_threshold=100, activation_lag_threshold=60)
    assert desired_share_replicas(quiet, got, 1, 0, 10).replicas == 0
    # HPA tolerance 0.1: 1050 / (100 x 10) = 1.05, within 10 %: stay at 10
    near = samples(("a", 0, 1050))
    assert desired_share_replicas(PER_REPLICA, near, 10, 1, 50, tolerance=0.1).replicas == 10
    assert desired_share_replicas(PER_REPLICA, near, 10, 1, 50).replicas == 11
    with pytest.raises(ConfigError, match="replica bounds"):
        desired_share_replicas(PER_REPLICA, got, 1, 5, 2)


def test_at_zero_replicas_nothing_reports_and_the_pool_never_wakes() -> None:
    """Why share-mode manifests keep minReplicaCount >= 1: the metric comes from the workers."""
    assert desired_share_replicas(PER_REPLICA, [], 0, 0, 10).replicas == 0
    assert desired_share_replicas(PER_REPLICA, [], 0, 1, 10).replicas == 1


def test_the_query_quotes_the_group_or_refuses_it() -> None:
    assert share_backlog_query("orders-workers") == (
        'sum(min by (topic, partition) (kworkers_share_backlog{group="orders-workers"}))')
    with pytest.raises(ConfigError, match="PromQL"):
        share_backlog_query('bad"group')


def _share(**kw: object) -> dict[str, dict[str, object]]:
    share = dataclasses.replace(example_config(), mode="share")
    return manifests(share, **{**SHARE_EXAMPLE_ARGS, **kw})


def test_the_share_scaledobject_scales_on_the_backlog_query_beyond_the_partitions() -> None:
    objs = _share()
    so = objs["keda/scaledobject.yaml"]
    spec = so["spec"]
    assert isinstance(spec, dict)
    assert spec["maxReplicaCount"] == 24 > EXAMPLE_ARGS["partitions"]
    assert spec["minReplicaCount"] == 1
    main, *retry = spec["triggers"]
    assert main["type"] == "prometheus"
    assert main["metadata"]["query"] == share_backlog_query("orders-workers")
    assert main["metadata"]["threshold"] == "100"
    wake = [t for t in retry if t["type"] == "kafka"]
    assert {t["metadata"]["consumerGroup"] for t in wake} == {"orders-workers.retry"}
    [drain] = [t for t in retry if t["type"] == "prometheus"]  # the tiers' due records
    assert 'group="orders-workers.retry"' in drain["metadata"]["query"]
    assert keda_problems(so) == [] and cross_problems(objs) == []
    assert objs["k8s/configmap.yaml"]["data"]["KWORKERS_MODE"] == "share"  # type: ignore[index]


@pytest.mark.parametrize(("kw", "match"), [
    ({"prometheus": None}, "prometheus"),
    ({"max_replicas": None}, "not capped by the partitions"),
    ({"max_replicas": SHARE_GROUP_MAX_SIZE + 1}, "group.share.max.size"),
    ({"min_replicas": 0}, "at least 1"),
])
def test_share_manifests_refuse_what_cannot_work(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _share(**kw)


def test_the_committed_share_example_matches_a_fresh_render() -> None:
    for name, text in share_example_files().items():
        assert (DEPLOY / name).read_text("utf-8") == text, (
            f"{name} differs from render(): run `python -m kworkers.deploy`")
        assert yaml.safe_load(text)["spec"]["triggers"][0]["type"] == "prometheus"
