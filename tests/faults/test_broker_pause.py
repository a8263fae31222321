"""Seed 001's commit faults and a DLQ outage, on the real broker: the broker is frozen
(``docker pause``, or SIGSTOP for the process broker), so requests are sent and never answered.

The pause is certain, not timed: the handler of a chosen record pauses the broker itself, and a
timer resumes it. Judged from data read back (the log, the append-only ledger in the store's
database, committed positions, the DLQ topic), never from the worker's own counters alone.

Client timeouts these tests rely on (set here, stated in docs/RELIABILITY.md):

- ``socket.timeout.ms`` (consumer): how long one commit attempt waits for the frozen broker
  before librdkafka gives up with a retryable timeout; the loop then retries in place with the
  seed's waits (100, 200, 400, 800 ms; 5 attempts). A pause shorter than the attempts' total is
  ridden out in place; a longer one ends in a retryable error or, when the group expelled the
  member meanwhile, a permanent one after a retryable one: the *uncertain* outcome.
- ``session.timeout.ms``: a pause longer than it lets the group expel the member once the broker
  runs again (its timers fire on resume), so the member's next commit is refused.
- ``delivery.timeout.ms`` (hand-off producer): how long a DLQ produce waits before it fails and
  the hand-off is retried; until it succeeds the source offset is not committed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

from kworkers import Message, NonRetryableError, RetryPolicy, TierLadder, Worker
from kworkers.activity import ActivityInvoker
from kworkers.consumer.commit import COMMIT_RETRY_WAITS, CommitPolicy
from kworkers.consumer.committer import Committer
from kworkers.consumer.processor import Processor
from kworkers.idempotency import SqliteStore
from kworkers.kafka.consumer import KafkaConsumerAdapter
from kworkers.metrics import MetricsServer
from kworkers.retry_tiers import headers as h
from kworkers.testing import Broker, broker_from_env
from kworkers.testing.checker import CommitSampler, FaultLog, Report, check, committed, read_log
from kworkers.testing.instruments import RecordingConsumer, RecordingInvoker, message_key
from kworkers.testing.ledger import Ledger
from kworkers.testing.workload import make_topic, produce_numbered, unique
from tests.faults.support import metric_total
from tests.integration.conftest import running, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.faults]

#: one commit attempt against the frozen broker gives up after this long
SOCKET_TIMEOUT_MS = 1500
#: kworkers' own bound on an unanswered commit attempt (``CommitPolicy.timeout_s``)
COMMIT_TIMEOUT_S = 0.5
SESSION_TIMEOUT_MS = 6000
#: shorter than the retry budget (5 attempts of 1.5 s plus 1.5 s of waits): ridden out in place
SHORT_PAUSE_S = 2.5
#: longer than the session: the member is expelled when the broker runs again
LONG_PAUSE_S = 8.0


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    """One broker of the module's own (never an external one): the tests freeze it."""
    b = broker_from_env(own=True)
    b.start()
    try:
        yield b
    finally:
        b.close()


def _metric(port: int, name: str, group: str) -> float:
    """A worker metric as ``/metrics`` exports it, read over HTTP."""
    return metric_total(port, name, group=group)


class Pauser:
    """Freezes the broker from inside a handler (so the pause lands where the test says), and
    resumes it after ``seconds`` on a timer."""

    def __init__(self, broker: Broker, faults: FaultLog) -> None:
        self.broker = broker
        self.faults = faults
        self.done: set[str] = set()
        self.resumed: dict[str, threading.Event] = {}

    def pause(self, label: str, seconds: float) -> None:
        if label in self.done:
            return
        self.done.add(label)
        self.faults.record(f"broker paused {seconds}s ({label})")
        ev = self.resumed.setdefault(label, threading.Event())
        self.broker.pause()

        def resume() -> None:
            self.broker.resume()
            ev.set()

        threading.Timer(seconds, resume).start()


@dataclass
class PauseRun:
    """What the commit-pause scenario left behind, judged by the tests below."""

    report: Report
    waits_short: list[float]
    waits_all: list[float]
    committed_after_short: int
    metrics: dict[str, float]
    #: the append-only ledger: deliveries (``RecordingInvoker``) and the rebalance callbacks
    #: of the worker's consumer (``RecordingConsumer``)
    ledger: Ledger
    topic: str
    #: wall times: each pause begun, and the run's end (everything committed)
    short_at: float
    long_at: float
    end_at: float
    #: the committed position read back from the broker once everything was done
    committed_at_end: int


