"""Idempotency keys in PostgreSQL (psycopg 3): one table, row locks, shared by many hosts.

Why row locks: each operation runs ``INSERT ... ON CONFLICT DO NOTHING`` (a new key gets a
placeholder row, and a concurrent insert of the same key waits for ours) and then
``SELECT ... FOR UPDATE``, so read-decide-write on a key is serialized while other keys proceed
in parallel. In ``transaction()`` that lock is held for the whole effect, which is what makes a
takeover during a slow effect impossible: the would-be successor waits, then sees DONE.

Connections are autocommit outside explicit transactions, so reads never leave a session idle
in a transaction; each thread has its own connection (see ``PerThread``), re-opened when broken.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

import psycopg
from psycopg import pq

from kworkers.errors import ConfigError
from kworkers.idempotency.sql import TURN_COLUMNS, SqlLeaseStore
from kworkers.sqlbase import POSTGRES, PerThread

if TYPE_CHECKING:
    from kworkers.pace.bucket import BucketStore

__all__ = ["PostgresStore"]

Connection = psycopg.Connection[Any]


class PostgresStore(SqlLeaseStore[Connection]):
    """Idempotency keys in table ``table`` of the database at ``dsn`` (created on first use)."""

    dialect: Literal["postgres"] = "postgres"

    def __init__(
        self,
        dsn: str,
        *,
        table: str = "kworkers_idempotency",
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.dsn = dsn
        self._connect_timeout = max(1, round(connect_timeout_s))
        super().__init__(table, PerThread(self._connect, Connection.close, _usable))

    @classmethod
    def from_url(cls, url: str) -> PostgresStore:
        """``postgresql://...`` or ``postgres://...`` (``open_store``): the URL is the DSN."""
        return cls(url)

    def _connect(self) -> Connection:
        conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=self._connect_timeout)
        try:
            with conn.transaction():
                POSTGRES.lock_ddl(conn, self.table)  # first-use creation by many workers
                conn.execute(
                    f"""CREATE TABLE IF NOT EXISTS {self.table} (
                        key TEXT PRIMARY KEY,
                        owner TEXT,
                        token BIGINT NOT NULL,
                        status TEXT NOT NULL CHECK (status IN ('leased', 'free', 'done')),
                        lease_until DOUBLE PRECISION NOT NULL,
                        details BYTEA,
                        done_at DOUBLE PRECISION,
                        turn_run TEXT NOT NULL DEFAULT '',
                        turn_attempt INTEGER NOT NULL DEFAULT 0
                    )"""
                )
                # A table made before the turn columns gets them. Looked up first: ALTER TABLE
                # locks the whole table, and would wait on every open transaction of the store.
                have = POSTGRES.columns(conn, self.table)
                for name, ddl in TURN_COLUMNS:
                    if name not in have:
                        conn.execute(
                            f"ALTER TABLE {self.table} ADD COLUMN IF NOT EXISTS {name} {ddl}")
        except BaseException:
            conn.close()
            raise
        return conn

    def rate_buckets(self) -> BucketStore:
        """The pool's shared rate buckets, in this database (``rate_limit.scope='pool'``)."""
        from kworkers.pace.postgres import PostgresBuckets

        return PostgresBuckets(self.dsn)

    @contextlib.contextmanager
    def _begin(self) -> Iterator[Connection]:
        conn = self._conns.get()
        if conn.info.transaction_status != pq.TransactionStatus.IDLE:
            raise ConfigError(
                "a PostgresStore transaction is already open on this thread; do not call the "
                "store from inside transaction()/apply_once() (use the connection you were given)"
            )
        with conn.transaction():
            yield conn


def _usable(conn: Connection) -> bool:
    return not conn.closed and not conn.broken
