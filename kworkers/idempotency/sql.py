"""The lease protocol and the transactional form over one SQL table, for SQLite and PostgreSQL.

Why one class for both: the two stores differ only in how they connect, begin a transaction and
lock a row (``kworkers.sqlbase.Dialect``); the decisions (``kworkers.idempotency.store``) and
the statements are here, once, so the two cannot drift apart.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any, Generic, TypeVar

from kworkers.errors import ConfigError
from kworkers.idempotency.store import (
    UNTRACKED,
    Claim,
    LeaseRow,
    Turn,
    check_fence,
    decide_claim,
    decide_complete,
    decide_heartbeat,
    decide_release,
    validate_claim_args,
)
from kworkers.sqlbase import DIALECTS, DialectName, PerThread, SqlConnection, check_identifier

__all__ = ["TURN_COLUMNS", "SqlLeaseStore", "rows_to_lease"]

SqlC = TypeVar("SqlC", bound=SqlConnection)

_COLUMNS = "owner, token, status, lease_until, details, done_at, turn_run, turn_attempt"


class SqlLeaseStore(Generic[SqlC]):
    """The lease protocol and the transactional form over one SQL table.

    The SQLite and PostgreSQL stores differ only in how they connect, begin a transaction and
    lock a row; everything else (the decisions above, the statements) is here, once. Every
    operation is read-decide-write inside one transaction with the key's row locked: a missing
    key first gets a placeholder row (token 0, free) so that even a brand-new key is locked and
    two racing claims serialize instead of both inserting.
    """

    #: which SQL the database speaks (the outbox and the workflow tables read it too)
    dialect: DialectName

    def __init__(self, table: str, conns: PerThread[SqlC]) -> None:
        self.table = check_identifier(table)
        self._conns = conns
        self._dialect = DIALECTS[self.dialect]

    # -- hooks -----------------------------------------------------------------------------

    def _begin(self) -> AbstractContextManager[SqlC]:
        raise NotImplementedError

    # -- statements ------------------------------------------------------------------------

    def _sql(self, sql: str) -> str:
        return self._dialect.sql(sql, t=self.table)

    def _lock(self, conn: SqlC, key: str, *, create: bool) -> LeaseRow | None:
        if create:
            conn.execute(
                self._sql(
                    "INSERT INTO {t} (key, owner, token, status, lease_until) "
                    "VALUES (?, NULL, 0, 'free', 0) ON CONFLICT (key) DO NOTHING"
                ),
                (key,),
            )
        cur = conn.execute(
            self._sql(f"SELECT {_COLUMNS} FROM {{t}} WHERE key = ?{self._dialect.for_update}"),
            (key,)
        )
        return rows_to_lease(cur.fetchone())

    def _store(self, conn: SqlC, key: str, row: LeaseRow) -> None:
        conn.execute(
            self._sql(
                "UPDATE {t} SET owner = ?, token = ?, status = ?, lease_until = ?, details = ?, "
                "done_at = ?, turn_run = ?, turn_attempt = ? WHERE key = ?"
            ),
            (row.owner, row.token, row.status, row.lease_until, row.details, row.done_at,
             row.run, row.attempt, key),
        )

    def _read(self, key: str) -> LeaseRow | None:
        conn = self._conns.get()
        cur = conn.execute(self._sql(f"SELECT {_COLUMNS} FROM {{t}} WHERE key = ?"), (key,))
        return rows_to_lease(cur.fetchone())

    # -- IdempotencyStore ------------------------------------------------------------------

    def claim(self, key: str, owner: str, lease_s: float, now: float,
              turn: Turn = UNTRACKED) -> Claim:
        validate_claim_args(key, owner, lease_s)
        with self._begin() as conn:
            row = self._lock(conn, key, create=True)
            claim, new = decide_claim(row, key, owner, lease_s, now, turn)
            if new is not None:
                self._store(conn, key, new)
        return claim

    def heartbeat(
        self, key: str, token: int, details: bytes | None, lease_s: float, now: float
    ) -> None:
        with self._begin() as conn:
            row = self._lock(conn, key, create=False)
            self._store(conn, key, decide_heartbeat(row, key, token, details, lease_s, now))

    def complete(self, key: str, token: int, now: float) -> None:
        with self._begin() as conn:
            new = decide_complete(self._lock(conn, key, create=False), key, token, now)
            if new is not None:
                self._store(conn, key, new)

    def release(self, key: str, token: int) -> None:
        with self._begin() as conn:
            new = decide_release(self._lock(conn, key, create=False), token)
            if new is not None:
                self._store(conn, key, new)

    def details(self, key: str) -> bytes | None:
        row = self._read(key)
        return None if row is None else row.details

    def is_done(self, key: str) -> bool:
        row = self._read(key)
        return row is not None and row.status == "done"

    def close(self) -> None:
        self._conns.close()

    # -- the transactional form ------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self, key: str, token: int, now: float | None = None) -> Iterator[SqlC]:
        with self._begin() as conn:
            row = check_fence(self._lock(conn, key, create=False), key, token, "transaction on")
            yield conn
            self._store(conn, key, replace(row, status="done", done_at=now))

    def apply_once(self, key: str, fn: Callable[[SqlC], object], now: float | None = None) -> bool:
        if not key:
            raise ConfigError("an idempotency key must not be empty")
        with self._begin() as conn:
            row = self._lock(conn, key, create=True)
            assert row is not None  # the placeholder insert guarantees a row
            if row.status == "done":
                return False
            fn(conn)
            # A new token fences out any lease holder on the key: its complete() now fails.
            self._store(conn, key, replace(row, token=row.token + 1, status="done", done_at=now))
            return True

    def atomic(self) -> AbstractContextManager[SqlC]:
        return self._begin()


#: The columns of a key's latest turn, added to tables made before them (issue #43): a row
#: without a tracked turn is never stale.
TURN_COLUMNS = (("turn_run", "TEXT NOT NULL DEFAULT ''"),
                ("turn_attempt", "INTEGER NOT NULL DEFAULT 0"))


def rows_to_lease(row: Sequence[Any] | None) -> LeaseRow | None:
    """(owner, token, status, lease_until, details, done_at, turn_run, turn_attempt) from a
    SELECT, as a LeaseRow."""
    if row is None:
        return None
    owner, token, status, lease_until, details, done_at, run, attempt = row
    if status not in ("leased", "free", "done"):
        raise ConfigError(f"corrupt idempotency row: status {status!r}")
    return LeaseRow(
        owner=owner,
        token=int(token),
        status=status,
        lease_until=float(lease_until),
        details=None if details is None else bytes(details),
        done_at=None if done_at is None else float(done_at),
        run=str(run or ""),
        attempt=int(attempt or 0),
    )