def in_place_problems(ledger: Ledger, topic: str, start: float, end: float, paused_at: int,
                      committed_after: int) -> list[str]:
    """A pause ridden out in place, judged from outside the worker: between ``start`` and
    ``end`` its consumer's rebalance callbacks (the ledger's rows) revoked or lost nothing, no
    record was delivered again (the append-only delivery rows), and a commit past the record
    that froze the broker (``paused_at``) was read back from the broker afterwards."""
    out = [f"{r.kind} {r.topic}/{r.partition} {r.at - start:.1f}s after the pause began"
           for r in ledger.rebalances()
           if r.kind in ("revoke", "lost") and r.topic == topic and start <= r.at < end]
    seen: set[tuple[int, int]] = set()
    again = 0
    for d in sorted(ledger.deliveries(), key=lambda d: d.at):
        place = (d.partition, d.offset)
        if d.topic == topic and place in seen and start <= d.at < end:
            again += 1
        seen.add(place)
    if again:
        out.append(f"{again} records delivered again")
    if not committed_after > paused_at:
        out.append(f"no commit past {paused_at} read back: committed {committed_after}")
    if not any(d.topic == topic and start <= d.at < end for d in ledger.deliveries()):
        out.append("nothing delivered in the window: it proves nothing")
    return out


@pytest.fixture(scope="module")
def pause_run(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> PauseRun:
    """One worker, one partition, 300 records; the handler of record 100 freezes the broker
    for a short pause (shorter than the retry budget), the handler of 200 for a long one
    (longer than the session). Each pause lands right after an effect whose completion the next
    periodic commit (within a second) carries, so a commit certainly meets the frozen broker."""
    tmp = tmp_path_factory.mktemp("pause")
    bs = broker.bootstrap_servers
    topic, group = make_topic(bs, unique("commitpause"), 1), unique("g")
    total = 300
    produce_numbered(bs, topic, total, keys=1)
    store = SqliteStore(tmp / "store.db")
    ledger = Ledger.on_store(store)
    faults = FaultLog(lambda: committed(bs, group, topic))
    pauser = Pauser(broker, faults)
    w = Worker(topics=[topic], group_id=group, bootstrap_servers=bs,
               consumer_config={"socket.timeout.ms": SOCKET_TIMEOUT_MS,
                                "session.timeout.ms": SESSION_TIMEOUT_MS,
                                "heartbeat.interval.ms": 500},
               # an attempt the frozen broker leaves unanswered this long is a retryable
               # timeout: the short pause then runs seed 001's waits in place
               commit=CommitPolicy(timeout_s=COMMIT_TIMEOUT_S),
               invoke=RecordingInvoker(ledger, ActivityInvoker()),
               max_in_flight_per_partition=20, consume_batch=10,
               # the worker's own consumer, each rebalance callback written to the ledger
               consumer=lambda g: RecordingConsumer(
                   KafkaConsumerAdapter(w.config.consumer_properties(g)), ledger, "w"))
    w.create_topics()
    metrics_http = MetricsServer(w.metrics, 0, "127.0.0.1").start()
    commits = CommitSampler(bs, group, topic).start()
    def waits() -> list[float]:
        """The waits the worker's committer scheduled, in loop time (partition mode): its own
        list, read, never replaced (a list put in once the worker ran missed the short pause's
        waits when record 100 came first: ci95, 'no commit attempt timed out')."""
        return list(cast(Committer, cast(Processor, w.loops[0]).committer).waits)

    def worker_committed() -> int:
        """The position the worker itself marked committed: a run's waits join ``waits()`` in
        the same tick, just before its success is marked, so past 100 here means the run that
        rode out the short pause has put its waits in."""
        parts = list(cast(Processor, w.loops[0]).parts.values())
        return max((ps.tracker.committed or 0 for ps in parts), default=0)

    #: read by the handler of 200 once the short pause's commits are over: (waits, committed)
    short: list[tuple[list[float], int]] = []
    began: dict[str, float] = {}

    @w.handler
    def handle(msg: Message) -> None:
        key = message_key(msg)
        store.apply_once(key, lambda conn: ledger.apply_in(conn, key, msg))
        if key == "100":
            began.setdefault("short", time.time())
            pauser.pause("short", SHORT_PAUSE_S)
        elif key == "101":
            # the rest of the partition sits in the client's read-ahead (a hold keeps it), so
            # without this the worker would run up to 200, and freeze the broker again, within
            # the short pause: the commits of the short pause would not be told apart
            wait_for(lambda: pauser.resumed["short"].is_set(), 60, "the short pause over")
        elif key == "200":
            # the short pause ridden out before the broker freezes again: a commit past 100.
            # On a loaded machine the attempts right after the resume may still time out, and
            # the long pause began while that run went on, so neither was told apart (CI,
            # 2026-12-03: committed 10 and no waits read at 199). Every run before the one
            # that committed is over by then (one periodic run at a time). The run that
            # committed is over only once the worker's poll loop has applied its answer, which
            # the broker's committed position does not say: on a loaded machine it was read
            # before that tick (ci95, ci103: 'no commit attempt timed out', 3 s from pause to
            # pause), so the worker's own committed position is waited for as well.
            wait_for(lambda: committed(bs, group, topic).get(0, 0) > 100, 60,
                     "the short pause ridden out: a commit past 100")
            wait_for(lambda: worker_committed() > 100, 60,
                     "the worker applied the commit past 100")
            short.append((waits(), committed(bs, group, topic)[0]))
            began.setdefault("long", time.time())
            pauser.pause("long", LONG_PAUSE_S)

    with running(w):
        wait_for(lambda: "short" in pauser.resumed and pauser.resumed["short"].is_set(), 120,
                 "the short pause")
        wait_for(lambda: ledger.applications().get("199") == 1, 60, "work after the pause")
        wait_for(lambda: "long" in pauser.resumed and pauser.resumed["long"].is_set(), 120,
                 "the long pause")
        wait_for(lambda: committed(bs, group, topic) == {0: total}, 120, "everything committed")
        end_at = time.time()
        metrics = {name: _metric(metrics_http.port, f"kworkers_{name}_total", group)
                   for name in ("commits", "commit_failures", "commit_uncertain",
                                "commit_timeouts")}
    metrics_http.close()
    report = check(ledger, log=read_log(bs, topic), faults=faults.faults,
                   commits=commits.stop())
    print(f"{report.summary()} waits={waits()} metrics={metrics} sampler gaps {commits.gaps}")
    waits_short, after_short = short[0]
    return PauseRun(report, waits_short, waits(), after_short, metrics, ledger, topic,
                    began["short"], began["long"], end_at, committed(bs, group, topic)[0])


def test_pauses_mid_commit_lose_nothing_and_apply_nothing_twice(pause_run: PauseRun) -> None:
    """Whatever the commits did while the broker was frozen, and after the long pause got the
    member expelled: nothing lost, nothing applied twice, every redelivery at or beyond the
    commit floor of a pause, commits never backwards."""
    assert pause_run.report.ok, pause_run.report.summary()
    assert pause_run.report.faults == 2
    assert pause_run.committed_after_short > 100  # the short pause was ridden out


def test_a_commit_timeout_is_retried_in_place_with_the_seeds_waits(pause_run: PauseRun) -> None:
    """In place, from outside (issue #44): from the short pause until the long one, the
    worker's consumer revoked and lost nothing (its rebalance callbacks), delivered no record
    again (the ledger), and a commit past 100 was read back from the broker. Then the waits
    the worker scheduled (its own list) are a prefix of seed 001's."""
    r = pause_run
    problems = in_place_problems(r.ledger, r.topic, r.short_at, r.long_at, 100,
                                 r.committed_after_short)
    assert not problems, problems
    assert pause_run.waits_short, (
        "no commit attempt timed out during the short pause (by the end of the run: waits "
        f"{pause_run.waits_all}, metrics {pause_run.metrics})")
    assert tuple(pause_run.waits_short) == COMMIT_RETRY_WAITS[:len(pause_run.waits_short)]


def test_canary_a_pause_past_the_session_is_not_ridden_out_in_place(pause_run: PauseRun) -> None:
    """The same judge on the long pause of the same run (longer than the session: the group
    expels the member, whose place is not kept): it finds the loss, so it can fail. Records
    delivered again follow only when some were not committed at the expulsion (seen in most
    runs; in one CI run of 2026-12-05 the partition was lost with nothing left uncommitted,
    so the redelivery is not required here)."""
    r = pause_run
    problems = in_place_problems(r.ledger, r.topic, r.long_at, r.end_at, 200,
                                 r.committed_at_end)
    print(f"canary: the long pause judged as the short one: {problems}")
    assert any(p.startswith(("revoke", "lost")) for p in problems), problems


def test_dlq_outage_holds_the_commit_and_every_dead_letter_reads_back(
        broker: Broker, tmp_path: Path) -> None:
    bs = broker.bootstrap_servers
    topic, group = make_topic(bs, unique("dlqpause"), 1), unique("g")
    total, bad = 300, {"100", "200"}
    produce_numbered(bs, topic, total, keys=1)
    ledger = Ledger(tmp_path / "ledger.db")
    faults = FaultLog(lambda: committed(bs, group, topic))
    pauser = Pauser(broker, faults)
    w = Worker(topics=[topic], group_id=group, bootstrap_servers=bs,
               retry=RetryPolicy(initial=0.2, max_attempts=3), tiers=TierLadder((0.25, 1.0)),
               consumer_config={"socket.timeout.ms": SOCKET_TIMEOUT_MS,
                                "session.timeout.ms": 30_000},
               producer_config={"delivery.timeout.ms": 3000, "request.timeout.ms": 1500},
               invoke=RecordingInvoker(ledger, ActivityInvoker()),
               max_in_flight_per_partition=20, consume_batch=10)
    w.create_topics()
    dlq = w.config.tiers.dlq_topic(topic)
    runs: dict[str, int] = {}
    metrics_http = MetricsServer(w.metrics, 0, "127.0.0.1").start()
    port = metrics_http.port
    commits = CommitSampler(bs, group, topic).start()

    @w.handler
    def handle(msg: Message) -> None:
        key = message_key(msg)
        if key in bad:
            runs[key] = runs.get(key, 0) + 1
            if key == "100":
                # everything before 100 committed first: no commit is pending during the
                # outage, so the poll thread stays free to pause the partition
                wait_for(lambda: committed(bs, group, topic)[0] == 100, 30, "commit of 0..99")
                pauser.pause("dlq", LONG_PAUSE_S)  # the DLQ hand-off meets a frozen broker
            raise NonRetryableError("Poison", f"record {key} is bad")
        ledger.apply(key, msg)

    with running(w):
        # what an operator's alert reads: the worker's /metrics over HTTP
        wait_for(lambda: _metric(port, "kworkers_handoff_blocked", group) >= 1, 60,
                 "the hand-off blocked alert")
        wait_for(lambda: _metric(port, "kworkers_paused_partitions", group) >= 1, 30,
                 "the partition paused")
        assert not pauser.resumed["dlq"].is_set(), "the alert came only after the outage"
        wait_for(pauser.resumed["dlq"].is_set, 60, "the broker back")
        # commit held: no sample may show the commit past 100 while the dead letter of 100 is
        # not yet in the DLQ (the sample is taken first, so a later-visible record is fine)
        # bounded, so a worker that never gets there fails with what it reached (in ci89 the
        # coordinator stayed silent past the 24 s fencing margin, the partition was lost and
        # the membership confirmed again, and this loop spent pytest's 300 s timeout without
        # saying where the commit stood; why the commit stayed held is not established)
        give_up = time.monotonic() + 180
        while True:
            pos = commits.sample().positions[0]
            visible = len(read_log(bs, dlq)) >= 1
            assert pos <= 100 or visible, f"committed {pos} before the dead letter was written"
            if visible and pos >= total:
                break
            assert time.monotonic() < give_up, (
                f"180 s after the broker came back: committed {pos} of {total}, dead letter "
                f"{'visible' if visible else 'not visible'}, handler runs {runs}, faults "
                f"{faults.faults}")
        wait_for(lambda: _metric(port, "kworkers_handoff_blocked", group) == 0, 30,
                 "alert cleared")
    metrics_http.close()
    assert runs == {"100": 1, "200": 1}  # the handler is not re-run while the hand-off retries
    report = check(ledger, log=read_log(bs, topic), expected={str(i) for i in range(total)} - bad,
                   faults=faults.faults, commits=commits.stop())
    print(f"dlq outage: {report.summary()} sampler gaps {commits.gaps}")
    assert report.ok, report.summary()
    letters = list(read_log(bs, dlq))
    assert sorted(r.value for r in letters) == [b"100", b"200"]
    for r in letters:
        got = dict(r.headers)
        assert got[h.ORIGINAL_TOPIC] == topic.encode()
        assert got[h.ORIGINAL_PARTITION] == b"0"
        assert got[h.ORIGINAL_OFFSET] == r.value  # value i sits at offset i
        assert got[h.ERROR_TYPE] == b"Poison"
        assert got[h.DLQ_REASON] == b"non_retryable"
        assert got[h.GROUP] == group.encode()
