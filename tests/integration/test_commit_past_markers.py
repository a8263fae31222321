"""Transaction markers leave no lag (#28 item 2): after a redrive, and after any transactional
producer (committed and aborted transactions, on a source and on a retry tier), the worker's
groups commit up to the log end, so KEDA can scale the pool to zero. The same for a worker
with ``guarantee="exactly_once"`` (its commits, hand-offs and outputs are transactions too)
and for a plain group reading its outputs.

Read back from the broker: each group's committed offsets against the partitions' high
watermarks (which count the markers), and the handler's own record of what it ran.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from kworkers import Message, NonRetryableError, RetryPolicy, TierLadder, Worker, activity
from kworkers.clock import SystemClock
from kworkers.consumer.transactional import TransactionalCommitter
from kworkers.retry_tiers.policy import no_jitter
from kworkers.retry_tiers.router import FailureRouter
from kworkers.testing import Broker
from kworkers.testing.workload import (
    committed_total,
    end_offsets_total,
    make_topic,
    produce,
    read_all,
    unique,
)
from tests.integration.conftest import running, wait_for
from tests.integration.test_cli_support import cli

pytestmark = pytest.mark.integration


def _transaction(bs: str,
                 records: list[tuple[str, int, bytes, list[tuple[str, str | bytes | None]]]],
                 commit: bool) -> None:
    p = Producer({"bootstrap.servers": bs, "transactional.id": unique("tx")})
    p.init_transactions(30)
    p.begin_transaction()
    for topic, partition, value, headers in records:
        p.produce(topic, value=value, partition=partition, headers=headers)
    if commit:
        p.commit_transaction(30)
    else:
        p.abort_transaction(30)


def test_markers_after_a_redrive_and_transactional_producers_leave_no_lag(
        kafka_broker: Broker) -> None:
    _markers_leave_no_lag(kafka_broker.bootstrap_servers, "at_least_once")


def test_an_exactly_once_worker_and_the_readers_of_its_outputs_leave_no_lag(
        kafka_broker: Broker) -> None:
    """Every commit of this worker is a transaction (its markers follow its own outputs,
    hand-offs and dead letters); the source, the tier and the output topic all end at their
    high watermarks."""
    _markers_leave_no_lag(kafka_broker.bootstrap_servers, "exactly_once")


def test_canary_a_transactional_committer_that_stops_at_the_last_record_leaves_lag(
        kafka_broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above fails on a committer that commits "last record + 1" (the bug): the
    main group stays at the source's last records, short of the markers after them."""
    monkeypatch.setattr(TransactionalCommitter, "advance_past_markers", lambda self, t: 0)
    with pytest.raises(AssertionError, match="main group committed"):
        _markers_leave_no_lag(kafka_broker.bootstrap_servers, "exactly_once", broken=True)


