"""Share mode under faults on the real broker: SIGKILLs mid-handler, a broker restart, a record
that kills every worker it reaches, and the canaries that show each check failing.

Judged from data read back, never from the workers' counters: the source topic read from its
start (``read_log``), the append-only ledger in the store's database (deliveries with the pid
that got them, effects applied in the store's transaction), the delivery counts each handler
call saw (a second ledger), and the DLQ topic read from its start.

What must hold (``_judge``):

- nothing lost: every record's effect was applied, or the record is in the DLQ;
- each effect once (the idempotency receiver absorbs redeliveries);
- a killed process's unfinished records were delivered again (to another process, or dead-
  lettered at the delivery limit), and a record delivered more than once shows a delivery count
  that grew with each delivery (counted before the receiver, by a test instrument);
- a kill certainly mid-handler (a kill point) brings its record back to another member with a
  delivery count of 2 or more, and the DLQ holds only what the delivery-limit rule can put
  there, each dead letter read back as ``DeliveryLimitReached``;
- a record that kills every worker goes to the DLQ before its deliveries run out
  (``share.delivery.count.limit``; the last two are kept for the dead letter) instead of being
  archived by the broker;
- read back from the broker (``tests/faults/share_state.py``: Kafka's own Admin client, as
  confluent-kafka has no share-group admin API): each fault's floors are the group's start
  offsets just before it (every record below one acknowledged or archived), so a redelivery of
  a record below a floor read before it is ``unexplained``/``rerun_committed``; each kill is
  recorded with its victim; and once the run is over every partition's start offset is the
  log's end: every record acknowledged (``not_acknowledged``; canary ``no-ack``).
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin._resource import ResourceType

from kworkers import Message
from kworkers.idempotency import SqliteStore
from kworkers.testing import Broker
from kworkers.testing.checker import Fault, FaultLog, Log, LogRecord, check, read_log
from kworkers.testing.ledger import Delivery, Ledger
from kworkers.testing.processes import WorkerProcess
from kworkers.testing.workload import (
    full_size,
    make_topic,
    produce_numbered,
    produce_steady,
    unique,
)
from tests.faults.share_state import not_acknowledged, start_offsets

pytestmark = [pytest.mark.integration, pytest.mark.faults]
ROOT = str(Path(__file__).resolve().parents[2])
LIMIT = 5  # the broker's default
CRASH = "7"
#: the record whose first delivery SIGKILLs its worker (once): a kill certainly mid-handler
CERTAIN = "400"
#: a canary run is over once nothing moved for this long after its restart
QUIET_S = 6.0


def _limit(bs: str, group: str, limit: int) -> None:
    """The group's delivery limit, set before any member joins (Kafka's range is 2-10)."""
    admin = AdminClient({"bootstrap.servers": bs, "log_level": 3})
    res = ConfigResource(ResourceType.GROUP, group, incremental_configs=[ConfigEntry(
        "share.delivery.count.limit", str(limit), incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(15)


class Pool:
    """Share worker processes; ``tick`` restarts the dead and remembers who died when."""

    def __init__(self, n: int, bs: str, topic: str, group: str, tmp: Path, *extra: str) -> None:
        args = ["-m", "tests.apps.share_worker", bs, topic, group, "--store",
                f"sqlite:///{tmp}/store.db", "--dc-ledger", str(tmp / "dc.db"), *extra]
        self.workers = [WorkerProcess(args, tmp, f"{group}-w{i}", cwd=ROOT) for i in range(n)]
        #: (pid, when it was seen dead)
        self.victims: list[tuple[int, float]] = []

    def tick(self) -> None:
        for w in self.workers:
            if w.alive:
                continue
            if w.proc is not None:
                self.victims.append((w.proc.pid, time.time()))
            w.start()

    def wait(self, cond: Callable[[], bool], timeout: float, what: str,
             why: Callable[[], str] = str) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what} {why()}")
            self.tick()
            time.sleep(0.2)

    def stop(self) -> None:
        for w in self.workers:
            if w.alive:
                assert w.terminate() == 0, w.log()[-3000:]

    def close(self) -> None:
        for w in self.workers:
            w.close()


def _dlq(bs: str, topic: str) -> dict[str, bytes]:
    """DLQ'd record value -> its error type."""
    return {(r.value or b"").decode(): dict(r.headers).get("kw-error-type", b"")
            for r in read_log(bs, f"{topic}.dlq")}


