"""Malformed input never crashes a worker: each record is handled or dead-lettered, none lost.

Hypothesis draws batches of hostile records (garbage Avro, unknown schema ids, null key and
value, huge headers, corrupt kworkers headers on tier topics: attempt not a number, due times
negative or far in the future); a real worker on a real broker must account for every one.
"""

from __future__ import annotations

import threading
import uuid

import pytest
from confluent_kafka import Producer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kworkers import Message, RetryPolicy, TierLadder, Worker
from kworkers.envelope.envelope import ActivityTask, SingleObjectCodec
from kworkers.testing import Broker
from kworkers.testing.workload import make_topic, read_all, unique
from tests.integration.conftest import running, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.faults]

CODEC = SingleObjectCodec()
GOOD = CODEC.encode(ActivityTask("wf", "act", "charge", b"{}"))

values = st.one_of(
    st.none(),
    st.binary(max_size=64),
    st.just(GOOD),
    st.builds(lambda b: GOOD[:10] + b, st.binary(max_size=20)),  # right magic, bad body
    st.builds(lambda b: b"\x00" + b, st.binary(min_size=4, max_size=12)),  # confluent wire
)
garbage = st.one_of(st.just(b"abc"), st.just(b"-1"), st.just(b""), st.just(b"\xff\xfe"),
                    st.just(b"99999999999999999"), st.just(b"-5"), st.binary(max_size=8))
header_sets = st.one_of(
    st.just([]),
    st.lists(st.tuples(st.text(min_size=1, max_size=8), st.binary(max_size=16)), max_size=3),
    st.just([("big", b"x" * 60_000)]),
    st.builds(lambda v: [("kw-attempt", v)], garbage),
    st.builds(lambda v: [("kw-due-at", v)], garbage),
    st.builds(lambda v: [("kw-workflow-id", v)], garbage),
)
records = st.tuples(st.one_of(st.none(), st.binary(max_size=16)), values, header_sets,
                    st.booleans())


# KWORKERS_FULL=1 only (CI budget): CI's hostile-record suite (test_hostile_records.py) feeds
# the same kinds of damage, and more, on the real broker
@pytest.mark.full_only
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=st.lists(records, min_size=10, max_size=40))
def test_hostile_records_are_handled_or_dead_lettered(
    kafka_broker: Broker, batch: list[tuple[bytes | None, bytes | None,
                                            list[tuple[str, bytes]], bool]]
) -> None:
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("fuzz"), 2), unique("g")
    w = Worker(topics=[topic], group_id=group, bootstrap_servers=bs, codec=CODEC,
               retry=RetryPolicy(initial=0.1, max_attempts=2), tiers=TierLadder((0.1,)))
    w.create_topics()
    tier = w.config.tiers.tiers(topic)[0].topic
    handled: set[str] = set()
    lock = threading.Lock()

    @w.handler
    def handle(msg: Message) -> None:
        rid = msg.header_str("fuzz-id")
        with lock:
            handled.add(rid or "?")

    p = Producer({"bootstrap.servers": bs, "log_level": 3, "message.max.bytes": 2_000_000})
    ids = []
    for key, value, headers, to_tier in batch:
        rid = uuid.uuid4().hex
        ids.append(rid)
        p.produce(tier if to_tier else topic, key=key, value=value,
                  headers=[*headers, ("fuzz-id", rid.encode())])
    assert p.flush(30) == 0
    dlq = w.config.tiers.dlq_topic(topic)

    def accounted() -> bool:
        dead = {h.get("fuzz-id", b"").decode() for _k, _v, h in read_all(bs, dlq, 2)}
        return set(ids) <= (handled | dead)

    with running(w):
        wait_for(accounted, 90, "every hostile record handled or dead-lettered")
        assert all(loop.closed.is_set() is False for loop in w.loops)  # no loop crashed
    dead = read_all(bs, dlq, 2)
    for _k, _v, h in dead:
        assert h.get("kw-error-type"), "a dead letter without a reason"
