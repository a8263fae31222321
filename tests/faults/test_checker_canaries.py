"""The checker's findings, each shown firing on the real broker against a worker broken on
purpose, beside a control that passes (``tests/faults/test_canaries.py`` does ``missing`` and
``duplicates``; the unit tests show every finding on hand-built ledgers).

Every scenario is one partition of 20 [+5] activities and worker processes run one after
another (``tests/apps/ledger_worker.py --broken MODE``, the real adapter wrapped by
``tests/apps/broken_consumer.py``); the committed positions are read back throughout by a
``CommitSampler`` and at each step by the test. The scenarios run side by side:

- ``rerun``: a first worker is SIGKILLed (a fault before anything ran), a second handles and
  commits everything and stops cleanly, a third seeks back 3 records below the committed
  position when it is assigned. Effects go through the store's transaction, so the receiver
  absorbs the reruns (no duplicate) and the fault rule calls them explained (a fault came
  before both deliveries, none between): only ``rerun_committed`` sees committed work run
  again. Its control, the same run unbroken, is ok with no redelivery at all;
- ``unexplained``: the same seek-back with no fault recorded at all: ``unexplained`` as well;
- ``skip``: the worker never hands offset 7 to its loop and commits past it: ``skipped``;
- ``dropped``: a kill point SIGKILLs the worker on activity 7; the restarted one drops the
  first record it fetches (the killed one's uncommitted work): ``not_redelivered``;
- ``backwards``: at its clean stop the worker commits 3 records below its position:
  ``non_monotonic``; and the evidence a kill loop prints for such a partition
  (``support.commit_evidence``) shows it from the broker's side: ``__consumer_offsets`` read
  back holds the commit going back, beside the worker's commit trail and its client's
  committed-offset fetch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Producer

from kworkers.envelope.envelope import ids_to_headers
from kworkers.idempotency import SqliteStore
from kworkers.testing import Broker
from kworkers.testing.checker import (
    CommitSample,
    CommitSampler,
    FaultLog,
    Report,
    check,
    read_log,
)
from kworkers.testing.ledger import Ledger
from kworkers.testing.processes import WorkerProcess, keep_alive
from kworkers.testing.workload import make_topic, unique
from tests.apps.broken_consumer import BACK, SKIP_OFFSET
from tests.faults.support import EVIDENCE_ENV, commit_evidence
from tests.integration.conftest import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.faults]
ROOT = str(Path(__file__).resolve().parents[2])
N = 20
MORE = 5


@dataclass
class Run:
    """One scenario's topic, group, workers and readings."""

    name: str
    bs: str
    dir: Path
    topic: str = ""
    group: str = ""
    sampler: CommitSampler | None = None
    faults: FaultLog | None = None
    workers: list[WorkerProcess] = field(default_factory=list)
    samples: list[CommitSample] = field(default_factory=list)

    def __post_init__(self) -> None:
        (self.dir / "markers").mkdir(parents=True)
        self.topic, self.group = make_topic(self.bs, unique(self.name), 1), unique("g")
        self.sampler = CommitSampler(self.bs, self.group, self.topic).start()
        self.faults = FaultLog(self.sampler.latest)

    def worker(self, *extra: str) -> WorkerProcess:
        args = ["-m", "tests.apps.ledger_worker", self.bs, self.topic, self.group,
                "--store", f"sqlite:///{self.dir}/store.db", "--effect", "txn",
                "--markers", str(self.dir / "markers"), "--session-timeout-ms", "3000", *extra]
        w = WorkerProcess(args, self.dir, f"w{len(self.workers)}", cwd=ROOT, env=EVIDENCE_ENV)
        self.workers.append(w)
        return w.start()

    def ledger(self) -> Ledger:
        return Ledger.on_store(SqliteStore(self.dir / "store.db"))

    def committed_to(self, end: int, tick: Callable[[], None] = lambda: None) -> None:
        assert self.sampler is not None
        sampler = self.sampler

        def there() -> bool:
            tick()
            return sampler.sample().positions.get(0) == end

        wait_for(there, 120, f"{self.name}: committed to {end}")

    def stop(self, w: WorkerProcess) -> None:
        assert w.terminate() == 0, w.log()[-3000:]
        assert self.sampler is not None
        self.sampler.sample()

    def judge(self) -> Report:
        assert self.sampler is not None and self.faults is not None
        self.samples = self.sampler.stop()
        return check(self.ledger(), log=read_log(self.bs, self.topic), commits=self.samples,
                     faults=self.faults.faults)

    def evidence(self) -> str:
        """What a kill loop prints when it sees committed work run again or moved back
        (``support.commit_evidence``), for this run's partition."""
        assert self.faults is not None
        return commit_evidence({0}, topic=self.topic, group=self.group, bootstrap=self.bs,
                               samples=self.samples, deliveries=self.ledger().deliveries(),
                               faults=self.faults.faults,
                               logs=[(w.log_path.stem, w.log()) for w in self.workers])

    def close(self) -> None:
        for w in self.workers:
            w.close()
        if self.sampler is not None:
            self.sampler.stop(final=False)


