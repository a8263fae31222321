"""A network partition: one worker in a network namespace of its own loses its link to the broker
for longer than the session timeout, then the link heals.

Worker B runs inside the namespace and reaches the broker through a listener on the host end of
its veth pair (10.213.<n>.1), its only route; worker A runs on the host (loopback). B works
alone until its handlers are held (``--hold``) on the records they were given, so B has work in
flight when the link is cut; A starts, the group expels B after its session, every partition
moves to A, A applies that work; the link heals, then B's held handlers finish: those late
results must be fenced (never committed: the committed positions, sampled throughout, never go
backwards and nothing is skipped), and their effects, through the store's transactional
``apply_once``, are never applied a second time.
0 lost, each effect once, judged by the checker from the log and the ledger.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from kworkers.idempotency import SqliteStore
from kworkers.testing import broker_from_env
from kworkers.testing.broker import free_port
from kworkers.testing.checker import FaultLog, check, committed, read_log
from kworkers.testing.ledger import Ledger
from kworkers.testing.netns import NetnsLink, netns_available
from kworkers.testing.processes import WorkerProcess
from kworkers.testing.workload import make_topic, produce_numbered, unique
from tests.integration.conftest import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.faults]
ROOT = str(Path(__file__).resolve().parents[2])
#: the link stays cut until A has done B's held work, which takes at least this long
SESSION_MS = 3000
PARTS = 4
TOTAL = 2000  # 20 ms each: B still has work when its handlers are held


@pytest.mark.full_only  # 130-140 s: over CI's budget; KWORKERS_FULL=1 runs it (by hand)
@pytest.mark.xfail(strict=True, reason=(
    "a partitioned member keeps running records it had fetched after its partitions moved: "
    "its poll thread is blocked in a synchronous commit to the unreachable coordinator until "
    "the link heals, so it learns of the loss only then, and meanwhile its lanes (released "
    "from the hold) handle queued records the new owner already handled and committed "
    "(checker: unexplained redeliveries, e.g. (2,2)..(3,4); the effects are absorbed by "
    "apply_once and nothing is lost, skipped or committed backwards); needs the poll loop to "
    "stop dispatching when the session is lost, i.e. a commit that cannot block it"))
def test_partitioned_worker_is_fenced_and_nothing_is_lost_or_applied_twice(
        tmp_path: Path) -> None:
    why = netns_available()
    if why is not None:
        pytest.skip(f"network namespaces unavailable here: {why}")
    link = NetnsLink()
    workers: list[WorkerProcess] = []
    broker = None
    sampling = threading.Event()
    try:
        link.create()
        ns_bs = f"{link.host_ip}:{free_port()}"  # B's only way to the broker
        broker = broker_from_env(own=True, listeners={"NETNS": ns_bs})
        broker.start()
        bs = broker.bootstrap_servers
        topic, group = make_topic(bs, unique("netsplit"), PARTS), unique("g")
        produce_numbered(bs, topic, TOTAL)
        store = tmp_path / "store.db"
        ledger = Ledger.on_store(SqliteStore(store))
        hold = tmp_path / "hold"
        common = ["--store", f"sqlite:///{store}", "--effect", "txn", "--slow-ms", "20",
                  "--session-timeout-ms", str(SESSION_MS)]
        a = WorkerProcess(["-m", "tests.apps.ledger_worker", bs, topic, group, *common],
                          tmp_path, "a", cwd=ROOT)
        b = WorkerProcess(["-m", "tests.apps.ledger_worker", ns_bs, topic, group, *common,
                           "--hold", str(hold)], tmp_path, "b", cwd=ROOT)
        b.args = link.command(b.args)  # runs inside the namespace
        workers = [a, b]
        faults = FaultLog(lambda: committed(bs, group, topic))
        samples: list[dict[int, int]] = []

        def sample() -> None:
            while not sampling.wait(0.5):
                samples.append(committed(bs, group, topic))

        b.start()
        wait_for(lambda: ledger.counts()[1] >= 1, 90, "B at work")
        b_pid = b.pid
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        # B's next handlers hold before their effects: work in flight when the link goes
        hold.touch()
        wait_for(lambda: any(tmp_path.glob("hold.*")), 60, "B holding a record")
        link.cut()
        faults.record("link of B cut")
        time.sleep(0.5)  # every lane of B reaches its hold (B cannot commit any more anyway)
        held = sorted(p.name.removeprefix("hold.") for p in tmp_path.glob("hold.*"))
        a.start()  # the group expels B after its session; A gets every partition
        faults.record("worker A joins")

        def a_did_bs_work() -> bool:
            applied = {e.key: e.pid for e in ledger.effects()}
            return all(applied.get(k) not in (None, b_pid) for k in held)

        wait_for(a_did_bs_work, 90, "A applying the work B was holding")
        link.heal()
        faults.record("link of B healed")
        hold.unlink()  # B's late results arrive now
        wait_for(lambda: sum(committed(bs, group, topic).values()) == TOTAL, 120,
                 "everything committed")
        time.sleep(1.0)  # let B's late completions reach its loop before the last samples
        for w in workers:
            assert w.terminate() == 0, w.log()[-3000:]
        sampling.set()
        sampler.join(10)
        final = committed(bs, group, topic)
        report = check(ledger, log=read_log(bs, topic), faults=faults.faults,
                       commits=[*samples, final])
        print(report.summary(), f"held by B at the cut: {held}")
        assert report.ok, report.summary()  # non-monotonic commits, skipped, lost, twice
        assert sum(final.values()) == TOTAL
        # B's partitions moved: A applied every record B was holding when the link was cut,
        # and B's late handlers applied none of them again
        applied_by: dict[str, list[int]] = {}
        for e in ledger.effects():
            applied_by.setdefault(e.key, []).append(e.pid)
        assert held
        for key in held:
            assert len(applied_by[key]) == 1 and applied_by[key] != [b_pid], applied_by[key]
    finally:
        sampling.set()
        for w in workers:
            w.close()
        if broker is not None:
            broker.close()
        link.close()

