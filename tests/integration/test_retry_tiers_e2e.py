"""Retry tiers and the DLQ on a real broker (the issue's 1,000 / 10 poison / 20 transient run)."""

from __future__ import annotations

import struct
import threading
import time
from collections import Counter

import pytest

from kworkers import Message, NonRetryableError, RetryPolicy, TierLadder, Worker
from kworkers.retry_tiers.headers import due_at_of
from kworkers.testing import Broker
from kworkers.testing.workload import make_topic, produce_numbered, read_all, unique
from tests.integration.conftest import running, wait_for

pytestmark = pytest.mark.integration

N, POISON, TRANSIENT = 1000, set(range(5, 1000, 100)), set(range(17, 1000, 50))
MAX_ATTEMPTS = 3


def test_poison_transient_and_healthy_records(kafka_broker: Broker) -> None:
    assert len(POISON) == 10 and len(TRANSIENT) == 20 and not POISON & TRANSIENT
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("orders"), 4), unique("g")
    w = Worker(topics=[topic], group_id=group, bootstrap_servers=bs,
               retry=RetryPolicy(initial=0.3, backoff=2.0, max_interval=1.0,
                                 max_attempts=MAX_ATTEMPTS),
               tiers=TierLadder((0.25, 0.5, 1.0)), jitter_seed=7)
    w.create_topics()
    produce_numbered(bs, topic, N, keys=40)

    lock = threading.Lock()
    calls: Counter[int] = Counter()
    sink: Counter[int] = Counter()
    early: list[tuple[int, float]] = []
    healthy_done = threading.Event()
    healthy = set(range(N)) - POISON - TRANSIENT

    @w.handler
    def handle(msg: Message) -> None:
        i = int(msg.value or b"-1")
        now = time.time()
        due = due_at_of(msg.headers)
        if due is not None and now < due:
            early.append((i, due - now))
        if msg.attempt > 1:
            # A retry may only run after every healthy record was handled: if retries held up
            # the partition, this would never be set (the wait only bounds a hang).
            assert healthy_done.wait(60), "healthy records were held up behind retries"
        with lock:
            calls[i] += 1
            n = calls[i]
        if i in POISON:
            raise RuntimeError(f"poison {i}")
        if i in TRANSIENT and n <= 2:
            raise ConnectionError(f"transient {i}, attempt {n}")
        with lock:
            sink[i] += 1
            if healthy <= sink.keys():
                healthy_done.set()

    with running(w):
        wait_for(lambda: len(sink) >= N - len(POISON), 120, "990 records in the sink")
        dlq = w.config.tiers.dlq_topic(topic)
        wait_for(lambda: len(read_all(bs, dlq, 5)) >= len(POISON), 60, "10 dead letters")

    assert set(sink) == set(range(N)) - POISON
    assert max(sink.values()) == 1, "an effect was applied twice"
    assert all(calls[i] == MAX_ATTEMPTS for i in POISON)
    assert all(calls[i] == 3 for i in TRANSIENT)
    assert early == [], f"retries ran before their due time: {early[:5]}"

    dead = read_all(bs, w.config.tiers.dlq_topic(topic), 5)
    assert len(dead) == len(POISON)
    by_value = {int(v or b"-1"): (k, h) for k, v, h in dead}
    assert set(by_value) == POISON
    for i, (key, h) in by_value.items():
        assert key == f"k{i % 40}".encode()  # keyed like the original
        assert h["kw-original-topic"] == topic.encode()
        assert h["kw-attempt"] == str(MAX_ATTEMPTS).encode()  # attempts made
        assert h["kw-error-type"] == b"RuntimeError"
        assert h["kw-error-message"] == f"poison {i}".encode()
        assert h["kw-group"] == group.encode()
        assert int(h["kw-first-failure-at"]) <= int(h["kw-last-failure-at"])
        assert h["kafka_dlt-original-topic"] == topic.encode()
        assert struct.unpack(">i", h["kafka_dlt-original-partition"])[0] == int(
            h["kw-original-partition"])
        assert struct.unpack(">q", h["kafka_dlt-original-offset"])[0] == int(
            h["kw-original-offset"])


def test_non_retryable_goes_to_dlq_after_one_attempt(kafka_broker: Broker) -> None:
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("bad"), 2), unique("g")
    w = Worker(topics=[topic], group_id=group, bootstrap_servers=bs,
               retry=RetryPolicy(initial=0.2, max_attempts=5, non_retryable=("BadSpec",)),
               tiers=TierLadder((0.25, 1.0)))
    w.create_topics()
    produce_numbered(bs, topic, 20)
    calls: Counter[int] = Counter()

    @w.handler
    def handle(msg: Message) -> None:
        i = int(msg.value or b"-1")
        calls[i] += 1
        if i == 3:
            raise NonRetryableError("Malformed", "field x missing")
        if i == 4:
            try:
                raise KeyError("x")
            except KeyError as err:
                raise ValueError("wrapped") from NonRetryableError("Deep", "inside").with_traceback(
                    err.__traceback__)
        if i == 5:
            from kworkers import RetryableError

            raise RetryableError("BadSpec", "listed in the policy")

    with running(w):
        dlq = w.config.tiers.dlq_topic(topic)
        wait_for(lambda: len(read_all(bs, dlq, 5)) >= 3, 60, "3 dead letters")
    assert calls[3] == calls[4] == calls[5] == 1
    dead = {int(v or b"-1"): h for _k, v, h in read_all(bs, dlq, 5)}
    assert dead[3]["kw-error-type"] == b"Malformed"
    assert dead[4]["kw-error-type"] == b"Deep"
    assert dead[5]["kw-error-type"] == b"BadSpec"
    assert all(h["kw-dlq-reason"] == b"non_retryable" for h in dead.values())
