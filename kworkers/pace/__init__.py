"""Rate limits: ``Worker(rate_limit=RateLimit(per_second=100))`` keeps a downstream under its
quota, for the whole pool through the store it already has (``kworkers.pace.limit`` for the
promise, ``kworkers.pace.pacer`` for how records wait).

Pure at import: the store clients (psycopg, redis) load only when a shared bucket is opened.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from kworkers.clock import Clock
from kworkers.errors import ConfigError
from kworkers.pace.bucket import BucketStore, Grant, LocalBuckets, decide
from kworkers.pace.limit import RateLimit

__all__ = ["BucketStore", "Grant", "LocalBuckets", "RateLimit", "SharesBuckets", "buckets_for",
           "decide", "open_buckets"]


@runtime_checkable
class SharesBuckets(Protocol):
    """A store that can hold the pool's rate buckets: ``kworkers.idempotency``'s PostgreSQL and
    Redis stores; the SQLite one has the method too, and raises ``ConfigError`` saying why not
    (a file is on one host). The store answers, so nothing here knows the backends."""

    def rate_buckets(self) -> BucketStore: ...


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
    # The store says itself whether it can hold the pool's buckets (``SharesBuckets``: a
    # PostgreSQL or Redis store can, a SQLite one refuses with its reason).
    reason = "the worker has no PostgreSQL or Redis store"
    if isinstance(idempotency, SharesBuckets):
        try:
            return idempotency.rate_buckets()
        except ConfigError as exc:
            reason = str(exc)
    raise ConfigError(f"rate_limit.scope='pool' shares one bucket across the pool's replicas, "
                      f"but {reason}: give Worker(idempotency=PostgresStore(...) or "
                      "RedisStore(...)), or rate_store=kworkers.pace.open_buckets(url), or "
                      "set rate_limit.scope='replica' (each process its own limit)")
