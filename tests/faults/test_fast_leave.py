"""Fast, clean leave on the real broker: SIGTERM waits for started work only.

Judged from data read back: the append-only ledger (a delivery row when a handler starts, an
effect row committed with the idempotency store's done-mark), the source topic read by a fresh
read_committed consumer, and the group's committed positions.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kworkers.idempotency import SqliteStore
from kworkers.testing import Broker
from kworkers.testing.checker import FaultLog, check, committed, read_log
from kworkers.testing.ledger import Ledger
from kworkers.testing.processes import WorkerProcess
from kworkers.testing.workload import full_size, make_topic, produce_numbered, unique
from tests.integration.conftest import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.faults]
ROOT = str(Path(__file__).resolve().parents[2])


def _worker(name: str, bs: str, topic: str, group: str, tmp: Path,
            *extra: str) -> WorkerProcess:
    args = ["-m", "tests.apps.leave_worker", bs, topic, group, f"sqlite:///{tmp}/store.db",
            *extra]
    return WorkerProcess(args, tmp, name, cwd=ROOT)


def _ledger(tmp: Path) -> Ledger:
    return Ledger.on_store(SqliteStore(tmp / "store.db"))


def test_sigterm_with_a_backlog_finishes_started_records_only(kafka_broker: Broker,
                                                              tmp_path: Path) -> None:
    parts = 6
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("leave"), parts), unique("g")
    total = full_size(30_000, 3000)
    produce_numbered(bs, topic, total)
    a = _worker("a", bs, topic, group, tmp_path, "--slow-ms", "20")
    b = _worker("b", bs, topic, group, tmp_path, "--slow-ms", "1")
    try:
        a.start()
        wait_for(lambda: _ledger(tmp_path).counts()[0] >= 20 * parts, 120, "A at work")
        signalled = time.time()
        assert a.terminate(60) == 0, a.log()[-3000:]
        ledger = _ledger(tmp_path)
        by_a = [d for d in ledger.deliveries() if d.pid == a.pid]
        started_after = [d for d in by_a if d.at > signalled]
        backlog = total - (len(by_a) - len(started_after))
        # Records start until the signal reaches the poll thread (it runs between two polls,
        # each up to 0.1 s) and halts the lanes; the fetched backlog is never worked through:
        # before this fix the drain ran it down for drain_timeout (all of it, here).
        exit_s = time.time() - signalled
        assert len(started_after) < backlog // 10, (len(started_after), backlog)
        b.start()
        wait_for(lambda: len(_ledger(tmp_path).applications()) == total, 180, "B finished")
        assert b.terminate(60) == 0, b.log()[-3000:]
        report = check(_ledger(tmp_path), log=read_log(bs, topic),
                       commits=[committed(bs, group, topic)])
        print(f"fast leave: SIGTERM -> exit {exit_s:.2f}s, started after the signal "
              f"{len(started_after)} of a backlog of {backlog}; {report.summary()}")
        assert report.ok, report.summary()
        # no record whose handler started was started again by the next owner
        assert report.redeliveries == 0, report.summary()
    finally:
        a.close()
        b.close()


def test_a_handler_slower_than_the_bound_is_left_and_absorbed_by_the_receiver(
        kafka_broker: Broker, tmp_path: Path) -> None:
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("leave-bound"), 1), unique("g")
    produce_numbered(bs, topic, 30, keys=1)
    # offset 5 applies its effect, then lingers far longer than the drain bound (2 s)
    a = _worker("a", bs, topic, group, tmp_path, "--drain-timeout", "2", "--linger", "5:120")
    b = _worker("b", bs, topic, group, tmp_path)
    faults = FaultLog(lambda: committed(bs, group, topic))
    try:
        a.start()
        wait_for(lambda: len(_ledger(tmp_path).applications()) >= 6, 120, "offset 5 applied")
        assert a.terminate(60) == 0, a.log()[-3000:]
        # the stop did not wait for offset 5: it committed the finished records before it
        assert committed(bs, group, topic) == {0: 5}
        faults.record("SIGTERM a, offset 5 still running", victim_pid=a.pid)
        b.start()
        wait_for(lambda: len(_ledger(tmp_path).applications()) == 30, 120, "B finished")
        assert b.terminate(60) == 0, b.log()[-3000:]
        ledger = _ledger(tmp_path)
        report = check(ledger, log=read_log(bs, topic), commits=[committed(bs, group, topic)],
                       faults=faults.faults)
        assert report.ok, report.summary()  # the redelivery of 5 is explained by the stop
        at5 = [d for d in ledger.deliveries() if d.offset == 5]
        assert [d.pid for d in at5] == [a.pid, b.pid]  # redelivered to the next owner ...
        assert report.applications == 30 and report.dup == 0  # ... and absorbed: applied once
    finally:
        a.close()
        b.close()
