"""The consumer core on a real broker: every record handled, committed only after the work."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import pytest

from kworkers import Message, Worker
from kworkers.testing import Broker
from kworkers.testing.workload import committed_total, make_topic, produce_numbered, unique
from tests.integration.conftest import running, wait_for

pytestmark = pytest.mark.integration



def _worker(bootstrap: str, topic: str, group: str, **kw: object) -> Worker:
    w = Worker(topics=[topic], group_id=group, bootstrap_servers=bootstrap,
               consumer_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
               **kw)  # type: ignore[arg-type]
    w.create_topics()
    return w


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_every_record_handled_once_and_committed(kafka_broker: Broker, kind: str) -> None:
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("basic"), 6), unique("g")
    produce_numbered(bs, topic, 3000)
    seen: Counter[bytes] = Counter()
    lock = threading.Lock()
    w = _worker(bs, topic, group)

    if kind == "sync":
        @w.handler
        def handle(msg: Message) -> None:
            with lock:
                seen[msg.value or b""] += 1
    else:
        @w.handler
        async def handle_async(msg: Message) -> None:
            await asyncio.sleep(0)
            seen[msg.value or b""] += 1

    with running(w):
        wait_for(lambda: sum(seen.values()) >= 3000, 120, "3000 records handled")
    assert len(seen) == 3000
    assert max(seen.values()) == 1
    assert committed_total(bs, group, topic, 6) == 3000


def test_key_lanes_keep_per_key_order(kafka_broker: Broker) -> None:
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("keys"), 1), unique("g")
    produce_numbered(bs, topic, 2000, keys=50)
    order: dict[bytes, list[int]] = {}
    lock = threading.Lock()
    w = _worker(bs, topic, group, ordering="key", concurrency=16)
    concurrent = [0, 0]

    @w.handler
    async def handle(msg: Message) -> None:
        concurrent[0] += 1
        concurrent[1] = max(concurrent[1], concurrent[0])
        await asyncio.sleep(0.002)
        concurrent[0] -= 1
        with lock:
            order.setdefault(msg.key or b"", []).append(int(msg.value or b"0"))

    with running(w):
        wait_for(lambda: sum(len(v) for v in order.values()) >= 2000, 120, "2000 handled")
    for key, values in order.items():
        assert values == sorted(values), f"key {key!r} out of order"
    assert concurrent[1] > 1, "key lanes never ran concurrently on one partition"
    assert committed_total(bs, group, topic, 1) == 2000
