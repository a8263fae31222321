"""What a store can do beyond the lease, asked of the store itself, refused in one line.

Every backend has the lease (``IdempotencyStore``). The rest depends on the database:

==================================  ======  ==========  =====
capability                          SQLite  PostgreSQL  Redis
==================================  ======  ==========  =====
transactional apply, outbox,        yes     yes         no
workflow tables (``require_sql``)
the pool's rate buckets             no      yes         yes
(``store.rate_buckets()``)
==================================  ======  ==========  =====

Why here and not at each caller: the engine, ``kworkers workflow``, the console and the worker
each needed "is this a SQL store", and asked it each their own way (a ``getattr`` of
``dialect``), with four wordings of the refusal; the rate limit looked the store's type up in
``sys.modules``. Now a store answers: a SQL store names its ``dialect`` (the
``TransactionalStore`` protocol), a store that can hold the pool's buckets has
``rate_buckets()`` (raising ``ConfigError`` with its reason when it cannot), and callers ask
through the functions below. A new backend declares what it has; no caller changes.
"""

from __future__ import annotations

from typing import Any

from kworkers.errors import ConfigError
from kworkers.idempotency.store import TransactionalStore
from kworkers.sqlbase import DIALECTS, Dialect

__all__ = ["dialect_of", "is_sql", "require_sql"]


def is_sql(store: object) -> bool:
    """True when ``store`` keeps its keys in a SQL database (SQLite or PostgreSQL), so an
    effect, an outbox row or a workflow checkpoint can share its transactions."""
    return getattr(store, "dialect", None) in DIALECTS


def require_sql(store: object, what: str, why: str = "") -> TransactionalStore[Any]:
    """``store`` as a ``TransactionalStore``; a one-line ``ConfigError`` naming ``what`` needs
    it (and ``why``) when it is not one."""
    if is_sql(store):
        sql: TransactionalStore[Any] = store  # type: ignore[assignment]  # checked just above
        return sql
    because = f": {why}" if why else ""
    raise ConfigError(f"{what}: needs a SQL store (SqliteStore or PostgresStore; a sqlite: "
                      f"or postgresql: URL), not a {type(store).__name__}{because}")


def dialect_of(store: TransactionalStore[Any]) -> Dialect:
    """The SQL ``store``'s database speaks (``kworkers.sqlbase.Dialect``)."""
    return DIALECTS[store.dialect]
