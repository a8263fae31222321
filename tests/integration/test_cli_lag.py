"""`kworkers lag` on a group with known committed offsets and a retry tier with known due times.

Layout (hand-worked expectations below):
    T/0: 10 records, G committed 3          -> lag 7
    T/1:  4 records, G never committed      -> lag 1 (latest), 4 (earliest), 0 (scale to zero)
    T.retry.1s/0: 2 due + 5 waiting, G.retry committed 1 -> lag 6, waiting 5, due 1
    T.retry.1s/1: 3 waiting, G.retry never committed -> lag 1 (latest) of which 1 waiting,
                                                        lag 3 (earliest), all waiting
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
                                                1: (None, 4, 1, None, None)}
    assert got["lag"] == 8
    assert got["retry_group"] == f"{g}.retry"
    assert _by_partition(got["retry_partitions"]) == {0: (1, 7, 6, 5, 1), 1: (None, 3, 1, 1, 0)}
    assert (got["retry_lag"], got["retry_waiting"], got["retry_truncated"]) == (7, 6, False)

    earliest = _lag(bs, "--group", g, "--topic", t, "--offset-reset-policy", "earliest")
    assert earliest["lag"] == 11  # 7 + the whole of partition 1
    assert _by_partition(earliest["retry_partitions"])[1] == (None, 3, 3, 3, 0)

    zero = _lag(bs, "--group", g, "--topic", t, "--scale-to-zero-on-invalid-offset")
    assert zero["lag"] == 7


def test_topics_default_to_the_committed_ones(kafka_broker: Broker,
                                              layout: tuple[str, str]) -> None:
    t, g = layout
    got = _lag(kafka_broker.bootstrap_servers, "--group", g)
    assert {r["topic"] for r in got["partitions"]} == {t}
    assert got["lag"] == 8


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
    assert f"lag group={g} total=8" in p.stdout
    assert f"retry group={g}.retry lag=7 waiting=6 due=1" in p.stdout
    assert "what KEDA scales on" in p.stdout


def test_errors(kafka_broker: Broker) -> None:
    bs = kafka_broker.bootstrap_servers
    p = cli("lag", "-b", bs, "--group", unique("nobody"))
    assert p.returncode == 2
    assert "has no committed offsets; name its topics with --topic" in one_error_line(p)
    p = cli("lag", "-b", bs, "--group", "g", "--topic", "no-such-topic-kw")
    assert p.returncode == 2
    assert "topic 'no-such-topic-kw' does not exist" in one_error_line(p)
