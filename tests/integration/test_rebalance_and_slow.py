"""Rebalancing (cooperative and KIP-848), slow handlers and per-message deadlines."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from kworkers import Message, RetryPolicy, TierLadder, Worker
from kworkers.testing import Broker
from kworkers.testing.workload import (
    committed_total,
    make_topic,
    produce_numbered,
    produce_steady,
    unique,
)
from tests.integration.conftest import running, wait_for

pytestmark = pytest.mark.integration


def _tps(history: list[tuple[str, list[tuple[str, int]]]], kind: str,
         topic: str) -> set[tuple[str, int]]:
    return {tp for k, tps in history for tp in tps if k == kind and tp[0] == topic}


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_member_joins_and_leaves_without_revoking_what_stays(
    kafka_broker: Broker, protocol: str
) -> None:
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("rebal"), 6), unique("g")
    total = 6000
    lock = threading.Lock()
    seen: Counter[bytes] = Counter()
    extra = ({"session.timeout.ms": 6000, "heartbeat.interval.ms": 300}
             if protocol == "classic" else {})

    def make() -> Worker:
        w = Worker(topics=[topic], group_id=group, bootstrap_servers=bs,
                   group_protocol=protocol, consumer_config=extra)  # type: ignore[arg-type]

        @w.handler
        def handle(msg: Message) -> None:
            time.sleep(0.0005)
            with lock:
                seen[msg.value or b""] += 1
        return w

    a = make()
    a.create_topics()
    producer = threading.Thread(target=produce_steady, args=(bs, topic, total, 400),
                                daemon=True)
    with running(a):
        wait_for(lambda: len(_tps(a.loops[0].history, "assign", topic)) == 6, 60, "A owns all")
        producer.start()
        wait_for(lambda: len(seen) > 500, 60, "progress")
        b = make()
        with running(b):
            wait_for(lambda: bool(_tps(b.loops[0].history, "assign", topic)), 60, "B assigned")
            # A keeps processing what it kept while B works on what moved
            mark = len(seen)
            wait_for(lambda: len(seen) > mark + 200, 60, "progress with two members")
            revoked_from_a = _tps(a.loops[0].history, "revoke", topic)
            moved_to_b = _tps(b.loops[0].history, "assign", topic)
            assert revoked_from_a == moved_to_b, (a.loops[0].history, b.loops[0].history)
            assert 0 < len(moved_to_b) < 6
        # B left: its partitions come back to A; A never lost the ones it kept
        wait_for(lambda: len(seen) >= total, 120, "every record handled")
        producer.join(60)
        kept = {(topic, p) for p in range(6)} - moved_to_b
        assert not (kept & _tps(a.loops[0].history, "revoke", topic))
        assert not _tps(a.loops[0].history, "lost", topic)
    assert len(seen) == total
    assert max(seen.values()) == 1, "a clean rebalance redelivered records"
    assert committed_total(bs, group, topic, 6) == total


def test_handler_slower_than_max_poll_interval_causes_no_rebalance(kafka_broker: Broker) -> None:
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("slow"), 2), unique("g")
    produce_numbered(bs, topic, 6)
    calls: Counter[bytes] = Counter()
    w = Worker(topics=[topic], group_id=group, bootstrap_servers=bs,
               consumer_config={"session.timeout.ms": 2000, "heartbeat.interval.ms": 300,
                                "max.poll.interval.ms": 3000})
    w.create_topics()

    @w.handler
    def handle(msg: Message) -> None:
        calls[msg.value or b""] += 1
        if msg.value == b"0":
            time.sleep(9.0)  # three times max.poll.interval.ms

    with running(w):
        wait_for(lambda: len(calls) == 6 and sum(calls.values()) >= 6, 60, "all handled")
        wait_for(lambda: committed_total(bs, group, topic, 2) == 6, 30, "committed")
    main = w.loops[0]
    assert [k for k, _ in main.history].count("revoke") <= 1  # only the final clean leave
    assert not [k for k, _ in main.history if k == "lost"]
    assert [k for k, _ in main.history].count("assign") == 1
    assert max(calls.values()) == 1, "the slow record was delivered again"


def test_message_deadline_routes_a_timeout_and_the_lane_moves_on(kafka_broker: Broker) -> None:
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("deadline"), 1), unique("g")
    produce_numbered(bs, topic, 3, keys=1)
    next_done = threading.Event()
    attempts: list[tuple[bytes, int]] = []
    late: list[bytes] = []
    w = Worker(topics=[topic], group_id=group, bootstrap_servers=bs, message_timeout=0.5,
               retry=RetryPolicy(initial=0.2, max_attempts=3), tiers=TierLadder((0.25,)))
    w.create_topics()

    @w.handler
    def handle(msg: Message) -> None:
        attempts.append((msg.value or b"", msg.attempt))
        if msg.value == b"0" and msg.attempt == 1:
            # Stuck until the record behind it ran: only possible if the lane moved on.
            next_done.wait(30)
            late.append(msg.value)
            return
        if msg.value == b"1":
            next_done.set()

    with running(w):
        wait_for(lambda: (b"0", 2) in attempts and len(late) == 1, 60, "retry and late result")
        wait_for(lambda: committed_total(bs, group, topic, 1) == 3, 30, "committed")
    assert next_done.is_set()
    assert (b"0", 2) in attempts  # the timed-out attempt was retried as attempt 2
    assert w.metrics.retries.labels(group, "250ms")._value.get() == 1
