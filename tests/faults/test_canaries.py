"""Canaries: deliberately broken workers, each killed at a certain point, and the checker
reporting each failure. A check that cannot fail proves nothing; these show that it does fail.

Every scenario runs one worker process on a 1-partition topic of 20 activities (idempotency
keys ``o-0/a`` .. ``o-19/a``), with a kill point that fires exactly once: the worker SIGKILLs
itself when activity 7 reaches the chosen step, is restarted, and finishes. The scenarios run
side by side (one process each) to keep CI short; each is then judged on its own:

- commit before effect (the effect runs on a thread after the handler returned), killed once
  the offset of 7 is committed and before its effect: the checker reports 7 ``missing``;
- a store whose claim always says ACQUIRED (lease mode), killed after key 7 is done and before
  its offset is committed: the redelivery applies it again, ``duplicates`` reports 7 twice;
- the lease mode's limit (the effect outside the store's transaction), killed after 7's effect
  and before ``complete``: the takeover after the lease expires applies it again,
  ``duplicates`` is exactly ``{7: 2}`` (documented in docs/RELIABILITY.md);
- controls, with the same kill points and nothing broken: the honest claim (killed after
  ``complete``) and the transactional form (killed inside ``apply_once``'s transaction) are
  ok, and 7 is delivered twice but applied once;
- on Redis, the bound the Redis kill loop puts on duplicates (``beyond_the_lease_limit``: a
  key twice only where a kill landed between its effect and ``complete``): a claim that
  always says ACQUIRED, killed after ``complete``, breaks it; the lease mode's own limit,
  killed after the effect, stays within it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kworkers.idempotency import SqliteStore
from kworkers.testing import Broker
from kworkers.testing.checker import CommitSampler, FaultLog, Report, check, read_log
from kworkers.testing.ledger import Ledger
from kworkers.testing.processes import WorkerProcess, keep_alive
from kworkers.testing.workload import make_topic, produce_activities, unique
from tests.apps.ledger_worker import COMPLETES
from tests.faults.support import (
    beyond_the_lease_limit,
    killed_between_effect_and_complete,
    store_url,
)

pytestmark = [pytest.mark.integration, pytest.mark.faults]
ROOT = str(Path(__file__).resolve().parents[2])
N = 20
KEY = "o-7/a"


@dataclass
class Scenario:
    name: str
    args: list[str]
    step: str
    store: str = "sqlite"
    dir: Path = field(default=Path())
    topic: str = ""
    group: str = ""
    prefix: str = "o"
    worker: WorkerProcess | None = None
    faults: FaultLog | None = None
    commits: CommitSampler | None = None

    @property
    def key(self) -> str:
        """The activity the kill point stops at (a prefix of its own on a shared store)."""
        return f"{self.prefix}-7/a"

    def ledger(self) -> Ledger:
        if "txn" in self.args:
            return Ledger.on_store(SqliteStore(self.dir / "store.db"))
        return Ledger(self.dir / "ledger.db")

    def start(self, bs: str, tmp: Path) -> None:
        self.dir = tmp / self.name
        (self.dir / "markers").mkdir(parents=True)
        self.topic, self.group = make_topic(bs, unique(self.name), 1), unique("g")
        if self.store != "sqlite":  # a server shared between runs: keys of this run's own
            self.prefix = unique("o")
        produce_activities(bs, self.topic, N, self.prefix, "a")
        args = ["-m", "tests.apps.ledger_worker", bs, self.topic, self.group,
                "--ledger", str(self.dir / "ledger.db"),
                "--store", store_url(self.store, self.dir),
                "--kill", f"{self.key}@{self.step}", "--markers", str(self.dir / "markers"),
                "--session-timeout-ms", "3000", "--lease-s", "2", *self.args]
        self.worker = WorkerProcess(args, self.dir, "worker", cwd=ROOT)
        self.commits = CommitSampler(bs, self.group, self.topic).start()
        self.faults = FaultLog(self.commits.latest)

    def settled(self, bs: str) -> bool:
        """The kill fired, the restarted worker committed the whole topic."""
        assert self.worker is not None and self.faults is not None and self.commits
        keep_alive([self.worker], self.faults)()
        return bool(self.faults.faults) and self.commits.sample().positions == {0: N}

    def judge(self, bs: str) -> Report:
        assert self.worker is not None and self.faults is not None and self.commits
        assert self.worker.terminate() == 0, self.worker.log()[-3000:]
        return check(self.ledger(), log=read_log(bs, self.topic), commits=self.commits.stop(),
                     faults=self.faults.faults)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
        if self.commits is not None:
            self.commits.stop(final=False)


SCENARIOS = [
    Scenario("commit-before-effect", ["--effect", "fire-and-forget"], "after-commit"),
    Scenario("claim-always-acquired", ["--effect", "lease", "--broken-claim"], "after-complete"),
    Scenario("lease-limit", ["--effect", "lease"], "after-effect"),
    Scenario("control-claim", ["--effect", "lease"], "after-complete"),
    Scenario("control-txn", ["--effect", "txn"], "after-effect"),
    # the Redis kill loop's bound on duplicates (beyond_the_lease_limit), shown failing on a
    # Redis claim that never deduplicates, and holding for the lease mode's own limit
    Scenario("redis-claim-always-acquired", ["--effect", "lease", "--broken-claim",
                                             "--complete-marks"], "after-complete",
             store="redis"),
    Scenario("redis-lease-limit", ["--effect", "lease", "--complete-marks"], "after-effect",
             store="redis"),
]


def test_canaries_are_reported_and_controls_pass(kafka_broker: Broker, tmp_path: Path) -> None:
    bs = kafka_broker.bootstrap_servers
    for s in SCENARIOS:
        s.start(bs, tmp_path)
    try:
        deadline = time.monotonic() + 180  # bounds a hang only
        waiting = list(SCENARIOS)
        while waiting:
            assert time.monotonic() < deadline, f"not settled: {[s.name for s in waiting]}"
            waiting = [s for s in waiting if not s.settled(bs)]
            time.sleep(0.2)
        reports = {s.name: s.judge(bs) for s in SCENARIOS}
    finally:
        for s in SCENARIOS:
            s.close()
    for name, r in reports.items():
        print(f"{name}: {r.summary()}")

    loss = reports["commit-before-effect"]
    assert KEY in loss.missing, loss.summary()
    assert not loss.ok

    broken = reports["claim-always-acquired"]
    assert broken.duplicates.get(KEY) == 2, broken.summary()
    assert not broken.ok

    lease = reports["lease-limit"]
    assert lease.duplicates == {KEY: 2}, lease.summary()  # the lease mode's at-least-once limit
    assert not lease.ok

    by_name = {s.name: s for s in SCENARIOS}
    for name, allowed in (("redis-claim-always-acquired", False), ("redis-lease-limit", True)):
        s, r = by_name[name], reports[name]
        assert r.duplicates.get(s.key) == 2, f"{name}: {r.summary()}"
        assert s.faults is not None
        stopped = killed_between_effect_and_complete(
            s.ledger().effects(), Ledger(s.dir / "ledger.db", table=COMPLETES).effects(),
            {f.victim_pid for f in s.faults.faults if f.victim_pid is not None})
        assert (s.key in stopped) is allowed, (name, stopped)
        excess = beyond_the_lease_limit(r.duplicates, stopped)
        assert (not excess) is allowed, f"{name}: {excess}"
        assert not [f for f in r.failures() if not f.startswith("duplicates=")], r.summary()

    for name in ("control-claim", "control-txn"):
        ok = reports[name]
        assert ok.ok, f"{name}: {ok.summary()}"
        assert ok.redeliveries >= 1, f"{name}: the kill caused no redelivery: {ok.summary()}"
        assert ok.applications == N