def _judge(ledger: Ledger, counts: Ledger, log: Log, dlq: dict[str, bytes],
           victims: list[tuple[int, float]], faults: list[Fault],
           crash_keys: set[str], broker_down: Sequence[tuple[float, float]] = (),
           limit: int = LIMIT) -> list[str]:
    """What went wrong, if anything (see the module docstring). ``faults``: what the test did
    (each recorded just *before* it happened); a record killing its own worker (``crash_keys``)
    is a fault at each of its deliveries. ``broker_down``: (from, to) of each broker restart:
    the broker does not keep the delivery count of records in flight across a restart (they
    come back with count 1, measured), so a count may start again across one. ``limit``: the
    group's delivery limit, which bounds the DLQ (a dead-lettered record leaves ``expected``,
    so without a bound a worker that dead-letters everything would pass)."""
    wrong: list[str] = []
    # The DLQ, bounded by the delivery-limit rule: a record is dead-lettered unrun once
    # limit - 2 of its deliveries ended unacknowledged, and in these runs only a member's death
    # ends one so (handlers never outlast their lock, nothing is released before the stop, a
    # broker restart sets counts back to 1). Every dead letter must be that, read back as
    # DeliveryLimitReached; with fewer deaths than limit - 2 there can be none.
    other = {k: why for k, why in dlq.items() if why != b"DeliveryLimitReached"}
    if other:
        wrong.append(f"dead letters not at the delivery limit: {dict(list(other.items())[:5])}")
    if dlq and len(victims) < limit - 2:
        wrong.append(f"{len(dlq)} dead letters from {len(victims)} deaths (limit {limit})")
    applied = ledger.applications()
    everywhere = ledger.deliveries()  # the source topic and its retry tiers
    deliveries = [d for d in everywhere if d.topic == log.topic]
    # each kill was recorded with its victim (just before the SIGKILL, and before its floors
    # were read): the pool must have seen that process dead. ``check`` gets the faults without
    # their victims: a share group's start offset is no commit floor above which nothing is
    # acknowledged (a victim's records acknowledged above it are not delivered again), so the
    # victims' unfinished work is judged below from the effects, with the time each was seen
    # dead (``_not_delivered_again``)
    dead = {pid for pid, _at in victims}
    wrong += [f"{f.what}: pid {f.victim_pid} never seen dead" for f in faults
              if f.victim_pid is not None and f.victim_pid not in dead]
    faults = [replace(f, victim_pid=None) for f in faults]
    faults = faults + [Fault(d.at, {}, f"{d.key} killed pid {d.pid}", None)
                       for d in deliveries if d.key in crash_keys]
    keys = {(r.value or b"").decode() for r in log}
    report = check(ledger, log=log, expected=keys - {k for k in dlq if k not in applied},
                   faults=faults)
    print(report.summary())
    wrong += report.failures()
    both = sorted(k for k in applied if k in dlq and dlq[k] != b"DeliveryLimitReached")
    if both:
        wrong.append(f"effected and dead-lettered for a failure: {both[:5]}")
    first_effect: dict[str, float] = {}
    for e in ledger.effects():
        first_effect.setdefault(e.key, e.at)
    wrong += _not_delivered_again(deliveries, everywhere, first_effect, dlq, victims)
    # the delivery count grew with every delivery of a record
    seen: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for e in counts.effects():
        if e.topic == log.topic:
            seen[e.key].append((e.at, int(e.note)))
    for key, rows in seen.items():
        rows.sort()
        grown = all(b[1] > a[1] or any(a[0] <= up and b[0] >= down for down, up in broker_down)
                    for a, b in pairwise(rows))
        if not grown or rows[0][1] < 1:
            wrong.append(f"{key}: delivery counts {[n for _at, n in rows]} do not grow")
    return wrong


