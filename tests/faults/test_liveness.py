"""Liveness on the real broker: under a backlog every assigned partition makes progress.

Judged from data read back, never from the worker's own counters: handler starts from the
append-only ledger (pid, partition, time), committed positions and log ends from the broker,
readiness over HTTP. The caps are set small (``max_in_flight`` 300 over 6 partitions, below
6 x the per-partition cap of 200, so the old global pause would trip; 4 handler threads for 6
lanes, so a runner that kept its thread would starve the others) and the backlog far above
them, so the rules are exercised, not only allowed. The fairness and moved-partition tests run
again with a byte bound that binds (``BYTES``, issue #45): 64 KiB lets the worker hold about 90
of these records, fewer than the 300 the record bound would, and a partition's share is about
15 of them.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer

from kworkers import Worker
from kworkers.consumer import processor
from kworkers.memory import RECORD_COST, parse_bytes
from kworkers.testing import Broker
from kworkers.testing.broker import free_port
from kworkers.testing.checker import committed
from kworkers.testing.ledger import Delivery, Ledger
from kworkers.testing.processes import WorkerProcess
from kworkers.testing.workload import full_size, make_topic, unique
from tests.apps.adapters import KafkaConsumerAdapter, consumer_settings
from tests.integration.conftest import running, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.faults]
ROOT = str(Path(__file__).resolve().parents[2])
PARTS = 6
#: the byte bound of the ``bytes`` runs, and what one of ``_backlog``'s records costs under it
#: (key, value, and ``RECORD_COST``): it binds before the record bound (300)
BYTES = "64KiB"
RECORD_BYTES = 2 + 200 + RECORD_COST


def _backlog(bs: str, topic: str, per: int) -> dict[int, int]:
    """``per`` records of 200 B on each partition (keys alone would spread them unevenly);
    returns the log ends."""
    p = Producer({"bootstrap.servers": bs, "linger.ms": 5, "log_level": 3})
    for i in range(per):
        for part in range(PARTS):
            p.produce(topic, key=b"k%d" % part, value=b"%d:%d:" % (part, i) + b"x" * 190,
                      partition=part)
        p.poll(0)
    assert p.flush(60) == 0
    return dict.fromkeys(range(PARTS), per)


def _worker(name: str, bs: str, topic: str, group: str, tmp: Path, port: int,
            *extra: str) -> WorkerProcess:
    args = ["-m", "tests.apps.backlog_worker", bs, topic, group, "--ledger",
            str(tmp / "ledger.db"), "--metrics-port", str(port), *extra]
    return WorkerProcess(args, tmp, name, cwd=ROOT)


def _starts(tmp: Path) -> list[Delivery]:
    return sorted(Ledger(tmp / "ledger.db").deliveries(), key=lambda d: d.at)


def _readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)


def _behind(bs: str, group: str, topic: str, ends: dict[int, int]) -> dict[int, int]:
    """Per partition, how far the group's committed position is behind the log end."""
    pos = committed(bs, group, topic)
    return {p: end - pos.get(p, 0) for p, end in ends.items() if end - pos.get(p, 0) > 0}


def _fairness(starts: list[Delivery]) -> Counter[int]:
    return Counter(d.partition for d in starts)


def _bound(bound: str) -> tuple[str, ...]:
    """The worker's flags for a run bounded in ``records`` (the record caps alone, the byte
    bound at its default far above) or in ``bytes`` (``BYTES``, which binds first)."""
    if bound == "records":
        return ()
    assert parse_bytes(BYTES) < 300 * RECORD_BYTES / 2  # binds: under half the record bound
    return ("--max-in-flight-bytes", BYTES)


