"""The effects ledger: an append-only record of every time an effect was applied.

Why append-only: a ledger that keys effects uniquely (a primary key, ``INSERT OR IGNORE``)
silently drops the second application of an effect, so "each effect once" holds by
construction and a broken idempotency store would still pass. Here every application appends a
row, nothing is unique, nothing is ignored; the checker (``kworkers.testing.checker``) counts
rows per key, and two rows for one key is a duplicate it reports.

The API (stable: the failure-storm, fast-leave and durable-workflow suites build on it)::

    from kworkers.testing.ledger import Ledger

    ledger = Ledger("run/ledger.db")            # standalone: its own SQLite file
    ledger = Ledger.on_store(store)             # in a TransactionalStore's own database
    ledger = Ledger.on_store(store, table="t")  # another table pair (shared PostgreSQL)

    # an effect applied outside any transaction of the store (its own transaction)
    ledger.apply(key, msg)                      # msg (kworkers.Message) is optional;
    ledger.apply(key, note="ckpt-3")            # note: any text the test wants back
    # an effect applied inside the store's transaction: the row exists iff the done-mark does
    store.apply_once(key, lambda conn: ledger.apply_in(conn, key, msg))
    # a delivery: the handler (or a RecordingInvoker) was called for a record
    ledger.delivered(key, msg)

    ledger.applications()   # {key: rows}, what the checker counts
    ledger.effect_values()  # every applied key, once per row (repeats kept)
    ledger.effects()        # [Effect(key, note, topic, partition, offset, attempt, pid, at)]
    ledger.deliveries()     # [Delivery(key, topic, partition, offset, attempt, pid, at)]
    ledger.counts()         # (delivery rows, effect rows)

    # a rebalance callback, as a test instrument saw it (instruments.RecordingConsumer)
    ledger.rebalanced("revoke", topic, partition, member="a")
    ledger.rebalances()     # [Rebalance(kind, topic, partition, member, pid, at)]

Tables: ``<table>_effects``, ``<table>_deliveries`` and ``<table>_rebalances`` (default
``kworkers_ledger_*``), created
on first use in whichever database the ledger writes to. Each row carries the writer's pid and
``time.time()``: the checker uses them to tell which process a kill interrupted and which
deliveries came after it. ``apply_in`` only writes on the connection it is given (the
``apply_once`` / ``transaction`` connection), so it commits or rolls back with the effect.

Standalone ledgers are safe across threads and processes on one host (SQLite WAL, one connection
per thread, ``busy_timeout`` 60 s).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, NamedTuple

from kworkers.idempotency.capabilities import dialect_of
from kworkers.idempotency.store import TransactionalStore
from kworkers.message import Message
from kworkers.sqlbase import SQLITE, Dialect, SqlConnection, check_identifier

__all__ = ["Delivery", "Effect", "Ledger", "Rebalance"]

DEFAULT_TABLE = "kworkers_ledger"


class Effect(NamedTuple):
    """One application of an effect (topic, partition, offset, attempt: of the record, if any)."""

    key: str
    note: str
    topic: str | None
    partition: int | None
    offset: int | None
    attempt: int | None
    pid: int
    at: float


class Delivery(NamedTuple):
    """One call of a handler for one record."""

    key: str
    topic: str
    partition: int
    offset: int
    attempt: int
    pid: int
    at: float


class Rebalance(NamedTuple):
    """One partition in one rebalance callback (``assign``, ``revoke`` or ``lost``) of one
    member (a name the test gives each consumer)."""

    kind: str
    topic: str
    partition: int
    member: str
    pid: int
    at: float



def _wal(conn: sqlite3.Connection) -> None:
    """Switch to WAL once; the switch does not wait on other processes' locks, so retry."""
    deadline = time.monotonic() + 60
    while str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
        try:
            conn.execute("PRAGMA journal_mode=WAL")
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