def _not_delivered_again(source: Sequence[Delivery], everywhere: Sequence[Delivery],
                         first_effect: dict[str, float], dlq: dict[str, bytes],
                         victims: Sequence[tuple[int, float]]) -> list[str]:
    """A killed process's unfinished records were delivered again (or dead-lettered): each
    ``source`` delivery to a victim whose effect nobody had applied before it died must be
    followed by a delivery of the same key to another process on *any* topic of the pipeline
    (``everywhere``): a victim that handed the record to a retry tier before it died (a
    ``LeaseBusy`` left by an earlier victim, say) acknowledged it on the source, and the tier
    delivers it next (seen in CI: three records went on through ``.retry.250ms``, and a rule
    that looked at the source topic only called them lost)."""
    wrong = []
    for pid, died in victims:
        for d in source:
            if d.pid != pid or d.key in dlq or first_effect.get(d.key, died + 1) <= died:
                continue
            if not any(o.key == d.key and o.pid != pid and o.at > d.at for o in everywhere):
                wrong.append(f"{d.key} was running in pid {pid} (died by {died:.1f}) and was "
                             "never delivered again")
    return wrong


def test_a_victims_record_may_come_back_through_a_tier_but_must_come_back() -> None:
    """The rule on the CI run's shape (no broker): pid 2 took record 400 on the source, handed
    it to the tier (LeaseBusy) and was killed; pid 3 ran it from the tier and applied it. Its
    canary: the same record with no later delivery anywhere is caught, and so is one whose only
    later delivery went to the victim itself."""
    src, tier = "skill", "skill.retry.250ms"
    seen = [Delivery("400", src, 1, 250, 1, 1, 10.0), Delivery("400", src, 1, 250, 1, 2, 11.0),
            Delivery("400", tier, 1, 1, 2, 3, 11.5)]
    source = [d for d in seen if d.topic == src]
    effect = {"400": 20.0}
    assert _not_delivered_again(source, seen, effect, {}, [(1, 10.5), (2, 12.0)]) == []
    # canaries: nothing after the victim's delivery, or only the victim itself again
    assert _not_delivered_again(source, seen[:2], effect, {}, [(2, 12.0)]) != []
    again_self = [*seen[:2], Delivery("400", tier, 1, 1, 2, 2, 11.5)]
    assert _not_delivered_again(source, again_self, effect, {}, [(2, 12.0)]) != []
    # the old rule (later deliveries looked for on the source topic only) flags the CI run
    assert _not_delivered_again(source, source, effect, {}, [(2, 12.0)]) != []


def test_canary_without_floors_a_redelivery_of_an_acknowledged_record_is_explained(
        tmp_path: Path) -> None:
    """Why each fault carries the group's start offsets read back from the broker (no broker
    here): record 5 delivered at t=1 and applied; a kill at t=2, the group's start offset read
    back 10 (5 acknowledged); 5 delivered again at t=3. With the floors ``check`` finds it
    unexplained and a rerun below a reading; with the floors the suite used to give
    (``FaultLog(lambda: {})``) the same run passes."""
    ledger = Ledger(tmp_path / "ledger.db")
    msg = Message("t", 0, 5, b"k", b"5", ())
    ledger.delivered("5", msg, pid=1, at=1.0)
    ledger.apply("5", msg, pid=1, at=1.0)
    ledger.delivered("5", msg, pid=2, at=3.0)
    log = Log("t", {0: [LogRecord(0, 5, b"k", b"5", ())]}, {0: (5, 6)})
    blind = check(ledger, log=log, faults=[Fault(2.0, {}, "SIGKILL 1")])
    assert blind.ok, blind.summary()  # the hole
    seen = check(ledger, log=log, faults=[Fault(2.0, {0: 10}, "SIGKILL 1")])
    assert seen.unexplained == [(0, 5)] and seen.rerun_committed == [(0, 5)], seen.summary()


