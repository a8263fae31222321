"""Hand-off faults: a retry tier or the DLQ that cannot be written to.

Nothing is committed past a record whose hand-off was not acknowledged; the partition stalls
(and pauses), an alert metric rises, and work resumes, losing nothing, when the fault clears.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from confluent_kafka import Consumer, TopicPartition

from kworkers import Message, NonRetryableError, RetryPolicy, TierLadder, Worker
from kworkers.kafka.producer import KafkaSender
from kworkers.kafka.settings import producer_settings
from kworkers.metrics import MetricsServer
from kworkers.testing import Broker
from kworkers.testing.faults import FaultySender
from kworkers.testing.workload import make_topic, produce_numbered, unique
from tests.faults.support import metric_total
from tests.integration.conftest import running, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def _committed(bs: str, group: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": bs, "group.id": group, "log_level": 3})
    try:
        return int(c.committed([TopicPartition(topic, 0)], timeout=10)[0].offset)
    finally:
        c.close()


@pytest.mark.parametrize(("mode", "dest"), [("error", "dlq"), ("timeout", "retry")])
def test_unacknowledged_hand_off_holds_the_commit(kafka_broker: Broker, mode: str,
                                                   dest: str) -> None:
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique(f"handoff-{mode}"), 1), unique("g")
    total, bad = 400, 100
    produce_numbered(bs, topic, total, keys=1)
    outage = threading.Event()
    outage.set()
    inner = KafkaSender(producer_settings(bs, {}))
    sender = FaultySender(inner, lambda t: outage.is_set() and (
        t.endswith(".dlq") if dest == "dlq" else ".retry." in t), mode=mode)
    w = Worker(topics=[topic], group_id=group, bootstrap_servers=bs, sender=sender,
               retry=RetryPolicy(initial=0.2, max_attempts=3), tiers=TierLadder((0.25, 1.0)),
               max_in_flight_per_partition=50, consume_batch=20)
    w.create_topics()
    sink: Counter[int] = Counter()
    failures: Counter[int] = Counter()

    @w.handler
    def handle(msg: Message) -> None:
        i = int(msg.value or b"-1")
        if i == bad and msg.attempt == 1:
            failures[i] += 1
            if dest == "dlq":
                raise NonRetryableError("Poison", "always bad")
            raise ConnectionError("transient")
        sink[i] += 1

    server = MetricsServer(w.metrics, 0, "127.0.0.1").start()

    def metric(name: str) -> float:  # what an operator's alert reads: /metrics over HTTP
        return metric_total(server.port, name, group=group)

    with running(w):
        wait_for(lambda: sender.failed >= 3, 60, "hand-off failures")

        wait_for(lambda: metric("kworkers_paused_partitions") >= 1, 60,
                 "the stalled partition pauses")
        assert metric("kworkers_handoff_blocked") >= 1  # the alert
        for _ in range(3):  # sample: the commit never passes the unacknowledged record
            assert _committed(bs, group, topic) <= bad
            threading.Event().wait(0.3)
        assert failures[bad] == 1  # the handler is not re-run while the hand-off retries
        outage.clear()
        wait_for(lambda: len(sink) >= total - (1 if dest == "dlq" else 0), 90, "all handled")
        wait_for(lambda: _committed(bs, group, topic) == total, 30, "committed to the end")
    server.close()
    assert max(sink.values()) == 1
    expected = set(range(total)) - ({bad} if dest == "dlq" else set())
    assert set(sink) == expected
    inner.close()