def _produce(run: Run, start: int, n: int) -> None:
    """Activities ``o-<i>/a`` for i in [start, start + n), in order."""
    p = Producer({"bootstrap.servers": run.bs, "enable.idempotence": True, "log_level": 3})
    for i in range(start, start + n):
        p.produce(run.topic, key=f"o-{i}".encode(), value=str(i).encode(),
                  headers=list(ids_to_headers(f"o-{i}", "a")))
    assert p.flush(30) == 0


def rerun(run: Run, *broken: str, fault: bool = True) -> None:
    """Kill before any work (``fault``), a clean worker's whole run, then another worker
    (seeking back when broken) on records produced after."""
    assert run.faults is not None
    if fault:
        first = run.worker(*broken)
        wait_for(lambda: "worker ready" in first.log(), 60, "the first worker up")
        first.kill()
        run.faults.record("SIGKILL w0 before any work", victim_pid=first.pid)
    _produce(run, 0, N)
    second = run.worker(*broken)
    run.committed_to(N)
    run.stop(second)
    _produce(run, N, MORE)
    third = run.worker(*broken)
    run.committed_to(N + MORE)
    run.stop(third)


def one_worker(run: Run, mode: str) -> None:
    """One broken worker over the whole topic, stopped cleanly."""
    _produce(run, 0, N)
    w = run.worker("--broken", mode)
    run.committed_to(N)
    run.stop(w)


def dropped(run: Run) -> None:
    """Killed on activity 7 before its effect; the restart drops what the kill left."""
    assert run.faults is not None
    _produce(run, 0, N)
    w = run.worker("--broken", "drop-after-kill", "--kill", "o-7/a@before-effect")
    run.workers.remove(w)  # keep_alive owns it from here
    tick = keep_alive([w], run.faults)
    run.workers.append(w)
    run.committed_to(N, tick)
    assert run.faults.faults, "the kill point never fired"
    run.stop(w)


SCENARIOS: dict[str, Callable[[Run], None]] = {
    "rerun": lambda r: rerun(r, "--broken", "seek-back"),
    "rerun-control": lambda r: rerun(r),
    "unexplained": lambda r: rerun(r, "--broken", "seek-back", fault=False),
    "skip": lambda r: one_worker(r, "skip"),
    "dropped": dropped,
    "backwards": lambda r: one_worker(r, "commit-backwards"),
}


def test_each_finding_fires_on_a_worker_broken_for_it(kafka_broker: Broker,
                                                      tmp_path: Path) -> None:
    bs = kafka_broker.bootstrap_servers
    reports: dict[str, Report | BaseException] = {}
    runs: dict[str, Run] = {}

    def go(name: str) -> None:
        try:
            run = runs[name] = Run(name, bs, tmp_path / name)
            SCENARIOS[name](run)
            reports[name] = run.judge()
        except BaseException as exc:
            reports[name] = exc

    started = time.monotonic()
    threads = [threading.Thread(target=go, args=(n,)) for n in SCENARIOS]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(400)
    finally:
        for run in runs.values():
            run.close()
    for name in SCENARIOS:
        got = reports.get(name)
        if isinstance(got, BaseException):
            raise got
        assert got is not None, f"{name}: no report"
        print(f"{name}: {got.summary()}")
    print(f"checker canaries: {time.monotonic() - started:.1f} s")
    r = {name: rep for name, rep in reports.items() if isinstance(rep, Report)}

    seeked = [(0, o) for o in range(N - BACK, N)]
    assert set(seeked) <= set(r["rerun"].rerun_committed), r["rerun"].summary()
    # the hole this finding closes: the fault rule calls these reruns explained, and the
    # receiver absorbed their effects, so nothing else fails
    assert r["rerun"].unexplained == [] and r["rerun"].duplicates == {}, r["rerun"].summary()
    assert r["rerun"].redeliveries >= BACK
    # with no fault at all, the fault rule sees the same reruns too
    assert set(seeked) <= set(r["unexplained"].unexplained), r["unexplained"].summary()
    assert set(seeked) <= set(r["unexplained"].rerun_committed), r["unexplained"].summary()
    control = r["rerun-control"]
    assert control.ok and control.redeliveries == 0, control.summary()
    assert control.applications == N + MORE and control.timed_samples > 0

    assert r["skip"].skipped == [(0, SKIP_OFFSET)], r["skip"].summary()
    assert r["skip"].missing == [f"o-{SKIP_OFFSET}/a"]

    floor = max(0, runs["dropped"].faults.faults[0].floors.get(0, -1))  # type: ignore[union-attr]
    assert [(p, o) for p, o, _ in r["dropped"].not_redelivered] == [(0, floor)], \
        r["dropped"].summary()

    assert r["backwards"].non_monotonic == [(0, N, N - BACK)], r["backwards"].summary()
    # the evidence a kill loop prints (issue #44 §1) shows the same commit from the broker's
    # side: __consumer_offsets read back holds the position going back (the broken commit
    # bypasses the worker's committer), the worker's commit trail its own commit of the end,
    # its client the committed offset it started from
    backwards = runs["backwards"]
    evidence = backwards.evidence()
    assert f"{backwards.topic}[0] -> {N - BACK} BACKWARDS" in evidence, evidence
    assert f"commit ok: {backwards.topic}[0]={N}" in evidence, evidence
    assert f"OffsetFetchResponse: {backwards.topic} [0] offset -1" in evidence, evidence
    assert r["backwards"].failures() == [f for f in r["backwards"].failures()
                                         if f.startswith("non_monotonic")]
