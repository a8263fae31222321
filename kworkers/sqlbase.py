"""What every SQL user in kworkers shares: the dialect, one connection per thread, plain names.

Why one module below both ``idempotency/`` and ``pace/``: the stores (``idempotency``), the
pool's rate buckets (``pace.postgres``), the outbox, the workflow tables and the test ledger all
speak SQLite or PostgreSQL. Their SQL differs in a few words (the parameter marker, the float
and blob types, a serial key, row locks, how to read a table's columns, how to serialize
concurrent ``CREATE ... IF NOT EXISTS``). Each difference is one field of a ``Dialect`` here, so
a table's code is written once and a new SQL backend is one more ``Dialect`` value, not an
``if postgres`` in every table. Below both folders so a store can hand out its pool's rate
buckets (``pace``) while ``pace`` reuses the connection plumbing without a two-way tie.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar

from kworkers.errors import ConfigError

__all__ = ["DIALECTS", "POSTGRES", "SQLITE", "Dialect", "DialectName", "PerThread",
           "SqlConnection", "check_identifier"]

DialectName = Literal["sqlite", "postgres"]


class SqlConnection(Protocol):
    """The part of a DB-API connection the outbox and the effect callbacks rely on; both
    ``sqlite3.Connection`` and ``psycopg.Connection`` fit."""

    def execute(self, sql: str, params: Sequence[Any], /) -> Any: ...


@dataclass(frozen=True, slots=True)
class Dialect:
    """The words in which one SQL database differs from the other; everything else is shared.

    ``mark``: the driver's parameter marker (statements are written with ``?``). ``real``,
    ``blob``: the float and bytes column types. ``serial``: an auto-numbered primary key.
    ``for_update``: appended to a SELECT that locks its rows until the transaction ends
    (SQLite: nothing, a write transaction holds the whole database). ``skip_locked``: the same,
    passing over rows another transaction locked (so relays never wait for each other).
    ``ddl_lock``: taken (one parameter: a name) before first-use ``CREATE ... IF NOT EXISTS``,
    which races with itself on PostgreSQL (a duplicate pg_type row); "" where the transaction
    already serializes it (SQLite's ``BEGIN IMMEDIATE``). ``columns_sql``: the column names of
    the table named by its one parameter (a table made by an older version gets the new ones).
    """

    name: DialectName
    mark: str
    real: str
    blob: str
    serial: str
    for_update: str
    skip_locked: str
    ddl_lock: str
    columns_sql: str

    def sql(self, text: str, **names: str) -> str:
        """``text`` with ``?`` as this driver's marker and each ``{name}`` as its table name
        (names are spliced in: give only ``check_identifier``'d ones)."""
        for key, value in names.items():
            text = text.replace("{" + key + "}", value)
        return text.replace("?", self.mark) if self.mark != "?" else text

    def lock_ddl(self, conn: SqlConnection, name: str) -> None:
        """Serialize first-use table creation under ``name`` in the caller's transaction."""
        if self.ddl_lock:
            conn.execute(self.ddl_lock, (name,))

    def columns(self, conn: SqlConnection, table: str) -> set[str]:
        """The column names ``table`` has."""
        return {str(r[0]) for r in conn.execute(self.columns_sql, (table,)).fetchall()}


SQLITE = Dialect("sqlite", mark="?", real="REAL", blob="BLOB",
                 serial="INTEGER PRIMARY KEY AUTOINCREMENT", for_update="", skip_locked="",
                 ddl_lock="", columns_sql="SELECT name FROM pragma_table_info(?)")
POSTGRES = Dialect("postgres", mark="%s", real="DOUBLE PRECISION", blob="BYTEA",
                   serial="BIGSERIAL PRIMARY KEY", for_update=" FOR UPDATE",
                   skip_locked=" FOR UPDATE SKIP LOCKED",
                   ddl_lock="SELECT pg_advisory_xact_lock(hashtext(%s))",
                   columns_sql="SELECT column_name FROM information_schema.columns "
                               "WHERE table_name = %s AND table_schema = current_schema()")
#: A store's ``dialect`` name -> its ``Dialect``.
DIALECTS: dict[str, Dialect] = {d.name: d for d in (SQLITE, POSTGRES)}

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def check_identifier(name: str, what: str = "table") -> str:
    """Table names are spliced into SQL, so only plain identifiers are accepted."""
    if not _IDENT.fullmatch(name):
        raise ConfigError(f"{what} name {name!r} is not a plain SQL identifier")
    return name


C = TypeVar("C")


class PerThread(Generic[C]):
    """One connection per thread (and per process), all closed together.

    Why per thread: handlers run on worker threads, and a transaction that holds the effect and
    the done-mark must own its connection for its whole length; a shared connection would mix
    two handlers' statements into one transaction. Why per process: a forked child must not
    talk over its parent's socket or SQLite handle.
    """

    def __init__(
        self,
        factory: Callable[[], C],
        closer: Callable[[C], None],
        alive: Callable[[C], bool] = lambda _c: True,
    ) -> None:
        self._factory = factory
        self._closer = closer
        self._alive = alive
        self._local = threading.local()
        self._all: list[C] = []
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()

    def get(self) -> C:
        if os.getpid() != self._pid:  # forked: forget (never close) the parent's connections
            with self._lock:
                self._pid, self._all, self._local = os.getpid(), [], threading.local()
        conn: C | None = getattr(self._local, "conn", None)
        if conn is not None and not self._alive(conn):
            self._discard(conn)
            conn = None
        if conn is None:
            with self._lock:
                if self._closed:
                    raise ConfigError("the idempotency store is closed")
            conn = self._factory()
            with self._lock:
                self._all.append(conn)
            self._local.conn = conn
        return conn

    def _discard(self, conn: C) -> None:
        self._local.conn = None
        with self._lock:
            if conn in self._all:
                self._all.remove(conn)
        with contextlib.suppress(Exception):
            self._closer(conn)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._all = self._all, []
        for conn in conns:
            with contextlib.suppress(Exception):  # best effort: nothing left to protect
                self._closer(conn)
