"""Idempotent receivers: apply each activity's effect once, however often it is delivered.

Delivery is at least once, so the effect is keyed by ``"<workflow_id>/<activity_id>"`` (the same
on every attempt) and the receiver remembers keys. Two forms, pick one per key:

* **Lease** (any backend): ``claim`` -> work, ``heartbeat`` with checkpoint details ->
  ``complete``; ``release`` on failure. A worker that dies mid-effect loses its lease when it
  expires and the next attempt takes over with a higher fencing token and the last details.
* **Transactional** (SQL backends): ``store.transaction(key, token)`` or ``apply_once(key, fn)``
  runs the effect SQL and the done-mark in one transaction, so a crash leaves neither. The
  ``Outbox`` puts records to produce into that same transaction.

Backends: ``SqliteStore`` (embedded default), ``PostgresStore``, ``RedisStore``; ``open_store``
picks one from a URL. What a backend can do beyond the lease it says itself
(``kworkers.idempotency.capabilities``: ``require_sql``, ``store.rate_buckets()``). The
PostgreSQL and Redis modules import their drivers (psycopg, redis), which are optional, so they
load only when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kworkers.errors import ConfigError
from kworkers.idempotency.capabilities import dialect_of, is_sql, require_sql
from kworkers.idempotency.outbox import Outbox, OutboxRecord, RelayObserver, Send
from kworkers.idempotency.sqlite import SqliteStore
from kworkers.idempotency.store import (
    Claim,
    ClaimState,
    IdempotencyStore,
    SqlConnection,
    TransactionalStore,
    Turn,
)

if TYPE_CHECKING:
    from kworkers.idempotency.postgres import PostgresStore
    from kworkers.idempotency.redis import RedisStore

__all__ = [
    "Claim",
    "ClaimState",
    "IdempotencyStore",
    "Outbox",
    "OutboxRecord",
    "PostgresStore",
    "RedisStore",
    "RelayObserver",
    "Send",
    "SqlConnection",
    "SqliteStore",
    "TransactionalStore",
    "Turn",
    "dialect_of",
    "is_sql",
    "open_store",
    "require_sql",
]

_LAZY = {
    "PostgresStore": "kworkers.idempotency.postgres",
    "RedisStore": "kworkers.idempotency.redis",
}


def __getattr__(name: str) -> Any:
    """Load the optional-driver backends on first use (``from kworkers.idempotency import
    PostgresStore`` works without psycopg installed until it is actually touched)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def open_store(url: str) -> IdempotencyStore:
    """The store a URL names, so configuration is one string:

    ``sqlite:///abs/path.db`` or ``sqlite:relative.db``, ``postgresql://...`` (or
    ``postgres://``), ``redis://...`` / ``rediss://...`` / ``unix://...``.
    """
    scheme, sep, rest = url.partition(":")
    scheme = scheme.lower()
    if not sep:
        raise ConfigError(f"not a store URL: {url!r} (expected sqlite:, postgresql:, redis:)")
    if scheme == "sqlite":
        path = rest[2:] if rest.startswith("//") else rest
        if not path:
            raise ConfigError(f"no file in SQLite URL {url!r}")
        return SqliteStore(path)
    if scheme in ("postgresql", "postgres"):
        from kworkers.idempotency.postgres import PostgresStore

        return PostgresStore(url)
    if scheme in ("redis", "rediss", "unix"):
        from kworkers.idempotency.redis import RedisStore

        return RedisStore(url)
    raise ConfigError(f"unknown store URL scheme {scheme!r} in {url!r}")
