"""The embedded default: one SQLite file, safe across threads and processes on one host.

Why these settings: WAL lets readers (``details``, ``is_done``) run while a writer holds the
lock; every write opens with ``BEGIN IMMEDIATE``, which takes the database's write lock *before*
reading, so read-decide-write cannot interleave between two processes (a plain ``BEGIN`` would
let both read "free" and then one fail to upgrade, or worse, both decide). ``synchronous=FULL``
because a done-mark that a power cut can undo is an effect applied twice. Writers wait up to
``busy_timeout_s`` for the lock; keep transactional effects short, they serialize every claim
on the file.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

from kworkers.errors import ConfigError
from kworkers.idempotency.sql import TURN_COLUMNS, SqlLeaseStore
from kworkers.sqlbase import SQLITE, PerThread

if TYPE_CHECKING:
    from kworkers.pace.bucket import BucketStore

__all__ = ["SqliteStore"]


class SqliteStore(SqlLeaseStore[sqlite3.Connection]):
    """Idempotency keys in the SQLite file ``path`` (created with its table on first use)."""

    dialect: Literal["sqlite"] = "sqlite"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        table: str = "kworkers_idempotency",
        busy_timeout_s: float = 30.0,
    ) -> None:
        self.path = os.fspath(path)
        if self.path == ":memory:" or self.path.startswith("file::memory:"):
            raise ConfigError(
                "SqliteStore needs a file: each thread has its own connection, and an "
                "in-memory database is private to one connection"
            )
        if busy_timeout_s <= 0:
            raise ConfigError(f"busy_timeout_s must be > 0, got {busy_timeout_s!r}")
        self._timeout = busy_timeout_s
        super().__init__(table, PerThread(self._connect, sqlite3.Connection.close))

    @classmethod
    def from_url(cls, url: str) -> SqliteStore:
        """``sqlite:///abs/path.db`` or ``sqlite:relative.db`` (``open_store``)."""
        rest = url.partition(":")[2]
        path = rest[2:] if rest.startswith("//") else rest
        if not path:
            raise ConfigError(f"no file in SQLite URL {url!r}")
        return cls(path)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path,
            timeout=self._timeout,
            isolation_level=None,  # we issue BEGIN IMMEDIATE / COMMIT ourselves
            check_same_thread=False,  # used by one thread, but closed by whoever closes
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._timeout * 1000)}")
            self._enable_wal(conn)
            conn.execute("PRAGMA synchronous = FULL")
            if not _has_table(conn, self.table) or _lacks_turn(conn, self.table):
                self._create_table(conn)  # a read first: no write lock unless needed
        except BaseException:
            conn.close()
            raise
        return conn

    def _enable_wal(self, conn: sqlite3.Connection) -> None:
        """WAL once per file. Switching the mode takes a lock that SQLite does not wait for
        (no busy handler), so a process opening the file while others write can see "database
        is locked": read the mode first (no lock needed) and retry the switch briefly."""
        if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
            return
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                conn.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)

    def _create_table(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                f"""CREATE TABLE IF NOT EXISTS {self.table} (
                    key TEXT PRIMARY KEY,
                    owner TEXT,
                    token INTEGER NOT NULL,
                    status TEXT NOT NULL CHECK (status IN ('leased', 'free', 'done')),
                    lease_until REAL NOT NULL,
                    details BLOB,
                    done_at REAL,
                    turn_run TEXT NOT NULL DEFAULT '',
                    turn_attempt INTEGER NOT NULL DEFAULT 0
                )"""
            )
            _add_turn_columns(conn, self.table)
            conn.execute("COMMIT")
        except BaseException:
            if _in_txn(conn):
                conn.execute("ROLLBACK")
            raise

    def rate_buckets(self) -> BucketStore:
        """Refused: the pool's replicas run on many hosts, and a file is on one."""
        raise ConfigError("a SQLite store cannot be shared across hosts")

    @contextlib.contextmanager
    def _begin(self) -> Iterator[sqlite3.Connection]:
        conn = self._conns.get()
        if _in_txn(conn):
            raise ConfigError(
                "a SqliteStore transaction is already open on this thread; do not call the "
                "store from inside transaction()/apply_once() (use the connection you were given)"
            )
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            if _in_txn(conn):
                conn.execute("ROLLBACK")
            raise
        if not _in_txn(conn):
            raise ConfigError(
                "the transaction was committed or rolled back inside the block; the effect and "
                "the done-mark are no longer atomic (do not call commit()/rollback() there)"
            )
        try:
            conn.execute("COMMIT")
        except BaseException:
            if _in_txn(conn):
                conn.execute("ROLLBACK")
            raise


def _in_txn(conn: sqlite3.Connection) -> bool:
    """A call, not the attribute, so type narrowing does not outlive the statements that change
    it."""
    return conn.in_transaction


def _has_table(conn: sqlite3.Connection, table: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).fetchone()
    return row is not None


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return SQLITE.columns(conn, table)


def _lacks_turn(conn: sqlite3.Connection, table: str) -> bool:
    return not {name for name, _ in TURN_COLUMNS} <= _columns(conn, table)


def _add_turn_columns(conn: sqlite3.Connection, table: str) -> None:
    """A table made before the turn columns gets them (inside the caller's write lock)."""
    have = _columns(conn, table)
    for name, ddl in TURN_COLUMNS:
        if name not in have:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {ddl}")
