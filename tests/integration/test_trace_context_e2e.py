"""One record's W3C trace id followed across every hop: source, retry tier, DLQ, redrive."""

from __future__ import annotations

import threading

import pytest

from kworkers import Message, RetryPolicy, TierLadder, Worker
from kworkers.dlq.redrive import redrive
from kworkers.testing import Broker
from kworkers.testing.workload import make_topic, produce, read_all, unique
from tests.integration.conftest import running, wait_for

pytestmark = pytest.mark.integration

TRACEPARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_trace_id_survives_tier_dlq_and_redrive(kafka_broker: Broker) -> None:
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("trace"), 1), unique("g")
    w = Worker(topics=[topic], group_id=group, bootstrap_servers=bs,
               retry=RetryPolicy(initial=0.2, max_attempts=2), tiers=TierLadder((0.25,)))
    w.create_topics()
    seen: list[tuple[str, int, bytes | None]] = []
    healed = threading.Event()

    @w.handler
    def handle(msg: Message) -> None:
        seen.append((msg.topic, msg.attempt, msg.header("traceparent")))
        if not healed.is_set():
            raise ConnectionError("downstream is down")

    produce(bs, topic, [(b"k", b"v")], headers=[("traceparent", TRACEPARENT)])
    dlq = w.config.tiers.dlq_topic(topic)
    with running(w):
        wait_for(lambda: len(read_all(bs, dlq, 3)) == 1, 60, "the dead letter")
        healed.set()
        summary = redrive(bs, dlq)
        assert summary.redriven == 1
        wait_for(lambda: len(seen) == 3, 60, "the redriven attempt")
    (dead,) = read_all(bs, dlq, 3)
    assert dead[2]["traceparent"] == TRACEPARENT
    tier = w.config.tiers.tiers(topic)[0].topic
    assert [(t, a) for t, a, _ in seen] == [(topic, 1), (tier, 2), (topic, 1)]
    assert {tp for _, _, tp in seen} == {TRACEPARENT}  # one trace id on every hop