@pytest.mark.parametrize("bound", ["records", "bytes"])
def test_one_worker_with_a_backlog_starts_every_partition_fairly(kafka_broker: Broker,
                                                                  tmp_path: Path,
                                                                  bound: str) -> None:
    bs = kafka_broker.bootstrap_servers
    per = full_size(10_000, 500)
    topic, group = make_topic(bs, unique("live"), PARTS), unique("g")
    ends = _backlog(bs, topic, per)
    port = free_port()
    w = _worker("w", bs, topic, group, tmp_path, port, "--stall-timeout", "3", *_bound(bound))
    try:
        w.start()
        # after warm-up (a third of the backlog started), partitions started alike
        wait_for(lambda: len(_starts(tmp_path)) >= per * PARTS // 3, 120, "a third started")
        window = _fairness(_starts(tmp_path))
        assert len(window) == PARTS, window
        assert min(window.values()) * 2 >= max(window.values()), window
        wait_for(lambda: not _behind(bs, group, topic, ends), 180, "every partition at its end")
        status = _readyz(port)
        assert status[0] == 200, status
        assert w.terminate(60) == 0, w.log()[-3000:]
    finally:
        w.close()
    starts = _starts(tmp_path)
    seen = {(d.partition, d.offset) for d in starts}
    assert seen == {(p, o) for p in range(PARTS) for o in range(per)}  # every record started
    print(f"{bound}: fairness after warm-up: {dict(sorted(window.items()))}; "
          f"{len(starts)} starts for {per * PARTS} records")


@pytest.mark.parametrize(("protocol", "bound"), [("classic", "records"),
                                               ("consumer", "records"), ("classic", "bytes")])
def test_partitions_moved_to_a_busy_member_start_before_its_own_backlog_is_done(
        kafka_broker: Broker, tmp_path: Path, protocol: str, bound: str) -> None:
    """A joins B's group, takes half the partitions, then leaves under SIGTERM: B, busy with a
    backlog of its own, starts each partition it takes over before it has started another
    ``slack`` records of its own ones (an order, not a time), and every partition reaches its
    end."""
    bs = kafka_broker.bootstrap_servers
    per = full_size(10_000, 1000)
    topic, group = make_topic(bs, unique("moved"), PARTS), unique("g")
    ends = _backlog(bs, topic, per)
    proto = ("--protocol", protocol, *_bound(bound))
    b = _worker("b", bs, topic, group, tmp_path, free_port(), *proto)
    a = _worker("a", bs, topic, group, tmp_path, free_port(), *proto)
    slack = 600  # B's own records at 4 threads: about 0.75 s of work
    try:
        b.start()
        wait_for(lambda: len(_starts(tmp_path)) >= 200, 120, "B at work")
        a.start()
        wait_for(lambda: len({d.partition for d in _starts(tmp_path) if d.pid == a.pid}) >= 2,
                 120, "A took partitions")
        wait_for(lambda: sum(d.pid == a.pid for d in _starts(tmp_path)) >= 100, 120, "A busy")
        assert a.terminate(60) == 0, a.log()[-3000:]
        signalled = time.time()  # A is out: what follows is B's (and the group's) doing
        a_parts = {d.partition for d in _starts(tmp_path) if d.pid == a.pid}
        behind = _behind(bs, group, topic, ends)
        assert a_parts and all(p in behind for p in a_parts), (a_parts, behind)  # backlogs
        try:
            wait_for(lambda: a_parts <= {d.partition for d in _starts(tmp_path)
                                         if d.pid == b.pid and d.at > signalled}, 120,
                     "B starts every partition it took over")
        except AssertionError as exc:
            # seen once under CI's two processes (2026-12-05, classic-records), never alone:
            # keep what B did and said, so the next one can be explained
            late = Counter(d.partition for d in _starts(tmp_path)
                           if d.pid == b.pid and d.at > signalled)
            raise AssertionError(
                f"{exc}: A's partitions {sorted(a_parts)}, B's starts since A left by "
                f"partition {dict(late)}, behind {_behind(bs, group, topic, ends)}; "
                f"B's log:\n{b.log()[-6000:]}") from exc
        wait_for(lambda: not _behind(bs, group, topic, ends), 240, "every partition at its end")
        assert b.terminate(60) == 0, b.log()[-3000:]
    finally:
        a.close()
        b.close()
    after = [d for d in _starts(tmp_path) if d.pid == b.pid and d.at > signalled]
    first = {p: next(i for i, d in enumerate(after) if d.partition == p) for p in a_parts}
    own_before = {p: sum(1 for d in after[:i] if d.partition not in a_parts)
                  for p, i in first.items()}
    own_left = sum(1 for d in after if d.partition not in a_parts)
    print(f"{protocol}, {bound}: moved partitions {sorted(a_parts)} first started after B ran "
          f"{own_before} of its own records (of {own_left} it still had)")
    assert own_left > slack, "B's own backlog ran out first: the order proves nothing"
    assert all(n < slack for n in own_before.values()), own_before
    seen = {(d.partition, d.offset) for d in _starts(tmp_path)}
    assert seen == {(p, o) for p in range(PARTS) for o in range(per)}


def test_canary_a_worker_that_skips_its_resume_is_caught_and_turns_unready(
        kafka_broker: Broker, tmp_path: Path) -> None:
    bs = kafka_broker.bootstrap_servers
    per = 500
    topic, group = make_topic(bs, unique("stuck"), PARTS), unique("g")
    ends = _backlog(bs, topic, per)
    port = free_port()
    w = _worker("w", bs, topic, group, tmp_path, port, "--stall-timeout", "3",
                "--skip-resume")
    try:
        w.start()
        wait_for(lambda: "stalled" in _readyz(port)[1], 120,
                 "the stall detector turns /readyz 503")
        status, body = _readyz(port)
        assert status == 503 and topic in body, (status, body)
        behind = _behind(bs, group, topic, ends)
        # what the fairness test waits for never happens: partitions stay behind, idle
        assert behind, "the canary's partitions reached their end"
        assert len(_starts(tmp_path)) < per * PARTS
        # degraded first (readiness), then unhealthy: the worker stops and exits 1, so an
        # orchestrator restarts it
        assert w.proc is not None
        assert w.proc.wait(120) == 1, w.log()[-3000:]
        assert "stuck past 3 stall bounds" in w.log()
    finally:
        w.close()


class _FetchCount(KafkaConsumerAdapter):
    """The real adapter; librdkafka's own statistics say how many records it fetched per
    partition (``rxmsgs``): a record fetched, dropped at a pause and fetched again counts
    twice."""

    rx: dict[int, int]

    def _on_stats(self, stats: str) -> None:
        super()._on_stats(stats)
        for topic in json.loads(stats).get("topics", {}).values():
            self.rx = {int(p): int(v.get("rxmsgs", 0))
                       for p, v in topic.get("partitions", {}).items() if int(p) >= 0}

    def ended(self) -> set[int]:
        """Partitions whose end the client reported (read from the test's thread: a copy)."""
        return {p for _t, p in list(self._ends)}


def _fetched_for_a_hot_partition(bs: str, n: int) -> int:
    """One partition with a backlog of ``n`` far above its share (100), two idle at their
    end, a no-op handler in-process; how many records of it the client fetched.

    The backlog appears at once (one transaction; the worker reads committed records only)
    after the worker has seen the idle partitions' ends: before that a hold may not start (an
    open partition the client knows nothing of may want records), so a share crossed at the
    start pauses once, and on a loaded machine the client had fetched the whole backlog by
    then (CI, 2026-12-02: 9,700 fetched for 5,000 = 300 + twice 4,700). What is measured is
    the steady state, not that race."""
    topic, group = make_topic(bs, unique("hot"), 3), unique("g")
    consumers: list[_FetchCount] = []

    def consumer(g: str) -> _FetchCount:
        c = _FetchCount(consumer_settings(bs, g))
        consumers.append(c)
        return c

    w = Worker(topics=[topic], group_id=group, bootstrap_servers=bs, consumer=consumer,
               max_in_flight=300, max_in_flight_per_partition=100)
    w.handler(lambda msg: None)
    main: list[_FetchCount] = []
    with running(w):
        wait_for(lambda: any(c.group == group for c in consumers), 60, "the worker's consumer")
        main = [c for c in consumers if c.group == group]
        wait_for(lambda: main[0].ended() >= {0, 1, 2}, 120, "the ends of all three partitions")
        p = Producer({"bootstrap.servers": bs, "linger.ms": 5, "log_level": 3,
                      "transactional.id": unique("hot-tx")})
        p.init_transactions(30)
        p.begin_transaction()
        for i in range(n):
            p.produce(topic, value=b"%d" % i, partition=0)
            p.poll(0)
        p.commit_transaction(60)
        wait_for(lambda: committed(bs, group, topic).get(0, 0) >= n, 120, "the backlog committed")
        wait_for(lambda: getattr(main[0], "rx", {}).get(0, 0) >= n, 30, "statistics for it")
    return main[0].rx[0]


@pytest.mark.parametrize("holds", [True, False], ids=["held", "canary-paused"])
def test_a_hot_partition_beside_idle_ones_is_fetched_once(
        kafka_broker: Broker, holds: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Backpressure that pauses throws librdkafka's read-ahead away, and the partition's next
    records wait for a fetch long-polling the idle ones (up to 500 ms); held instead, each
    record is fetched once. Counted by the client library, not by kworkers: the canary (the
    pause it replaced) fetches the same records again and again."""
    monkeypatch.setattr(processor, "HOLDS", holds)
    n = 5_000  # the canary's pauses cost it ~0.5 s per share crossed: 20,000 took 35 s
    fetched = _fetched_for_a_hot_partition(kafka_broker.bootstrap_servers, n)
    print(f"holds={holds}: {fetched:,} records fetched for {n:,}")
    if holds:
        assert fetched < n * 1.2, fetched  # a hold that outlasts HOLD_S may pause, rarely
    else:
        assert fetched > n * 2, fetched
