"""One contract for every bucket backend: the process's, PostgreSQL's and Redis's.

The shared backends decide on the store's clock, so they are held to answers that do not
depend on when the test runs: a fresh bucket grants its capacity (rounded down), an empty one
grants nothing and says when a token comes, and threads (and processes) taking at once never
get more than ``capacity + rate * elapsed``: an upper bound, which a slow machine can only
meet more easily. Set ``KWORKERS_PG_DSN`` / ``KWORKERS_REDIS_URL`` (``source
scripts/services.sh; ensure_postgres; ensure_redis``); a URL set that does not answer fails.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from kworkers.clock import SystemClock
from kworkers.pace import BucketStore, LocalBuckets, open_buckets
from tests.unit.test_idempotency_contract import ENV, SETUP

KINDS = ["local", "postgres", "redis"]


def _url(kind: str) -> str:
    url = os.environ.get(ENV[kind], "")
    if not url:
        pytest.skip(f"{ENV[kind]} is unset: no {kind} server (source scripts/services.sh && "
                    f"{SETUP[kind]})")
    return url


def _open(kind: str, url: str, table: str) -> BucketStore:
    if kind == "postgres":
        from kworkers.pace.postgres import PostgresBuckets

        return PostgresBuckets(url, table=table)
    from kworkers.pace.redis import RedisBuckets

    return RedisBuckets(url, prefix=table + ":")


@pytest.fixture(params=KINDS)
def store(request: pytest.FixtureRequest) -> Iterator[BucketStore]:
    kind = request.param
    if kind == "local":
        yield LocalBuckets(SystemClock())
        return
    url = _url(kind)
    table = f"kwt_rate_{uuid.uuid4().hex[:8]}"
    s = _open(kind, url, table)
    try:
        s.take("ping", 1, 1.0, 1.5)
    except Exception as exc:
        pytest.fail(f"{ENV[kind]}={url} is set but the server does not answer: {exc}")
    yield s
    s.close()
    if kind == "postgres":
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")


def test_a_fresh_bucket_grants_its_capacity_and_an_empty_one_says_when(
        store: BucketStore) -> None:
    s = store
    g = s.take("a", 10, 1.0, 3.5)
    assert g.granted == 3
    g = s.take("a", 1, 1.0, 3.5)
    assert g.granted == 0 and 0 < g.retry_after <= 0.5
    time.sleep(g.retry_after + 0.02)
    assert s.take("a", 5, 1.0, 3.5).granted == 1
    assert s.take("b", 2, 1.0, 3.5).granted == 2  # buckets are apart


def _hammer(s: BucketStore, names: list[str], seconds: float) -> tuple[int, float]:
    """Threads (each with its own connection) taking from ``names`` at once: tokens got and
    the seconds from the first ask to the last answer."""
    got: list[int] = []
    spans: list[float] = []

    def take(name: str) -> None:
        n = 0
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            n += s.take(name, 3, 40.0, 4.0).granted
        got.append(n)
        spans.extend((t0, time.monotonic()))

    threads = [threading.Thread(target=take, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return sum(got), max(spans) - min(spans)


def test_takers_at_once_never_get_more_than_the_bucket_allows(
        store: BucketStore) -> None:
    s = store
    got, elapsed = _hammer(s, ["shared"] * 3, 1.0)
    assert got <= 4.0 + 40.0 * elapsed  # the bound: an upper one only
    assert got >= 20  # and the bucket was reached: the takers did get tokens
    # canary: three buckets of their own (each taker its own name) give about three times
    got, elapsed = _hammer(s, ["own0", "own1", "own2"], 1.0)
    assert got > 4.0 + 40.0 * elapsed


def test_open_buckets_names_what_it_cannot_share() -> None:
    from kworkers import ConfigError

    with pytest.raises(ConfigError, match="SQLite file cannot be shared"):
        open_buckets("sqlite:///tmp/x.db")
    with pytest.raises(ConfigError, match="not a PostgreSQL or Redis URL"):
        open_buckets("http://x")