def test_share_kill_loop_and_broker_restart_lose_nothing_and_apply_each_effect_once(
        fault_broker: Broker, tmp_path: Path) -> None:
    """Steady production until the end; full size: the record that kills its worker first,
    until it is in the DLQ; then a certain kill (the worker given record CERTAIN SIGKILLs
    itself in its handler, once) whose record must come back to another member with its
    delivery count raised, then random SIGKILLs; then a broker restart with records in
    flight; full size: more kills after the restart. The DLQ is bounded by the delivery-limit
    rule (none at CI size, where too few members die). (At CI size the crash-looping record runs
    in ``test_canaries_are_caught``, beside its canary.)

    The order is for CI's clock: a member that dies soon after a broker restart keeps its
    records until the group's session timeout (45 s by default, measured:
    docs/SHARE_GROUPS.md; 6 s on the test broker), so the crash-looping record is
    dead-lettered before the restart (which would reset its delivery count to 1 and start its
    deaths again). At CI size: the certain kill, one random kill, the restart, one kill after
    it."""
    bs = fault_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("skill"), 2), unique("g")
    _limit(bs, group, LIMIT)
    kills = full_size(12, 3)  # the certain kill, then random ones
    after_restart = full_size(6, 1)
    rnd = random.Random(7)
    store = SqliteStore(tmp_path / "store.db")
    ledger = Ledger.on_store(store)
    counts = Ledger(tmp_path / "dc.db", table="share_dc")
    crash = {CRASH} if full_size(1, 0) else set()
    markers = tmp_path / "markers"
    markers.mkdir()
    pool = Pool(3, bs, topic, group, tmp_path, "--slow-ms", "3", "--markers", str(markers),
                "--kill", f"{CERTAIN}@before-effect",
                *(["--crash-key", CRASH] if crash else []))
    # each fault's floors: the group's start offsets read back from the broker just before it
    faults = FaultLog(lambda: start_offsets(bs, group, topic))
    broker_down: list[tuple[float, float]] = []
    stop_producing = threading.Event()
    sent: list[int] = []
    producer = threading.Thread(
        target=lambda: sent.append(produce_steady(bs, topic, 10**9, full_size(300, 100),
                                                  stop=stop_producing)), daemon=True)
    dlq: dict[str, bytes] = {}
    last_read = [0.0]

    def read_dlq(every: float = 2.0) -> dict[str, bytes]:
        nonlocal dlq
        if time.monotonic() - last_read[0] >= every:
            last_read[0] = time.monotonic()
            dlq = _dlq(bs, topic)
        return dlq

    def progress(n: int, what: str) -> None:
        before = ledger.counts()[0]
        pool.wait(lambda: ledger.counts()[0] > before + n, 120, what)

    def kill() -> None:
        progress(100, "progress before a kill")
        victim = rnd.choice(pool.workers)
        faults.record(f"SIGKILL {victim.pid}", victim_pid=victim.pid)  # before: a release
        # follows at once
        victim.kill()
        pool.tick()
        time.sleep(rnd.uniform(0.0, 1.0))

    marker = markers / f"killed-{CERTAIN}"

    def certain_redelivered() -> bool:
        """The record the kill point stopped was delivered to another member, counted 2+."""
        if not marker.exists():
            return False
        victim = int(marker.read_text() or 0)
        return any(e.key == CERTAIN and e.pid != victim and int(e.note) >= 2
                   for e in counts.effects())

    try:
        pool.tick()
        producer.start()
        pool.wait(lambda: ledger.counts()[1] > 0, 90, "first effects")
        if crash:
            pool.wait(lambda: CRASH in read_dlq(), 120, "the crash-looping record in the DLQ")
        # the certain kill: the worker given CERTAIN dies in its handler; before the broker
        # restart (which resets delivery counts), the record must reach another member with
        # its delivery count raised
        pool.wait(certain_redelivered, 120, f"{CERTAIN} delivered again with count >= 2",
                  lambda: f"(kill point fired: {marker.exists()})")
        for _ in range(kills - 1 - after_restart):
            kill()
        progress(100, "progress before the broker restart")
        down = faults.record("broker restart").at
        fault_broker.restart()
        broker_down.append((down, time.time()))
        progress(200, "progress after the broker restart")
        for _ in range(after_restart):
            kill()
        stop_producing.set()
        producer.join(120)
        total = sent[0]

        def settled() -> bool:
            return len(ledger.applications().keys() | read_dlq().keys()) >= total

        def neither() -> str:
            left = {str(i) for i in range(total)} - ledger.applications().keys() - dlq.keys()
            return f"({len(left)} neither effected nor dead-lettered: {sorted(left)[:20]})"

        pool.wait(settled, 150, "every record effected or dead-lettered", neither)
        # and acknowledged, read back from the broker: a victim's records whose effect it had
        # applied come back once their acquisition lock ends (30 s), and the receiver absorbs
        # them; until then the broker counts them in the group's lag
        ends = {p: (recs[-1].offset + 1 if recs else 0)
                for p, recs in read_log(bs, topic).records.items()}
        unacked: list[str] = []

        def acknowledged() -> bool:
            unacked[:] = not_acknowledged(bs, group, topic, ends)
            return not unacked

        pool.wait(acknowledged, 120, "every record acknowledged (the group's lag read back)",
                  lambda: str(unacked))
        pool.stop()
        log = read_log(bs, topic)
        assert len(log) == total
        dlq = _dlq(bs, topic)
        # the certain kill is a fault at its delivery (as the crash-looping record's are)
        wrong = _judge(ledger, counts, log, dlq, pool.victims, faults.faults,
                       crash | {CERTAIN}, broker_down)
        wrong += _acknowledged(bs, group, log)
        limit_hit = sorted(k for k, why in dlq.items() if why == b"DeliveryLimitReached")
        print(f"records {total}, faults {len(faults.faults)}, deaths {len(pool.victims)}, "
              f"dead-lettered {len(dlq)}, at the delivery limit {len(limit_hit)} (handler "
              f"runs: {sum(1 for e in counts.effects() if e.key in set(limit_hit))}); the "
              f"faults' floors read back {[dict(f.floors) for f in faults.faults]}")
        assert not wrong, wrong[:10]
        assert marker.exists() and certain_redelivered()
        assert len(pool.victims) >= kills + (LIMIT - 2 if crash else 0)
        if crash:
            # the record that kills its worker ran until the two deliveries kept for the dead
            # letter (LIMIT - 2 times), then went to the DLQ unrun
            assert dlq[CRASH] == b"DeliveryLimitReached"
            assert [int(e.note) for e in counts.effects() if e.key == CRASH] == list(
                range(1, LIMIT - 1))
            assert CRASH not in ledger.applications()
    finally:
        stop_producing.set()
        pool.close()