class _SqliteFile:
    """One connection per thread (and per process) to a standalone ledger file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._local = threading.local()
        self._pid = os.getpid()

    def _conn(self) -> sqlite3.Connection:
        if os.getpid() != self._pid:  # forked: never reuse the parent's handle
            self._pid, self._local = os.getpid(), threading.local()
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=60, isolation_level=None,
                                   check_same_thread=False)
            conn.execute("PRAGMA busy_timeout = 60000")
            _wal(conn)
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
        return conn

    @contextlib.contextmanager
    def atomic(self) -> Iterator[SqlConnection]:
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")


class Ledger:
    """Append-only effects and deliveries tables (see the module docstring for the API)."""

    #: the standalone file (None for a ledger in a store's database)
    path: str | None

    def __init__(self, path: str | os.PathLike[str], *, table: str = DEFAULT_TABLE) -> None:
        self.path = os.fspath(path)
        self._file = _SqliteFile(self.path)
        self._setup(self._file.atomic, SQLITE, table)

    @classmethod
    def on_store(cls, store: TransactionalStore[Any], *, table: str = DEFAULT_TABLE) -> Ledger:
        """A ledger in ``store``'s database, so ``apply_in`` can share its transactions."""
        self = cls.__new__(cls)
        self.path = None
        self._setup(store.atomic, dialect_of(store), table)
        return self

    def _setup(self, atomic: Callable[[], AbstractContextManager[SqlConnection]],
               dialect: Dialect, table: str) -> None:
        self.table = check_identifier(table)
        check_identifier(f"{table}_deliveries")
        check_identifier(f"{table}_rebalances")
        self._atomic = atomic
        self._d = dialect
        real = dialect.real
        with atomic() as conn:
            for stmt in (
                f"CREATE TABLE IF NOT EXISTS {{t}}_effects (key TEXT NOT NULL, note TEXT NOT NULL, "
                f"topic TEXT, "
                f"part INTEGER, off BIGINT, attempt INTEGER, pid INTEGER NOT NULL, "
                f"at {real} NOT NULL)",
                f"CREATE TABLE IF NOT EXISTS {{t}}_deliveries (key TEXT NOT NULL, "
                f"topic TEXT NOT NULL, part INTEGER NOT NULL, off BIGINT NOT NULL, "
                f"attempt INTEGER NOT NULL, pid INTEGER NOT NULL, at {real} NOT NULL)",
                f"CREATE TABLE IF NOT EXISTS {{t}}_rebalances (kind TEXT NOT NULL, "
                f"topic TEXT NOT NULL, part INTEGER NOT NULL, member TEXT NOT NULL, "
                f"pid INTEGER NOT NULL, at {real} NOT NULL)",
            ):
                conn.execute(dialect.sql(stmt, t=self.table), ())

    # -- writing ---------------------------------------------------------------------------

    def apply_in(self, conn: SqlConnection, key: str, msg: Message | None = None, *,
                 note: str = "", pid: int | None = None, at: float | None = None) -> None:
        """Append one application of ``key``'s effect on the caller's open transaction.

        ``pid`` and ``at`` default to this process and ``time.time()`` (tests of the checker
        pass them)."""
        where = (None, None, None, None) if msg is None else (
            msg.topic, msg.partition, msg.offset, msg.attempt)
        conn.execute(self._d.sql("INSERT INTO {t}_effects VALUES (?,?,?,?,?,?,?,?)",
                                 t=self.table),
                     (key, note, *where, _pid(pid), _at(at)))

    def apply(self, key: str, msg: Message | None = None, *, note: str = "",
              pid: int | None = None, at: float | None = None) -> None:
        """Append one application of ``key``'s effect in a transaction of its own."""
        with self._atomic() as conn:
            self.apply_in(conn, key, msg, note=note, pid=pid, at=at)

    def delivered(self, key: str, msg: Message, *, pid: int | None = None,
                  at: float | None = None) -> None:
        """Append one delivery of ``msg`` (whose effect is keyed ``key``)."""
        with self._atomic() as conn:
            conn.execute(
                self._d.sql("INSERT INTO {t}_deliveries VALUES (?,?,?,?,?,?,?)", t=self.table),
                (key, msg.topic, msg.partition, msg.offset, msg.attempt, _pid(pid), _at(at)))

    def rebalanced(self, kind: str, topic: str, partition: int, *, member: str = "",
                   pid: int | None = None, at: float | None = None) -> None:
        """Append one partition of one rebalance callback (``assign``/``revoke``/``lost``)."""
        with self._atomic() as conn:
            conn.execute(
                self._d.sql("INSERT INTO {t}_rebalances VALUES (?,?,?,?,?,?)", t=self.table),
                (kind, topic, partition, member, _pid(pid), _at(at)))

    # -- reading ---------------------------------------------------------------------------

    def _rows(self, sql: str) -> list[tuple[Any, ...]]:
        with self._atomic() as conn:
            return [tuple(r) for r in
                    conn.execute(self._d.sql(sql, t=self.table), ()).fetchall()]

    def applications(self) -> dict[str, int]:
        """How many times each key's effect was applied (keys never applied are absent)."""
        return {str(k): int(n) for k, n in
                self._rows("SELECT key, COUNT(*) FROM {t}_effects GROUP BY key")}

    def effect_values(self) -> list[str]:
        """Every applied key, once per application, in the order they were applied."""
        return [str(r[0]) for r in self._rows("SELECT key FROM {t}_effects ORDER BY at")]

    def effects(self) -> list[Effect]:
        """Every application, in the order applied."""
        return [Effect(str(k), str(n), t, None if p is None else int(p),
                       None if o is None else int(o), None if a is None else int(a), int(pid),
                       float(at))
                for k, n, t, p, o, a, pid, at in self._rows(
                    "SELECT key, note, topic, part, off, attempt, pid, at FROM {t}_effects "
                    "ORDER BY at")]

    def deliveries(self) -> list[Delivery]:
        return [Delivery(str(k), str(t), int(p), int(o), int(a), int(pid), float(at))
                for k, t, p, o, a, pid, at in self._rows(
                    "SELECT key, topic, part, off, attempt, pid, at FROM {t}_deliveries "
                    "ORDER BY at")]

    def rebalances(self) -> list[Rebalance]:
        return [Rebalance(str(k), str(t), int(p), str(m), int(pid), float(at))
                for k, t, p, m, pid, at in self._rows(
                    "SELECT kind, topic, part, member, pid, at FROM {t}_rebalances ORDER BY at")]

    def counts(self) -> tuple[int, int]:
        """(delivery rows, effect rows)."""
        d = self._rows("SELECT COUNT(*) FROM {t}_deliveries")[0][0]
        e = self._rows("SELECT COUNT(*) FROM {t}_effects")[0][0]
        return int(d), int(e)

    def drop(self) -> None:
        """Remove both tables (a shared PostgreSQL database after a test)."""
        with self._atomic() as conn:
            for suffix in ("effects", "deliveries", "rebalances"):
                conn.execute(self._d.sql(f"DROP TABLE IF EXISTS {{t}}_{suffix}",
                                         t=self.table), ())


def _pid(pid: int | None) -> int:
    return os.getpid() if pid is None else pid


def _at(at: float | None) -> float:
    return time.time() if at is None else at
