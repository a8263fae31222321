"""`kworkers lag` on a group with known committed offsets and a retry tier with known due times.

Layout (hand-worked expectations below):
    T/0: 10 records, G committed 3          -> lag 7
    T/1:  4 records, G never committed      -> lag 4 (earliest, the default), 1 (latest),
                                               0 (scale to zero)
    T.retry.1s/0: 2 due + 5 waiting, G.retry committed 1 -> lag 6, waiting 5, due 1
    T.retry.1s/1: 3 waiting, G.retry never committed -> lag 3 (earliest), all waiting;
                                                        lag 1 (latest) of which 1 waiting

The default policy is ``earliest``, what ``kworkers deploy render`` writes in the ScaledObject:
an empty partition never committed on is lag 0 then, so empty retry tiers are not due retries.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from kworkers.testing import Broker
from kworkers.testing.workload import unique
from tests.integration.test_cli_support import cli, one_error_line

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def layout(kafka_broker: Broker) -> tuple[str, str]:
    bs = kafka_broker.bootstrap_servers
    t, g = unique("lag"), unique("g")
    made = cli("topics", "create", "-b", bs, "-t", t, "--partitions", "2", "--tiers", "1s")
    assert made.returncode == 0, made.stderr
    tier = f"{t}.retry.1s"
    now_ms = int(time.time() * 1000)
    past, future = str(now_ms - 60_000).encode(), str(now_ms + 3_600_000).encode()
    p = Producer({"bootstrap.servers": bs, "enable.idempotence": True})
    for _ in range(10):
        p.produce(t, value=b"x", partition=0)
    for _ in range(4):
        p.produce(t, value=b"x", partition=1)
    for due in [past, past] + [future] * 5:
        p.produce(tier, value=b"r", partition=0, headers=[("kw-attempt", b"2"), ("kw-due-at", due)])
    for _ in range(3):
        p.produce(tier, value=b"r", partition=1, headers=[("kw-due-at", future)])
    assert p.flush(30) == 0
    for group, topic, offset in ((g, t, 3), (f"{g}.retry", tier, 1)):
        c = Consumer({"bootstrap.servers": bs, "group.id": group, "enable.auto.commit": False})
        c.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
        c.close()
    return t, g


def _lag(bs: str, *args: str) -> dict[str, Any]:
    p = cli("lag", "-b", bs, *args, "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)  # type: ignore[no-any-return]


def _by_partition(rows: list[dict[str, Any]]) -> dict[int, tuple[Any, ...]]:
    return {r["partition"]: (r["committed"], r["latest"], r["lag"], r["waiting"], r["due"])
            for r in rows}


def test_lag_as_keda_counts_it(kafka_broker: Broker, layout: tuple[str, str]) -> None:
    bs = kafka_broker.bootstrap_servers
    t, g = layout
    got = _lag(bs, "--group", g, "--topic", t)
    assert _by_partition(got["partitions"]) == {0: (3, 10, 7, None, None),
                                                1: (None, 4, 4, None, None)}
    assert got["lag"] == 11  # 7 + the whole of partition 1
    assert got["retry_group"] == f"{g}.retry"
    assert _by_partition(got["retry_partitions"]) == {0: (1, 7, 6, 5, 1), 1: (None, 3, 3, 3, 0)}
    assert (got["retry_lag"], got["retry_waiting"], got["retry_truncated"]) == (9, 8, False)

    latest = _lag(bs, "--group", g, "--topic", t, "--offset-reset-policy", "latest")
    assert latest["lag"] == 8  # KEDA's own default: 1 for the partition never committed on
    assert _by_partition(latest["retry_partitions"])[1] == (None, 3, 1, 1, 0)

    zero = _lag(bs, "--group", g, "--topic", t, "--scale-to-zero-on-invalid-offset")
    assert zero["lag"] == 7


def test_topics_default_to_the_committed_ones(kafka_broker: Broker,
                                              layout: tuple[str, str]) -> None:
    t, g = layout
    got = _lag(kafka_broker.bootstrap_servers, "--group", g)
    assert {r["topic"] for r in got["partitions"]} == {t}
    assert got["lag"] == 11


def test_waiting_scan_is_bounded(kafka_broker: Broker, layout: tuple[str, str]) -> None:
    t, g = layout
    got = _lag(kafka_broker.bootstrap_servers, "--group", g, "--topic", t,
               "--waiting-scan-limit", "2")
    rows = {r["partition"]: r for r in got["retry_partitions"]}
    assert rows[0]["truncated"] and rows[0]["waiting"] == 1  # read 1 due + 1 waiting, stopped
    assert got["retry_truncated"]


def test_table_output(kafka_broker: Broker, layout: tuple[str, str]) -> None:
    t, g = layout
    p = cli("lag", "-b", kafka_broker.bootstrap_servers, "--group", g, "--topic", t)
    assert p.returncode == 0, p.stderr
    assert f"lag group={g} total=11" in p.stdout
    assert f"retry group={g}.retry lag=9 waiting=8 due=1" in p.stdout
    assert "what KEDA scales on" in p.stdout


def test_empty_tiers_are_not_due_retries(kafka_broker: Broker) -> None:
    """A pipeline where nothing failed yet: the source partitions are caught up or empty, the
    tiers empty and never committed on. ``kworkers lag`` and the console (the same reading and
    KEDA's calculator) say 0 everywhere, and KEDA would scale to zero, as the rendered
    ScaledObject (``offsetResetPolicy: earliest``) does. Under ``latest`` every such partition
    counted 1: ``lag=N due=N`` with nothing to run."""
    from kworkers.console.groups import group_view
    from kworkers.console.settings import ConsoleSettings
    from kworkers.kafka.settings import ClientSettings

    bs = kafka_broker.bootstrap_servers
    t, g = unique("idle"), unique("g")
    made = cli("topics", "create", "-b", bs, "-t", t, "--partitions", "3", "--tiers", "1s,5s")
    assert made.returncode == 0, made.stderr
    p = Producer({"bootstrap.servers": bs, "enable.idempotence": True})
    p.produce(t, value=b"x", partition=0)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": bs, "group.id": g, "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(t, 0, 1)], asynchronous=False)  # caught up on 0 only
    c.close()

    got = _lag(bs, "--group", g, "--topic", t)
    assert [r["lag"] for r in got["partitions"]] == [0, 0, 0]
    assert len(got["retry_partitions"]) == 6  # two tiers of three partitions, all read
    assert {(r["latest"], r["committed"], r["lag"], r["due"])
            for r in got["retry_partitions"]} == {(0, None, 0, 0)}
    assert (got["lag"], got["retry_lag"]) == (0, 0)
    table = cli("lag", "-b", bs, "--group", g, "--topic", t)
    assert f"retry group={g}.retry lag=0 waiting=0 due=0" in table.stdout, table.stdout

    view = group_view(ConsoleSettings(ClientSettings(bs)), g)
    assert view.main is not None and view.retry is not None
    assert [p.lag for p in view.main.partitions] == [0, 0, 0]
    assert len(view.retry.partitions) == 6 and view.retry.total == 0
    assert [b.due for b in view.tiers] == [0, 0]
    assert view.scale is not None
    assert (view.scale.decision.lag, view.scale.decision.active,
            view.scale.decision.replicas) == (0, False, 0)


def test_errors(kafka_broker: Broker) -> None:
    bs = kafka_broker.bootstrap_servers
    p = cli("lag", "-b", bs, "--group", unique("nobody"))
    assert p.returncode == 2
    assert "has no committed offsets; name its topics with --topic" in one_error_line(p)
    p = cli("lag", "-b", bs, "--group", "g", "--topic", "no-such-topic-kw")
    assert p.returncode == 2
    assert "topic 'no-such-topic-kw' does not exist" in one_error_line(p)
