"""The ledger and the checker must be able to say no: each finding, shown firing and not firing.

No broker here: the log is built by hand (``Log``), so every case is exact, including the
offset gaps a transaction's control records leave.
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kworkers.idempotency import SqliteStore, TransactionalStore
from kworkers.message import Message
from kworkers.testing.checker import CommitSample, Fault, Log, LogRecord, check, record_key
from kworkers.testing.instruments import KillPoint, RecordingInvoker
from kworkers.testing.ledger import Ledger

T = "src"


def _log(parts: dict[int, list[int]]) -> Log:
    """Records with value ``p<part>o<offset>`` at the given offsets of each partition."""
    return Log(T, {p: [LogRecord(p, o, None, f"p{p}o{o}".encode(), ()) for o in offs]
                   for p, offs in parts.items()},
               {p: (min(offs, default=0), max(offs, default=-1) + 1) for p, offs in parts.items()})


def _msg(part: int, off: int) -> Message:
    return Message(T, part, off, None, f"p{part}o{off}".encode())


def _run(ledger: Ledger, parts: dict[int, list[int]], pid: int = 100, at: float = 1.0) -> None:
    """Each record delivered once and applied once, by ``pid``."""
    for p, offs in parts.items():
        for o in offs:
            key = f"p{p}o{o}"
            ledger.delivered(key, _msg(p, o), pid=pid, at=at)
            ledger.apply(key, _msg(p, o), pid=pid, at=at)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.db")


PARTS = {0: [0, 1, 2, 3], 1: [0, 1], 2: []}


def test_a_clean_run_is_ok(ledger: Ledger) -> None:
    _run(ledger, PARTS)
    report = check(ledger, log=_log(PARTS), commits=[{0: 2, 1: 1, 2: -1001}, {0: 4, 1: 2}])
    assert report.ok, report.summary()
    assert (report.expected, report.applications, report.dup) == (6, 6, 0)


def test_a_second_application_is_a_duplicate(ledger: Ledger) -> None:
    _run(ledger, PARTS)
    ledger.apply("p0o2")  # nothing is unique, nothing is ignored
    report = check(ledger, log=_log(PARTS))
    assert report.duplicates == {"p0o2": 2}
    assert report.dup == 1
    assert not report.ok
    assert "duplicates=1" in report.summary()


def test_missing_unexpected_and_not_in_log(ledger: Ledger) -> None:
    _run(ledger, {0: [0, 1, 2]})
    ledger.apply("stranger")
    report = check(ledger, log=_log(PARTS), expected={"p0o0", "p0o1", "p0o2", "p0o3", "ghost"})
    assert report.missing == ["ghost", "p0o3"]
    assert report.unexpected == ["stranger"]
    assert report.not_in_log == ["ghost"]
    assert not report.ok


def test_skips_are_judged_from_the_log_start_on_every_partition(ledger: Ledger) -> None:
    """Offsets 0..1 of partition 0 never handled, and partition 1 never handled at all."""
    _run(ledger, {0: [2, 3]})
    report = check(ledger, log=_log(PARTS), commits=[{0: 4, 1: 2, 2: -1001}])
    assert report.skipped == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert set(report.missing) == {"p0o0", "p0o1", "p1o0", "p1o1"}


def test_transaction_markers_leave_gaps_that_are_not_losses(ledger: Ledger) -> None:
    parts = {0: [0, 1, 3, 4, 6]}  # 2 and 5: commit markers a read_committed reader never sees
    _run(ledger, parts)
    report = check(ledger, log=_log(parts), commits=[{0: 7}])
    assert report.ok, report.summary()


def test_commits_going_backwards_are_reported(ledger: Ledger) -> None:
    _run(ledger, PARTS)
    report = check(ledger, log=_log(PARTS), commits=[{0: 3}, {0: 2}, {0: 4}])
    assert report.non_monotonic == [(0, 3, 2)]


def test_a_redelivery_needs_a_fault_whose_floor_allows_it(ledger: Ledger) -> None:
    _run(ledger, {0: [0, 1, 2, 3]}, pid=100, at=1.0)
    ledger.delivered("p0o1", _msg(0, 1), pid=200, at=3.0)  # offset 1 delivered again
    ledger.delivered("p0o3", _msg(0, 3), pid=200, at=3.0)
    log = _log({0: [0, 1, 2, 3]})
    unexplained = check(ledger, log=log)
    assert unexplained.unexplained == [(0, 1), (0, 3)]
    assert unexplained.redeliveries == 2
    # a kill at t=2 with offset 1 committed as the floor: offset 1 and 3 were uncommitted
    fine = check(ledger, log=log, faults=[Fault(2.0, {0: 1}, "SIGKILL")])
    assert fine.unexplained == []
    # the same kill with the floor at 2: offset 1 was committed, so its redelivery is wrong
    wrong = check(ledger, log=log, faults=[Fault(2.0, {0: 2}, "SIGKILL")])
    assert wrong.unexplained == [(0, 1)]
    # a fault after both deliveries explains nothing
    late = check(ledger, log=log, faults=[Fault(4.0, {0: 0}, "SIGKILL")])
    assert late.unexplained == [(0, 1), (0, 3)]
    # one before both may (its consequences outlast it), unless a later one had committed
    early = Fault(0.5, {0: 0}, "broker restart")
    assert check(ledger, log=log, faults=[early]).unexplained == []
    assert check(ledger, log=log, faults=[early, Fault(2.0, {0: 2}, "k")]).unexplained \
        == [(0, 1)]


def test_floors_bind_only_deliveries_after_they_were_read_back(ledger: Ledger) -> None:
    """After a broker restart the read-back of the floors takes seconds; a redelivery inside
    that window may have made the very commit the read saw."""
    _run(ledger, {0: [0, 1, 2, 3]}, pid=100, at=1.0)
    ledger.delivered("p0o1", _msg(0, 1), pid=200, at=3.0)
    log = _log({0: [0, 1, 2, 3]})
    slow = Fault(2.0, {0: 2}, "broker restart", sampled_at=3.5)  # read back after the redelivery
    assert check(ledger, log=log, faults=[slow]).unexplained == []
    quick = Fault(2.0, {0: 2}, "broker restart", sampled_at=2.5)  # read back before it
    assert check(ledger, log=log, faults=[quick]).unexplained == [(0, 1)]


def test_a_kill_mid_flight_must_cause_a_redelivery(ledger: Ledger) -> None:
    _run(ledger, {0: [0, 1, 2]}, pid=100, at=1.0)
    log = _log({0: [0, 1, 2]})
    kill = Fault(2.0, {0: 1}, "SIGKILL w0", victim_pid=100)  # 1 and 2 were uncommitted
    report = check(ledger, log=log, faults=[kill])
    assert report.not_redelivered == [(0, 1, "SIGKILL w0"), (0, 2, "SIGKILL w0")]
    ledger.delivered("p0o1", _msg(0, 1), pid=300, at=3.0)
    ledger.delivered("p0o2", _msg(0, 2), pid=300, at=3.0)
    assert check(ledger, log=log, faults=[kill]).ok
    # nothing committed at the kill: every offset the victim had must come back
    assert check(ledger, log=log, faults=[Fault(2.0, {0: -1001}, "k", 100)]).not_redelivered \
        == [(0, 0, "k")]


def test_a_victims_commit_that_lands_after_the_floor_read_is_its_floor(
        ledger: Ledger) -> None:
    """The Redis kill loop's ``not_redelivered`` on 2026-12-02: the victim ran partition 0's
    records, committed them and died; the floor read right after the death still said
    nothing was committed (the commit was still on its way), and the partition's next owner
    found it committed to the end and was given nothing. Readings returned within the
    fault's ``settle_s`` (under the victim's session: nobody else owns its partitions yet)
    are its floor too; a commit read back later, which another owner may have made without
    running the records (the drop-after-kill canary), still is not."""
    _run(ledger, {0: [0, 1, 2]}, pid=100, at=1.0)
    log = _log({0: [0, 1, 2]})
    landed = CommitSample(2.4, {0: 3}, started=2.2)  # the victim's commit, read back late

    def kill(settle_s: float) -> Fault:
        return Fault(2.0, {0: -1001}, "k", victim_pid=100, sampled_at=2.1, settle_s=settle_s)

    assert check(ledger, log=log, commits=[landed], faults=[kill(0.0)]).not_redelivered \
        == [(0, 0, "k"), (0, 1, "k"), (0, 2, "k")]  # before: the race this fixes
    assert check(ledger, log=log, commits=[landed], faults=[kill(3.0)]).ok
    # past the window the position may be another owner's that never ran the records
    later = CommitSample(9.0, {0: 3}, started=8.8)
    assert check(ledger, log=log, commits=[later], faults=[kill(3.0)]).not_redelivered \
        == [(0, 0, "k"), (0, 1, "k"), (0, 2, "k")]


def test_committed_work_run_again_is_a_finding_whatever_faults_came_before(
        ledger: Ledger) -> None:
    """Issue #25, item 1: offsets 0..3 handled and committed, a kill at t=0.5, offset 1
    delivered again at t=5 by the same process. A fault before both deliveries and none in
    between "explains" the redelivery (``all`` of nothing), so the fault rule alone passes a
    worker that seeks back below its committed position; a reading of the committed position
    taken before the redelivery does not."""
    _run(ledger, {0: [0, 1, 2, 3]}, pid=100, at=1.0)
    ledger.delivered("p0o1", _msg(0, 1), pid=100, at=5.0)
    log = _log({0: [0, 1, 2, 3]})
    kill = Fault(0.5, {0: -1001}, "SIGKILL w9", victim_pid=9)
    hole = check(ledger, log=log, commits=[{0: 4}], faults=[kill])  # untimed: the old API
    assert hole.unexplained == [] and hole.ok, hole.summary()  # the fault rule is blind here
    timed = check(ledger, log=log, commits=[CommitSample(2.0, {0: 4}, 1.9)], faults=[kill])
    assert timed.rerun_committed == [(0, 1)], timed.summary()
    assert not timed.ok and "rerun_committed=1" in timed.summary()
    # a reading that returned after the redelivery proves nothing about it
    late = check(ledger, log=log, commits=[CommitSample(6.0, {0: 4}, 5.5)], faults=[kill])
    assert late.rerun_committed == [] and late.ok, late.summary()
    # a fault's floors are readings too (read back right after the fault)
    floors = check(ledger, log=log, faults=[kill, Fault(3.0, {0: 2}, "pause")])
    assert floors.rerun_committed == [(0, 1)], floors.summary()


def test_a_rerun_is_judged_against_the_highest_position_read_before_it(ledger: Ledger) -> None:
    _run(ledger, {0: [0, 1, 2, 3]}, pid=100, at=1.0)
    ledger.delivered("p0o2", _msg(0, 2), pid=200, at=4.0)
    log = _log({0: [0, 1, 2, 3]})
    # committed 3, then (a backwards commit) 1: offset 2 was committed before it ran again
    samples = [CommitSample(2.0, {0: 3}, 1.9), CommitSample(3.0, {0: 1}, 2.9)]
    report = check(ledger, log=log, commits=samples)
    assert report.rerun_committed == [(0, 2)]
    assert report.non_monotonic == [(0, 3, 1)]


def test_an_empty_run_proves_nothing(ledger: Ledger, tmp_path: Path) -> None:
    nothing = check(ledger, log=_log({0: [], 1: []}))
    assert not nothing.ok and "empty" in nothing.summary()
    assert "log is empty" in nothing.empty
    assert not check(ledger, expected=set()).ok
    # records in the log, none delivered (a handler never ran; effects without deliveries)
    for o in range(3):
        ledger.apply(f"p0o{o}", _msg(0, o))
    undelivered = check(ledger, log=_log({0: [0, 1, 2]}))
    assert not undelivered.ok and "no delivery" in undelivered.empty
    assert check(ledger, log=_log({0: [0, 1, 2]}), allow_empty=True).ok
    assert check(Ledger(tmp_path / "none.db"), log=_log({0: []}), allow_empty=True).ok


def test_a_commit_that_disappears_went_backwards(ledger: Ledger) -> None:
    _run(ledger, PARTS)
    log = _log(PARTS)
    assert check(ledger, log=log, commits=[{0: 4}, {0: -1001}]).non_monotonic \
        == [(0, 4, -1001)]
    timed = [CommitSample(2.0, {0: 4, 1: -1001}, 1.9), CommitSample(3.0, {0: -1001, 1: 2}, 2.9)]
    assert check(ledger, log=log, commits=timed).non_monotonic == [(0, 4, -1001)]


def test_overlapping_readings_are_not_compared(ledger: Ledger) -> None:
    """Two readings in flight at once may answer in either order: only a reading asked for
    after another returned can show the position going backwards."""
    _run(ledger, PARTS)
    log = _log(PARTS)
    slow = CommitSample(3.0, {0: 4}, 1.0)  # asked at 1, answered at 3
    quick = CommitSample(2.5, {0: 3}, 2.0)  # asked while the slow one was in flight
    assert check(ledger, log=log, commits=[slow, quick]).non_monotonic == []
    after = CommitSample(5.0, {0: 3}, 4.0)  # asked once the slow one had answered 4
    assert check(ledger, log=log, commits=[slow, quick, after]).non_monotonic == [(0, 4, 3)]


def test_skips_are_judged_against_the_highest_position_read_back(ledger: Ledger) -> None:
    _run(ledger, {0: [0, 1]})
    samples = [CommitSample(2.0, {0: 4}, 1.9), CommitSample(3.0, {0: 2}, 2.9)]
    report = check(ledger, log=_log({0: [0, 1, 2, 3]}), commits=samples)
    assert report.skipped == [(0, 2), (0, 3)]


def test_check_needs_something_to_judge_against(ledger: Ledger) -> None:
    with pytest.raises(ValueError, match="log or the expected"):
        check(ledger)


def test_record_key_prefers_activity_ids() -> None:
    hs = (("kw-workflow-id", b"wf-1"), ("kw-activity-id", b"charge"))
    assert record_key(hs, b"whatever") == "wf-1/charge"
    assert record_key((), b"42") == "42"


# ---------------------------------------------------------------------- in a store's transaction


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TransactionalStore[Any]]:
    table = f"kwt_{uuid.uuid4().hex[:10]}"
    if request.param == "sqlite":
        s: TransactionalStore[Any] = SqliteStore(tmp_path / "store.db", table=table)
    else:
        dsn = os.environ.get("KWORKERS_PG_DSN")
        if not dsn:
            pytest.skip("KWORKERS_PG_DSN is unset (source scripts/services.sh; ensure_postgres)")
        from kworkers.idempotency.postgres import PostgresStore

        s = PostgresStore(dsn, table=table)
    yield s
    if request.param == "postgres":
        with s.atomic() as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}", ())
    s.close()


def test_effects_in_the_store_transaction_commit_and_roll_back_with_it(
        store: TransactionalStore[Any]) -> None:
    table = f"kwl_{uuid.uuid4().hex[:10]}"
    ledger = Ledger.on_store(store, table=table)
    try:
        assert store.apply_once("k1", lambda conn: ledger.apply_in(conn, "k1"))
        assert not store.apply_once("k1", lambda conn: ledger.apply_in(conn, "k1"))

        def boom(conn: Any) -> None:
            ledger.apply_in(conn, "k2")
            raise RuntimeError("the effect failed after writing its row")

        with pytest.raises(RuntimeError):
            store.apply_once("k2", boom)
        assert ledger.applications() == {"k1": 1}  # k2's row rolled back with the effect
        ledger.apply("k1")  # an application outside the store (lease mode): appended, counted
        assert ledger.applications() == {"k1": 2}
        assert check(ledger, expected={"k1"}).duplicates == {"k1": 2}
    finally:
        ledger.drop()


def test_a_standalone_ledger_has_no_unique_key(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.db")
    ledger.apply("k")
    ledger.apply("k")
    conn = sqlite3.connect(tmp_path / "l.db")
    sql = " ".join(r[0] for r in conn.execute("SELECT sql FROM sqlite_master"))
    assert "UNIQUE" not in sql.upper() and "PRIMARY" not in sql.upper()
    assert ledger.effect_values() == ["k", "k"]
    assert ledger.counts() == (0, 2)


def test_recording_invoker_records_before_the_inner_invoker(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.db")
    seen: list[int] = []

    def inner(handler: Any, msg: Message) -> None:
        seen.append(ledger.counts()[0])  # the delivery row is already there

    RecordingInvoker(ledger, inner)(lambda m: None, _msg(0, 5))
    assert seen == [1]
    (d,) = ledger.deliveries()
    assert (d.key, d.topic, d.partition, d.offset, d.pid) == ("p0o5", T, 0, 5, os.getpid())


def test_kill_point_spec_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="KEY@STEP"):
        KillPoint("k@sometime", tmp_path)
    with pytest.raises(ValueError, match="markers"):
        KillPoint("k@after-effect", None)
    kp = KillPoint("k@after-effect", tmp_path)
    kp.at("before-effect", "k")  # another step: no kill
    kp.at("after-effect", "other")  # another key: no kill
    assert not kp.fired()
    (tmp_path / "killed-k").write_text("1")  # fired in an earlier process
    kp.at("after-effect", "k")  # already fired: goes on
    assert kp.fired()
