"""Share mode on the real broker: more worker processes than partitions, tiers and the DLQ.

Judged from data read back: the append-only ledger in the store's database (deliveries with the
pid of the process that got them, effects applied in the store's transaction), the delivery
counts each handler saw (a second ledger), the DLQ and tier topics read from their start, and
the group config read back with the admin client.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._resource import ResourceType

from kworkers import Message, Worker
from kworkers.idempotency import SqliteStore
from kworkers.share.backlog import BacklogReporter
from kworkers.testing import Broker
from kworkers.testing.checker import check, read_log
from kworkers.testing.ledger import Ledger
from kworkers.testing.processes import WorkerProcess
from kworkers.testing.workload import (
    full_size,
    make_topic,
    produce_numbered,
    produce_steady,
    unique,
)
from tests.integration.conftest import running, wait_for

pytestmark = pytest.mark.integration
ROOT = str(Path(__file__).resolve().parents[2])
FLAKY, POISON = 10, 37


def _group_config(bs: str, group: str, name: str) -> str:
    admin = AdminClient({"bootstrap.servers": bs, "log_level": 3})
    res = ConfigResource(ResourceType.GROUP, group)
    return str(admin.describe_configs([res])[res].result(15)[name].value)


def test_more_workers_than_partitions_share_the_work_tiers_and_dlq_included(
        kafka_broker: Broker, tmp_path: Path) -> None:
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("share"), 2), unique("g")
    total = full_size(20_000, 1500)
    store = SqliteStore(tmp_path / "store.db")
    ledger = Ledger.on_store(store)
    counts = Ledger(tmp_path / "dc.db", table="share_dc")
    args = ["-m", "tests.apps.share_worker", bs, topic, group, "--store",
            f"sqlite:///{tmp_path}/store.db", "--dc-ledger", str(tmp_path / "dc.db"),
            "--slow-ms", "5", "--flaky-every", str(FLAKY), "--poison-every", str(POISON)]
    workers = [WorkerProcess(args, tmp_path, f"w{i}", cwd=ROOT) for i in range(3)]
    poison = {str(i) for i in range(total) if i % POISON == 0}
    try:
        for w in workers:
            w.start()
        # steady production: many small batches, so every member gets records to acquire
        produce_steady(bs, topic, total, 400)
        wait_for(lambda: ledger.counts()[1] >= total - len(poison), 180, "all effects")
        time.sleep(1.0)  # nothing more may arrive
        for w in workers:
            assert w.terminate() == 0, w.log()[-3000:]
        # 3 processes on 2 partitions, each did a share of the work
        by_pid = Counter(d.pid for d in ledger.deliveries())
        assert len(by_pid) == 3, by_pid
        report = check(ledger, log=read_log(bs, topic),
                       expected={str(i) for i in range(total)} - poison)
        print(report.summary(), dict(by_pid))
        assert report.ok, report.summary()
        # no fault happened, so no record was delivered twice by the share group
        assert {e.note for e in counts.effects() if e.topic == topic} == {"1"}
        dlq = read_log(bs, f"{topic}.dlq")
        assert sorted((r.value or b"").decode() for r in dlq) == sorted(poison)
        assert {dict(r.headers)["kw-error-type"] for r in dlq} == {b"Poison"}
        assert {dict(r.headers)["kw-original-topic"] for r in dlq} == {topic.encode()}
        flaky = {str(i) for i in range(total) if i % FLAKY == 0} - poison
        tier = read_log(bs, f"{topic}.retry.250ms")
        assert {(r.value or b"").decode() for r in tier} == flaky
        assert _group_config(bs, group, "share.auto.offset.reset") == "earliest"
    finally:
        for w in workers:
            w.close()


def test_records_before_the_first_member_are_handled_and_the_backlog_is_reported(
        kafka_broker: Broker) -> None:
    """A new share group starts at the latest offset unless told otherwise; the worker sets
    ``share.auto.offset.reset=earliest`` first, so records produced before it joined count."""
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("early"), 1), unique("g")
    produce_numbered(bs, topic, 50)
    seen: list[int] = []
    lock = threading.Lock()
    w = Worker(topic, group, bs, mode="share")

    @w.handler
    def handle(msg: Message) -> None:
        with lock:
            seen.append(int(msg.value or b"-1"))

    w.create_topics()
    with running(w):
        wait_for(lambda: len(seen) >= 50, 60, "records produced before the group existed")
        loop = w.loops[0]
        reporter = BacklogReporter(loop.consumer, {(topic, 0): 20},  # type: ignore[union-attr]
                                   w.metrics.share_backlog, group)
        assert reporter.report_once() == {(topic, 0): 30}  # log end 50, acquired up to 20
    assert sorted(seen) == list(range(50))