def _records_end(bs: str, topic: str, partitions: int) -> int:
    """Each partition's last record + 1, summed (what a committer blind to markers commits):
    read with read_committed from the start until the position passes the high watermark."""
    c = Consumer({"bootstrap.servers": bs, "group.id": unique("ends"), "log_level": 3,
                  "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        tps = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]
        highs = {tp.partition: c.get_watermark_offsets(tp, timeout=10)[1] for tp in tps}
        c.assign(tps)
        last = dict.fromkeys(highs, 0)
        while any(tp.offset < highs[tp.partition] for tp in c.position(tps)):
            for m in c.consume(500, 0.5):
                part, offset = m.partition(), m.offset()
                if m.error() is None and part is not None and offset is not None:
                    last[part] = max(last[part], offset + 1)
        return sum(last.values())
    finally:
        c.close()


def _markers_leave_no_lag(bs: str, guarantee: str, broken: bool = False) -> None:
    topic = make_topic(bs, unique("markers"), 2)
    out = make_topic(bs, f"{topic}.out", 2)
    group = unique("g")
    worker = Worker(topics=[topic], group_id=group, bootstrap_servers=bs, guarantee=guarantee,
                    retry=RetryPolicy(initial=0.2, max_attempts=3), tiers=TierLadder((0.25,)))
    ran: Counter[bytes] = Counter()

    @worker.handler
    def handle(msg: Message) -> None:
        value = msg.value or b""
        ran[value] += 1
        if value.startswith(b"bad") and msg.header("kw-redrive-of") is None:
            raise NonRetryableError("Rejected", "until redriven")
        if value.startswith(b"flaky") and msg.attempt == 1:
            raise RuntimeError("once")
        activity.produce(out, value)

    # a plain group reading the outputs (a transactional producer's, under exactly once)
    reader = Worker(topics=[out], group_id=f"{group}.reader", bootstrap_servers=bs)
    read: Counter[bytes] = Counter()

    @reader.handler
    def read_output(msg: Message) -> None:
        read[msg.value or b""] += 1

    tier = worker.config.tiers.tiers(topic)[0].topic
    worker.create_topics()
    produce(bs, topic, [(None, b"ok-0"), (None, b"bad-0"), (None, b"bad-1"), (None, b"flaky-0"),
                        (None, b"ok-1")])
    # a retry written by a transactional producer (well formed: this group's, due now)
    plan = FailureRouter(worker.config.retry, worker.config.tiers, group, no_jitter,
                         SystemClock()).plan(Message(topic, 0, 0, None, b"tx-retry"),
                                             RuntimeError("x"))
    assert plan.topic == tier
    _transaction(bs, [(tier, 0, b"tx-retry", list(plan.headers))], commit=True)
    _transaction(bs, [(topic, 0, b"tx-0", []), (topic, 1, b"tx-1", [])], commit=True)
    _transaction(bs, [(topic, 0, b"aborted", []), (tier, 1, b"aborted", [])], commit=False)
    dlq = f"{topic}.dlq"

    def caught_up() -> bool:
        return (committed_total(bs, group, topic, 2) == end_offsets_total(bs, topic, 2)
                and committed_total(bs, f"{group}.retry", tier, 2)
                == end_offsets_total(bs, tier, 2)
                and committed_total(bs, f"{group}.reader", out, 2)
                == end_offsets_total(bs, out, 2))

    handled = [b"ok-0", b"ok-1", b"flaky-0", b"tx-retry", b"tx-0", b"tx-1", b"bad-0", b"bad-1"]
    with running(worker), running(reader):
        # dead letters counted as records (an exactly-once worker writes them in transactions,
        # whose markers count in the log end)
        wait_for(lambda: ran[b"tx-retry"] and ran[b"flaky-0"] == 2 and ran[b"tx-1"]
                 and len(read_all(bs, dlq, 5)) == 2, 60, "the first round")
        redrive = cli("dlq", "redrive", "-b", bs, "--dlq", dlq)
        assert redrive.returncode == 0, redrive.stderr
        wait_for(lambda: ran[b"bad-0"] == 2 and ran[b"bad-1"] == 2, 60, "the replays")
        wait_for(lambda: all(read[v] for v in handled), 60, "the outputs read")
        if broken:  # the broken committer's end state, certain once reached
            ends = _records_end(bs, topic, 2)
            wait_for(lambda: committed_total(bs, group, topic, 2) == ends, 60,
                     "the main group at the last records")
        # committed offsets follow within the commit interval once nothing is in flight;
        # the bound only ends a hung test
        deadline = time.monotonic() + 30
        while not broken and not caught_up() and time.monotonic() < deadline:
            time.sleep(0.2)
        main = (committed_total(bs, group, topic, 2), end_offsets_total(bs, topic, 2))
        retry = (committed_total(bs, f"{group}.retry", tier, 2), end_offsets_total(bs, tier, 2))
        outs = (committed_total(bs, f"{group}.reader", out, 2), end_offsets_total(bs, out, 2))
    assert ran[b"aborted"] == 0  # read_committed: the aborted transaction never ran
    assert sorted(read) == sorted(handled), read  # each handled record's output, once
    assert set(read.values()) == {1}, read
    assert main[0] == main[1], f"main group committed {main[0]} of {main[1]}"
    assert retry[0] == retry[1], f"retry group committed {retry[0]} of {retry[1]}"
    assert outs[0] == outs[1], f"the outputs' reader committed {outs[0]} of {outs[1]}"
    # the log ends count markers: 5 + 2 records + 1 aborted + 2 replays, and at least a
    # marker per transaction on the partitions it touched
    assert main[1] > 5 + 2 + 1 + 2
