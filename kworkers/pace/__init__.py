"""Rate limits: ``Worker(rate_limit=RateLimit(per_second=100))`` keeps a downstream under its
quota, for the whole pool through the store it already has (``kworkers.pace.limit`` for the
promise, ``kworkers.pace.pacer`` for how records wait).

Pure at import: the store clients (psycopg, redis) load only when a shared bucket is opened.
"""

from __future__ import annotations

import sys
from typing import Any

from kworkers.clock import Clock
from kworkers.errors import ConfigError
from kworkers.pace.bucket import BucketStore, Grant, LocalBuckets, decide
from kworkers.pace.limit import RateLimit

__all__ = ["BucketStore", "Grant", "LocalBuckets", "RateLimit", "buckets_for", "decide",
           "open_buckets"]


def open_buckets(url: str) -> BucketStore:
    """The shared buckets a store URL names: ``postgresql://...`` or ``redis://...``."""
    scheme = url.partition(":")[0].lower()
    if scheme in ("postgresql", "postgres"):
        from kworkers.pace.postgres import PostgresBuckets

        return PostgresBuckets(url)
    if scheme in ("redis", "rediss", "unix"):
        from kworkers.pace.redis import RedisBuckets

        return RedisBuckets(url)
    if scheme == "sqlite":
        raise ConfigError("rate_limit: a SQLite file cannot be shared across hosts; give a "
                          "PostgreSQL or Redis store, or scope='replica' (each process its own "
                          "limit)")
    raise ConfigError(f"rate_limit: not a PostgreSQL or Redis URL: {url!r}")


def buckets_for(limit: RateLimit, clock: Clock, rate_store: BucketStore | None,
                idempotency: Any) -> BucketStore:
    """Where ``limit``'s buckets live: the process for ``scope="replica"``; for the pool,
    ``rate_store`` when given, else the worker's idempotency store (PostgreSQL or Redis),
    else a ``ConfigError`` saying what to give."""
    if limit.scope == "replica":
        if rate_store is not None:
            raise ConfigError("rate_limit.scope='replica' keeps its bucket in the process: "
                              "rate_store is for scope='pool'")
        return LocalBuckets(clock)
    if rate_store is not None:
        return rate_store
    # Only a store already made can be one of these, so its module is loaded already: a
    # look in sys.modules keeps the clients unimported for everyone else.
    pg = sys.modules.get("kworkers.idempotency.postgres")
    if pg is not None and isinstance(idempotency, pg.PostgresStore):
        return open_buckets(idempotency.dsn)
    rd = sys.modules.get("kworkers.idempotency.redis")
    if rd is not None and isinstance(idempotency, rd.RedisStore):
        return open_buckets(idempotency.url)
    from kworkers.idempotency.sqlite import SqliteStore

    where = ("a SQLite store cannot be shared across hosts"
             if isinstance(idempotency, SqliteStore)
             else "the worker has no PostgreSQL or Redis store")
    raise ConfigError(f"rate_limit.scope='pool' shares one bucket across the pool's replicas, "
                      f"but {where}: give Worker(idempotency=PostgresStore(...) or "
                      "RedisStore(...)), or rate_store=kworkers.pace.open_buckets(url), or "
                      "set rate_limit.scope='replica' (each process its own limit)")
