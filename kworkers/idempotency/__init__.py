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

from dataclasses import dataclass
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
    "BACKENDS",
    "Backend",
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

@dataclass(frozen=True, slots=True)
class Backend:
    """One store backend: the URL schemes that name it and where its class lives (imported on
    first use: its driver is optional). The class opens itself from a URL (``from_url``) and
    says what it can do (``kworkers.idempotency.capabilities``), so a new backend is its module
    and one row of ``BACKENDS``."""

    schemes: tuple[str, ...]
    module: str
    cls: str

    def load(self) -> type[Any]:
        import importlib

        loaded: type[Any] = getattr(importlib.import_module(self.module), self.cls)
        return loaded


BACKENDS = (
    Backend(("sqlite",), "kworkers.idempotency.sqlite", "SqliteStore"),
    Backend(("postgresql", "postgres"), "kworkers.idempotency.postgres", "PostgresStore"),
    Backend(("redis", "rediss", "unix"), "kworkers.idempotency.redis", "RedisStore"),
)
_BY_SCHEME = {scheme: b for b in BACKENDS for scheme in b.schemes}
_LAZY = {b.cls: b for b in BACKENDS}


def __getattr__(name: str) -> Any:
    """Load the optional-driver backends on first use (``from kworkers.idempotency import
    PostgresStore`` works without psycopg installed until it is actually touched)."""
    backend = _LAZY.get(name)
    if backend is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return backend.load()


def open_store(url: str) -> IdempotencyStore:
    """The store a URL names, so configuration is one string:

    ``sqlite:///abs/path.db`` or ``sqlite:relative.db``, ``postgresql://...`` (or
    ``postgres://``), ``redis://...`` / ``rediss://...`` / ``unix://...``.
    """
    scheme, sep, _ = url.partition(":")
    if not sep:
        raise ConfigError(f"not a store URL: {url!r} (expected sqlite:, postgresql:, redis:)")
    backend = _BY_SCHEME.get(scheme.lower())
    if backend is None:
        raise ConfigError(f"unknown store URL scheme {scheme.lower()!r} in {url!r}")
    store: IdempotencyStore = backend.load().from_url(url)
    return store