CANARIES = {
    # canary: (its flags, the group's delivery limit, the finding that must catch it)
    "accept-early": (["--canary", "accept-early", "--kill", "3@before-effect"], 5, "missing="),
    "no-last-delivery": (["--canary", "no-last-delivery", "--crash-key", "3"], 2, "missing="),
    "no-receiver": (["--canary", "no-receiver", "--kill", "3@after-effect"], 5, "duplicates="),
    "dead-letter-all": (["--canary", "dead-letter-all", "--kill", "3@before-effect"], 5,
                        "dead letters not at the delivery limit"),
    "no-ack": (["--canary", "no-ack"], 5, "canary-no-ack-"),
}
#: the unbroken app under the no-last-delivery canary's conditions: the check passes
CONTROL = "last-delivery"
RUNS = {**CANARIES, CONTROL: (["--crash-key", "3"], 2, "")}


def _acknowledged(bs: str, group: str, log: Log, timeout: float = 30.0) -> list[str]:
    """Every record acknowledged (or archived), read back from the broker: each partition's
    start offset reaches the log's end (asked again, bounded, while the share coordinator
    persists the last acknowledgements)."""
    ends = {p: (recs[-1].offset + 1 if recs else 0) for p, recs in log.records.items()}
    deadline = time.monotonic() + timeout
    while (left := not_acknowledged(bs, group, log.topic, ends)) and \
            time.monotonic() < deadline:
        time.sleep(1.0)
    return left


