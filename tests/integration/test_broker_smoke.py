"""The foundation: a real Kafka 4.x KRaft broker that tests can use, kill and restart."""

from __future__ import annotations

import re
import uuid
from typing import cast

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import ConfigResource, ResourceType

from kworkers.kafka.admin import admin_client, create_topics, existing_topics
from kworkers.testing import Broker
from kworkers.topic_plan import TopicSpec

pytestmark = pytest.mark.integration


def _produce(bootstrap: str, topic: str, n: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(n):
        p.produce(topic, key=str(i % 7).encode(), value=f"v{i}".encode())
    assert p.flush(30) == 0


def _consume_all(
    bootstrap: str, topic: str, group: str, n: int, protocol: str = "classic"
) -> list[bytes]:
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "group.protocol": protocol,
    }
    c = Consumer(conf)
    c.subscribe([topic])
    got: list[bytes] = []
    try:
        for _ in range(300):
            for m in c.consume(500, timeout=0.2):
                assert m.error() is None, m.error()
                got.append(cast(bytes, m.value()))  # error() is None: a record
            if len(got) >= n:
                break
        c.commit(asynchronous=False)
    finally:
        c.close()
    return got


def test_topics_produce_consume_commit(kafka_broker: Broker) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic, group = f"smoke-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    admin = admin_client(bootstrap)
    assert create_topics(admin, [TopicSpec(topic, partitions=3)]) == [topic]
    assert create_topics(admin, [TopicSpec(topic, partitions=3)]) == []  # idempotent
    assert existing_topics(admin)[topic] == 3
    _produce(bootstrap, topic, 300)
    got = _consume_all(bootstrap, topic, group, 300)
    assert sorted(got) == sorted(f"v{i}".encode() for i in range(300))

    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    committed = probe.committed([TopicPartition(topic, p) for p in range(3)], timeout=10)
    probe.close()
    assert sum(max(tp.offset, 0) for tp in committed) == 300  # -1001: nothing to commit


def test_broker_is_kafka_4_in_kraft_mode(kafka_broker: Broker) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    admin = admin_client(bootstrap)
    md = admin.list_topics(timeout=10)
    broker_id = next(iter(md.brokers))
    res = ConfigResource(ResourceType.BROKER, str(broker_id))
    configs = next(iter(admin.describe_configs([res]).values())).result(10)
    assert "broker" in configs["process.roles"].value  # KRaft: no ZooKeeper, roles instead
    assert "controller" in configs["process.roles"].value
    # Removed in 4.0 together with ZooKeeper and the old message formats.
    assert "inter.broker.protocol.version" not in configs
    assert "consumer" in configs["group.coordinator.rebalance.protocols"].value
    logs = kafka_broker.logs()
    if logs:  # an external broker has none to show
        m = re.search(r"Kafka version: (\d+)\.(\d+)", logs)
        assert m is not None, logs[-2000:]
        assert int(m.group(1)) >= 4

    # KIP-848's consumer protocol only works against a 4.x broker.
    topic = f"kip848-{uuid.uuid4().hex[:8]}"
    create_topics(admin, [TopicSpec(topic, partitions=2)])
    _produce(bootstrap, topic, 20)
    assert len(_consume_all(bootstrap, topic, f"g-{topic}", 20, protocol="consumer")) == 20


@pytest.mark.faults
# 25 s: KWORKERS_FULL=1 only (CI budget); CI's kill loops restart the same fixture's broker
@pytest.mark.full_only
def test_broker_restart_keeps_data(fault_broker: Broker) -> None:
    bootstrap = fault_broker.bootstrap_servers
    topic = f"restart-{uuid.uuid4().hex[:8]}"
    create_topics(admin_client(bootstrap), [TopicSpec(topic, partitions=2)])
    _produce(bootstrap, topic, 100)
    fault_broker.restart(hard=True)  # SIGKILL, then start on the same data
    assert fault_broker.bootstrap_servers == bootstrap
    got = _consume_all(bootstrap, topic, f"g-{topic}", 100)
    assert sorted(got) == sorted(f"v{i}".encode() for i in range(100))
    fault_broker.restart(hard=False)  # clean stop, then start
    _produce(bootstrap, topic, 10)
    assert len(_consume_all(bootstrap, topic, f"g2-{topic}", 110)) == 110
