"""Share mode on the real broker: more worker processes than partitions, tiers and the DLQ, the
group's start position, and the backlog gauge each process exports.

Judged from data read back: the append-only ledger in the store's database (deliveries with the
pid of the process that got them, partition and offset; effects applied in the store's
transaction), the delivery counts each handler saw (a second ledger), the source, DLQ and tier
topics read from their start, the group config read back with the admin client, and each
process's ``/metrics`` scraped over HTTP.
"""

from __future__ import annotations

import re
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._resource import ResourceType
from prometheus_client.parser import text_string_to_metric_families

from kworkers.idempotency import SqliteStore
from kworkers.keda import BacklogSample, share_backlog
from kworkers.testing import Broker
from kworkers.testing.checker import Log, check, read_log
from kworkers.testing.ledger import Ledger
from kworkers.testing.processes import WorkerProcess
from kworkers.testing.workload import (
    full_size,
    make_topic,
    produce_numbered,
    produce_steady,
    unique,
)
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.integration
ROOT = str(Path(__file__).resolve().parents[2])
FLAKY, POISON = 10, 37
#: records produced before any member exists (a new share group starts at the latest offset
#: unless the worker sets share.auto.offset.reset=earliest first)
EARLY = 50


def _group_config(bs: str, group: str, name: str) -> str:
    admin = AdminClient({"bootstrap.servers": bs, "log_level": 3})
    res = ConfigResource(ResourceType.GROUP, group)
    return str(admin.describe_configs([res])[res].result(15)[name].value)


def _scrape(w: WorkerProcess, group: str) -> list[BacklogSample]:
    """The ``kworkers_share_backlog`` samples of one process, read from its ``/metrics``."""
    port = re.findall(r"metrics port (\d+)", w.log())[-1]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return [BacklogSample(w.log_path.stem, s.labels["topic"], int(s.labels["partition"]),
                          int(s.value))
            for fam in text_string_to_metric_families(text)
            if fam.name == "kworkers_share_backlog"
            for s in fam.samples if s.labels.get("group") == group]


def _expected_backlog(ledger: Ledger, log: Log, pids: dict[str, int]) -> set[BacklogSample]:
    """What each process must report once all is handled, from data read back: per partition
    it received records from (the ledger), the log end minus one past the highest offset it
    received. In a run without faults a process runs every record it acquires, so what it
    received is what it acquired."""
    top: dict[tuple[int, str, int], int] = {}
    for d in ledger.deliveries():
        if d.topic == log.topic:
            k = (d.pid, d.topic, d.partition)
            top[k] = max(top.get(k, -1), d.offset)
    name = {pid: n for n, pid in pids.items()}
    return {BacklogSample(name[pid], t, p, log.bounds[p][1] - (off + 1))
            for (pid, t, p), off in top.items()}


def test_more_workers_than_partitions_share_the_work_tiers_and_dlq_included(
        kafka_broker: Broker, tmp_path: Path) -> None:
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("share"), 2), unique("g")
    total = full_size(20_000, 1000)
    produce_numbered(bs, topic, EARLY, start=total)  # before the group exists
    keys = range(total + EARLY)
    store = SqliteStore(tmp_path / "store.db")
    ledger = Ledger.on_store(store)
    counts = Ledger(tmp_path / "dc.db", table="share_dc")
    args = ["-m", "tests.apps.share_worker", bs, topic, group, "--store",
            f"sqlite:///{tmp_path}/store.db", "--dc-ledger", str(tmp_path / "dc.db"),
            "--slow-ms", "5", "--flaky-every", str(FLAKY), "--poison-every", str(POISON),
            "--metrics"]
    workers = [WorkerProcess(args, tmp_path, f"w{i}", cwd=ROOT) for i in range(3)]
    poison = {str(i) for i in keys if i % POISON == 0}
    try:
        for w in workers:
            w.start()
        # steady production: many small batches, so every member gets records to acquire
        produce_steady(bs, topic, total, 400)
        wait_for(lambda: ledger.counts()[1] >= len(keys) - len(poison), 180, "all effects")
        pids = {w.log_path.stem: w.pid for w in workers if w.pid is not None}
        # 3 processes on 2 partitions: each received records (counted from the ledger)
        by_pid = Counter(d.pid for d in ledger.deliveries() if d.topic == topic)
        assert set(by_pid) == set(pids.values()), (by_pid, pids)
        log = read_log(bs, topic)
        # the backlog gauge each process exports, against the ledger and the log ends: the
        # reporter refreshes every 5 s, so wait (a bound, not a threshold) for its last round
        want = _expected_backlog(ledger, log, pids)
        got: set[BacklogSample] = set()

        def exported() -> bool:
            got.clear()
            got.update(s for w in workers for s in _scrape(w, group))
            return got == want
        wait_for(exported, 30, "each process's backlog gauge to match the ledger")
        assert any(s.backlog > 0 for s in want), want  # a check a constant 0 would fail
        assert share_backlog(got) == 0  # the scaling query: nothing left to acquire
        for w in workers:
            assert w.terminate() == 0, w.log()[-3000:]
        report = check(ledger, log=log, expected={str(i) for i in keys} - poison)
        print(report.summary(), dict(by_pid), got)
        assert report.ok, report.summary()
        # no fault happened, so no record was delivered twice by the share group
        assert {e.note for e in counts.effects() if e.topic == topic} == {"1"}
        dlq = read_log(bs, f"{topic}.dlq")
        assert sorted((r.value or b"").decode() for r in dlq) == sorted(poison)
        assert {dict(r.headers)["kw-error-type"] for r in dlq} == {b"Poison"}
        assert {dict(r.headers)["kw-original-topic"] for r in dlq} == {topic.encode()}
        flaky = {str(i) for i in keys if i % FLAKY == 0} - poison
        tier = read_log(bs, f"{topic}.retry.250ms")
        assert {(r.value or b"").decode() for r in tier} == flaky
        # the records produced before the first member were handled (the checker's expected
        # set holds them) because the worker set the group's start first
        assert _group_config(bs, group, "share.auto.offset.reset") == "earliest"
    finally:
        for w in workers:
            w.close()