def _canary(canary: str, bs: str, tmp: Path) -> tuple[list[str], dict[str, bytes]]:
    """``_judge``'s findings on one run, and its DLQ."""
    flags, limit, _finding = RUNS[canary]
    topic, group = make_topic(bs, unique(f"canary-{canary}"), 1), unique("g")
    _limit(bs, group, limit)
    ledger = Ledger.on_store(SqliteStore(tmp / "store.db"))
    counts = Ledger(tmp / "dc.db", table="share_dc")
    pool = Pool(1, bs, topic, group, tmp, "--markers", str(tmp), "--concurrency", "1", *flags)
    produce_numbered(bs, topic, 20)
    try:
        pool.tick()
        pool.wait(lambda: bool(pool.victims), 90, f"{canary}: the kill")
        # settled: the restarted worker had time to join and nothing moved for a while
        last: list[object] = []
        since = [time.monotonic()]

        def quiet() -> bool:
            now = [ledger.counts(), counts.counts(), len(pool.victims)]
            if now != last:
                last[:] = now
                since[0] = time.monotonic()
            return time.monotonic() - since[0] > QUIET_S

        if canary == "no-ack":
            # the client refuses the next poll while a record is unacknowledged, so this
            # worker dies and is restarted without end: never quiet. Judged once every record
            # was applied (its work done, the broker never told), the workers SIGKILLed
            pool.wait(lambda: len(ledger.applications()) >= 20, 120, f"{canary}: every effect")
            pool.close()
            log = read_log(bs, topic)
            return _acknowledged(bs, group, log, timeout=0.0), _dlq(bs, topic)
        pool.wait(quiet, 120, f"{canary}: the run to settle")
        pool.stop()
        dlq = _dlq(bs, topic)
        log = read_log(bs, topic)
        return _judge(ledger, counts, log, dlq, pool.victims, [], {"3"},
                      limit=limit) + _acknowledged(bs, group, log), dlq
    finally:
        pool.close()


def test_canaries_are_caught(kafka_broker: Broker, tmp_path: Path) -> None:
    """Each broken variant of the share app makes ``_judge`` fail, for the right reason:

    - accept-early: records are accepted before their effect; a kill in between loses them;
    - no-last-delivery: the record that kills its worker runs on its last delivery, kills it
      again, and the broker archives it: neither effected nor in the DLQ;
    - no-receiver: a record killed after its effect is delivered again and, without the
      store's transaction, applied twice;
    - dead-letter-all: every record dead-lettered (its "failure"), which drops it from what
      must be effected: the DLQ's bound by the delivery-limit rule catches it;
    - no-ack: every effect applied, no acknowledgement ever sent (the client then refuses the
      next poll, so the worker dies and is restarted until the test stops it): the group's
      start offset read back from the broker stays short of the log's end (``_acknowledged``).

    Beside them runs the control: the unbroken app where no-last-delivery's record kills its
    worker (limit 2, the record's first delivery kills): the record is dead-lettered as
    ``DeliveryLimitReached`` on its last delivery, unrun, and the same judge finds nothing.

    The six run side by side (each its own topic, group and process) to keep CI short.
    """
    bs = kafka_broker.bootstrap_servers
    found: dict[str, tuple[list[str], dict[str, bytes]] | BaseException] = {}

    def run(canary: str) -> None:
        tmp = tmp_path / canary
        tmp.mkdir()
        try:
            found[canary] = _canary(canary, bs, tmp)
        except BaseException as exc:
            found[canary] = exc

    threads = [threading.Thread(target=run, args=(c,)) for c in RUNS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    for name in RUNS:
        if isinstance(got := found.get(name), BaseException):
            raise got
    for canary, (_flags, _limit, finding) in CANARIES.items():
        wrong = found[canary][0]  # type: ignore[index]
        print(canary, wrong)
        assert wrong and any(w.startswith(finding) for w in wrong), (
            f"the {canary} canary was not caught: {wrong}")
    wrong, dlq = found[CONTROL]  # type: ignore[misc]
    print(CONTROL, wrong, dlq)
    assert not wrong, wrong
    assert dlq.get("3") == b"DeliveryLimitReached", dlq
