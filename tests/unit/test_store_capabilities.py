"""Backends as capabilities (issue #48): each store says what it can do beyond the lease, a
capability it lacks is refused in one line when the thing is configured, and the public
imports of before the move keep working.

No server is needed: the PostgreSQL and Redis stores connect on first use, and nothing here
uses them."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from kworkers.clock import FakeClock
from kworkers.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_the_public_imports_of_the_stores_and_the_rate_limit_keep_working() -> None:
    """What README, docs/ and the examples import, from where they import it."""
    from kworkers.idempotency import (  # noqa: F401
        Claim,
        ClaimState,
        IdempotencyStore,
        Outbox,
        OutboxRecord,
        PostgresStore,
        RedisStore,
        SqlConnection,
        SqliteStore,
        TransactionalStore,
        Turn,
        open_store,
    )
    from kworkers.idempotency import store as store_module
    from kworkers.idempotency.outbox import Outbox as Outbox2
    from kworkers.idempotency.postgres import PostgresStore as Pg2
    from kworkers.idempotency.redis import RedisStore as Rd2
    from kworkers.idempotency.sqlite import SqliteStore as Sq2
    from kworkers.idempotency.store import PerThread, check_identifier  # noqa: F401
    from kworkers.pace import (  # noqa: F401
        BucketStore,
        LocalBuckets,
        RateLimit,
        buckets_for,
        open_buckets,
    )
    from kworkers.pace.postgres import PostgresBuckets  # noqa: F401
    from kworkers.pace.redis import RedisBuckets  # noqa: F401

    assert (PostgresStore, RedisStore, SqliteStore, Outbox) == (Pg2, Rd2, Sq2, Outbox2)
    assert store_module.SqlConnection is SqlConnection
    assert store_module.TransactionalStore is TransactionalStore
    assert check_identifier("kworkers_ok") == "kworkers_ok"


def test_each_backend_answers_what_it_can_do(tmp_path: Path) -> None:
    from kworkers.idempotency import (
        PostgresStore,
        RedisStore,
        SqliteStore,
        dialect_of,
        is_sql,
        require_sql,
    )
    from kworkers.pace.postgres import PostgresBuckets
    from kworkers.pace.redis import RedisBuckets
    from kworkers.sqlbase import POSTGRES, SQLITE

    sqlite = SqliteStore(tmp_path / "s.db")
    pg = PostgresStore("postgresql://nobody@127.0.0.1:1/none")
    rd = RedisStore("redis://127.0.0.1:1/0")
    try:
        assert (is_sql(sqlite), is_sql(pg), is_sql(rd), is_sql(None)) == (True, True, False,
                                                                            False)
        assert dialect_of(require_sql(sqlite, "x")) is SQLITE
        assert dialect_of(require_sql(pg, "x")) is POSTGRES
        with pytest.raises(ConfigError, match="SQLite store cannot be shared"):
            sqlite.rate_buckets()
        pg_buckets, rd_buckets = pg.rate_buckets(), rd.rate_buckets()
        assert isinstance(pg_buckets, PostgresBuckets) and pg_buckets.dsn == pg.dsn
        assert isinstance(rd_buckets, RedisBuckets) and rd_buckets.url == rd.url
        pg_buckets.close()
        rd_buckets.close()
    finally:
        for s in (sqlite, pg, rd):
            s.close()


def test_a_store_without_sql_is_refused_in_one_line_by_every_caller(tmp_path: Path) -> None:
    """The engine, ``kworkers workflow`` and the console's Workflows pages ask the same
    question and give the same refusal, at configuration time."""
    from click.testing import CliRunner

    from kworkers.console.workflows import WorkflowTables
    from kworkers.idempotency import RedisStore
    from kworkers.workflow import Engine, Workflow
    from kworkers.workflow.cli import workflow_cli

    url = "redis://127.0.0.1:1/0"
    refusals: list[str] = []
    with pytest.raises(ConfigError) as engine:
        redis: Any = RedisStore(url)
        Engine(redis, [Workflow("w").add(lambda ctx: None, name="x")], topic="t")
    refusals.append(str(engine.value))
    r = CliRunner().invoke(workflow_cli, ["list", "--store", url])
    assert isinstance(r.exception, ConfigError)
    refusals.append(str(r.exception))
    with pytest.raises(ConfigError) as console:
        WorkflowTables(url, "kworkers_wf").runs(None, None)
    refusals.append(str(console.value))
    for text in refusals:
        assert "\n" not in text
        assert "needs a SQL store (SqliteStore or PostgresStore; a sqlite: or postgresql: URL)" \
            ", not a RedisStore" in text, text


def test_a_new_backend_with_buckets_needs_no_change_in_pace() -> None:
    """``buckets_for`` asks the store (``rate_buckets``), it does not know the backends: a toy
    store that can hold buckets is used as it is, one that refuses is refused with its words."""
    from kworkers.pace import LocalBuckets, RateLimit, buckets_for

    clock = FakeClock()
    mine = LocalBuckets(clock)

    class ToyStore:
        def rate_buckets(self) -> Any:
            return mine

    class ToyFile:
        def rate_buckets(self) -> Any:
            raise ConfigError("a toy file is on one host")

    assert buckets_for(RateLimit(per_second=5), clock, None, ToyStore()) is mine
    with pytest.raises(ConfigError, match="but a toy file is on one host: give") as refused:
        buckets_for(RateLimit(per_second=5), clock, None, ToyFile())
    assert "\n" not in str(refused.value)


def test_pace_imports_nothing_of_the_stores() -> None:
    """The stores hand out the pool's buckets (``idempotency`` -> ``pace``), so ``pace`` must
    not import ``idempotency`` back: no two-way tie, no ``sys.modules`` look-up."""
    for f in (ROOT / "kworkers" / "pace").glob("*.py"):
        text = f.read_text(encoding="utf-8")
        assert "sys.modules" not in text, f
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("kworkers.idempotency"), f
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("kworkers.idempotency") for a in node.names), f


def test_the_dialects_differ_only_in_their_words() -> None:
    from kworkers.sqlbase import DIALECTS, POSTGRES, SQLITE

    assert DIALECTS == {"sqlite": SQLITE, "postgres": POSTGRES}
    text = "SELECT a FROM {t} JOIN {u} WHERE b = ? AND c = ?"
    assert SQLITE.sql(text, t="x", u="y") == "SELECT a FROM x JOIN y WHERE b = ? AND c = ?"
    assert POSTGRES.sql(text, t="x", u="y") == "SELECT a FROM x JOIN y WHERE b = %s AND c = %s"
    assert (SQLITE.for_update, POSTGRES.for_update) == ("", " FOR UPDATE")
    assert POSTGRES.skip_locked == " FOR UPDATE SKIP LOCKED" and SQLITE.skip_locked == ""


def test_the_store_drivers_load_only_when_a_store_uses_them() -> None:
    """``kworkers.idempotency``, ``kworkers.pace`` and the shared SQL plumbing import no
    driver: psycopg and redis are optional, and load with the store that needs them."""
    import subprocess
    import sys

    code = ("import sys, kworkers.idempotency, kworkers.pace, kworkers.sqlbase, "
            "kworkers.workflow.tables; "
            "print(','.join(m for m in ('psycopg', 'redis') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True)
    assert out.stdout.strip() == ""


def test_every_backend_is_one_row_that_opens_itself_and_says_what_it_can(tmp_path: Path) -> None:
    """``open_store`` and the lazy exports read one table (``BACKENDS``); each row's class opens
    itself from its URL and answers the capability questions (``rate_buckets``; SQL ones name
    their ``dialect``)."""
    import kworkers.idempotency as idem
    from kworkers.sqlbase import DIALECTS

    urls = {"sqlite": f"sqlite:///{tmp_path}/x.db", "postgresql": "postgresql://n@127.0.0.1:1/x",
            "postgres": "postgres://n@127.0.0.1:1/x", "redis": "redis://127.0.0.1:1/0",
            "rediss": "rediss://127.0.0.1:1/0", "unix": "unix:///tmp/none.sock"}
    seen = set()
    for backend in idem.BACKENDS:
        cls = backend.load()
        assert getattr(idem, backend.cls) is cls
        assert callable(cls.rate_buckets)
        assert getattr(cls, "dialect", None) in (None, *DIALECTS)
        for scheme in backend.schemes:
            store = idem.open_store(urls[scheme])
            assert type(store) is cls
            store.close()
            seen.add(scheme)
    assert seen == set(urls)
