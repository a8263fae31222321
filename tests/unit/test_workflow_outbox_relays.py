"""Many relays on one outbox table: each record sent, none by two live relays, order per key.

Every worker replica of a workflow engine runs a relay on the same table, so the relay claims
rows with a lease (``FOR UPDATE SKIP LOCKED`` on PostgreSQL). The checks read back what the
relays sent (a send log) and what is left in the table.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator, Sequence
from typing import Any, cast

import pytest

from kworkers.clock import FakeClock
from kworkers.idempotency import Outbox, OutboxRecord
from kworkers.message import Headers
from tests.unit.test_idempotency_contract import Spec, make_spec

SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture(params=["sqlite", "postgres"])
def spec(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Spec]:
    s = make_spec(request.param, tmp_path)
    yield s
    if s.kind == "postgres":
        import psycopg

        with psycopg.connect(s.url, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {s.name}_outbox, {s.name}")


def _outbox(spec: Spec, clock: FakeClock | None = None, lease_s: float = 30.0) -> Outbox:
    store: Any = spec.open()
    return Outbox(store, table=spec.name + "_outbox", clock=clock, lease_s=lease_s)


def _enqueue(box: Outbox, rows: Sequence[tuple[bytes | None, bytes]]) -> None:
    with box.store.atomic() as conn:
        for key, value in rows:
            box.enqueue(conn, "t", key, value)


class Log:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes | None, bytes | None]] = []
        self.lock = threading.Lock()

    def __call__(self, topic: str, key: bytes | None, value: bytes | None,
                 headers: Headers) -> None:
        with self.lock:
            self.sent.append((key, value))


def test_a_live_claim_keeps_other_relays_off(spec: Spec) -> None:
    clock = FakeClock(1000.0)
    _check_live_claim_keeps_others_off(_outbox(spec, clock), _outbox(spec, clock))


def _check_live_claim_keeps_others_off(a: Outbox, b: Outbox) -> None:
    _enqueue(a, [(b"k1", b"1"), (b"k2", b"2")])
    got_a = a.claim(1)
    assert [r.value for r in got_a] == [b"1"]
    got_b = b.claim(10)
    assert [r.value for r in got_b] == [b"2"]  # k1 is A's until its lease lapses
    assert b.claim(10) == []
    assert len(a.pending()) == 2  # claimed, not sent: still pending


def test_only_the_head_of_a_key_is_claimable(spec: Spec) -> None:
    clock = FakeClock(1000.0)
    _check_only_heads_are_claimable(_outbox(spec, clock), _outbox(spec, clock))


def _check_only_heads_are_claimable(a: Outbox, b: Outbox) -> None:
    _enqueue(a, [(b"k", b"k1"), (b"j", b"j1"), (b"k", b"k2"), (b"k", b"k3"), (None, b"n")])
    assert [r.value for r in a.claim(1)] == [b"k1"]
    # k2 and k3 wait behind A's k1 whatever B asks for; the unkeyed row has no order to keep
    assert [r.value for r in b.claim(10)] == [b"j1", b"n"]
    log = Log()
    assert b.relay_once(log) == 0  # B's own claims are live, nothing new to claim
    a.release([r.id for r in a.pending() if r.value == b"k1"])
    assert b.relay_once(log, limit=10) == 3  # the head and the rows queued behind it
    assert log.sent == [(b"k", b"k1"), (b"k", b"k2"), (b"k", b"k3")]


def test_a_dead_relays_rows_are_sent_after_its_lease(spec: Spec) -> None:
    clock = FakeClock(1000.0)
    a, b = _outbox(spec, clock, lease_s=10), _outbox(spec, clock, lease_s=10)
    _enqueue(a, [(b"k", b"1"), (b"k", b"2")])
    assert len(a.claim(10)) == 2  # ... and A dies before sending
    log = Log()
    assert b.relay_once(log) == 0
    clock.advance(10.0)
    assert b.relay_once(log) == 2
    assert log.sent == [(b"k", b"1"), (b"k", b"2")]
    assert a.pending() == []


def test_a_failed_send_releases_the_rest_at_once(spec: Spec) -> None:
    clock = FakeClock(1000.0)
    a, b = _outbox(spec, clock), _outbox(spec, clock)
    _enqueue(a, [(b"k", b"1"), (b"k", b"2"), (b"j", b"3")])
    calls = []

    def flaky(topic: str, key: bytes | None, value: bytes | None, headers: Headers) -> None:
        calls.append(value)
        if value == b"2":
            raise ConnectionError("broker did not acknowledge")

    with pytest.raises(ConnectionError):
        a.relay_once(flaky)
    assert calls == [b"1", b"2"]
    log = Log()
    assert b.relay_once(log) == 2  # no waiting out A's lease
    assert sorted(cast(bytes, v) for _k, v in log.sent) == [b"2", b"3"]


def test_an_old_table_gets_the_lease_columns(spec: Spec) -> None:
    store: Any = spec.open()
    table = spec.name + "_outbox"
    pg = spec.kind == "postgres"
    with store.atomic() as conn:
        ident = "BIGSERIAL PRIMARY KEY" if pg else "INTEGER PRIMARY KEY AUTOINCREMENT"
        blob = "BYTEA" if pg else "BLOB"
        conn.execute(f"CREATE TABLE {table} (id {ident}, topic TEXT NOT NULL, key {blob}, "
                     f"value {blob}, headers TEXT NOT NULL)", ())
        conn.execute(f"INSERT INTO {table} (topic, key, value, headers) VALUES "
                     f"('t', NULL, NULL, '[]')", ())
    box = Outbox(store, table=table)
    log = Log()
    assert box.relay_once(log) == 1


def _relay_process(spec: Spec, out: Any, sends: Any) -> None:
    box = _outbox(spec)

    def send(topic: str, key: bytes | None, value: bytes | None, headers: Headers) -> None:
        # the send's place among all relays' sends, taken when it happens: the queue's order
        # is not it (each process's feeder thread flushes when it is scheduled: under load a
        # relay's earlier put arrived after another relay's later one, 2026-12-05)
        with sends.get_lock():
            sends.value += 1
            out.put((sends.value, key, value))

    while True:
        if box.relay_once(send, limit=7) == 0 and not box.pending(1):
            break


def test_three_relay_processes_send_each_record_once_in_key_order(spec: Spec) -> None:
    box = _outbox(spec)
    rows = [(f"k{i % 5}".encode(), f"{i % 5}:{i // 5}".encode()) for i in range(200)]
    for start in range(0, len(rows), 50):
        _enqueue(box, rows[start:start + 50])
    q, sends = SPAWN.Queue(), SPAWN.Value("q", 0)
    procs = [SPAWN.Process(target=_relay_process, args=(spec, q, sends)) for _ in range(3)]
    for p in procs:
        p.start()
    sent = [(key, value) for _n, key, value in sorted(q.get(timeout=120) for _ in range(200))]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert sorted(v for _k, v in sent) == sorted(v for _k, v in rows)  # each exactly once
    for k in range(5):
        seq = [int(v.split(b":")[1]) for key, v in sent if key == f"k{k}".encode()]
        assert seq == sorted(seq), f"key k{k} went out of order: {seq}"
    assert box.pending() == []


def test_relay_forever_wakes_early_and_survives_errors(spec: Spec) -> None:
    box = _outbox(spec)
    stop, wake = threading.Event(), threading.Event()
    log = Log()
    failures = [1]

    def send(topic: str, key: bytes | None, value: bytes | None, headers: Headers) -> None:
        if failures:
            failures.pop()
            raise ConnectionError("broker down")
        log(topic, key, value, headers)
        stop.set()

    t = threading.Thread(target=box.relay_forever, args=(send, stop),
                         kwargs={"idle_s": 600.0, "wake": wake})
    t.start()
    _enqueue(box, [(b"k", b"v")])
    wake.set()
    t.join(60)
    assert not t.is_alive()
    assert log.sent == [(b"k", b"v")]


class _NoLeaseOutbox(Outbox):
    """Canary: the relay before claims (every relay takes every pending row)."""

    def claim(self, limit: int = 100) -> list[OutboxRecord]:
        return self.pending(limit)


class _AnyRowOutbox(Outbox):
    """Canary: leases on rows, but any row is claimable, not only the head of its key."""

    def claim(self, limit: int = 100) -> list[OutboxRecord]:
        now = self.clock.now()
        with self.store.atomic() as conn:
            rows = conn.execute(self._sql(
                "SELECT id FROM {t} WHERE lease_until <= ? ORDER BY id LIMIT ?"), (now, limit)
            ).fetchall()
            ids = [int(r[0]) for r in rows]
            for i in ids:
                conn.execute(self._sql("UPDATE {t} SET lease_until = ? WHERE id = ?"),
                             (now + self.lease_s, i))
        return [r for r in self.pending(1000) if r.id in ids]


@pytest.mark.parametrize(("variant", "check"), [
    (_NoLeaseOutbox, _check_live_claim_keeps_others_off),
    (_AnyRowOutbox, _check_only_heads_are_claimable),
], ids=["no-lease", "any-row"])
def test_canary_the_checks_catch_a_broken_claim(spec: Spec, variant: type[Outbox],
                                                check: Any) -> None:
    clock = FakeClock(1000.0)
    store: Any = spec.open()
    table = spec.name + "_outbox"
    a = variant(store, table=table, clock=clock)
    b = variant(spec.open(), table=table, clock=clock)  # type: ignore[arg-type]
    with pytest.raises(AssertionError):
        check(a, b)
