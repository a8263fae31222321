"""One contract, every backend: SQLite always; PostgreSQL and Redis when their URLs are set.

Set ``KWORKERS_PG_DSN`` / ``KWORKERS_REDIS_URL`` (``source scripts/services.sh; ensure_postgres;
ensure_redis`` starts both locally). A URL that is set but does not answer fails the tests
rather than skipping them, so a broken setup cannot pass as green.

Processes here are real (multiprocessing, spawn): races and SIGKILLs cross process boundaries
exactly as two workers on one host would.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kworkers.errors import ConfigError, FencedError
from kworkers.idempotency import (
    Claim,
    ClaimState,
    IdempotencyStore,
    SqliteStore,
    TransactionalStore,
    open_store,
)
from kworkers.idempotency.store import (
    UNTRACKED,
    LeaseRow,
    Turn,
    decide_claim,
    decide_complete,
    decide_heartbeat,
    decide_release,
)

SPAWN = multiprocessing.get_context("spawn")
BACKENDS = ["sqlite", "postgres", "redis"]
ENV = {"postgres": "KWORKERS_PG_DSN", "redis": "KWORKERS_REDIS_URL"}
SETUP = {"postgres": "ensure_postgres", "redis": "ensure_redis"}


@dataclass(frozen=True)
class Spec:
    """How to open one test's store: picklable, so child processes open their own."""

    kind: str
    url: str
    name: str  # table (SQL) or key prefix (Redis), unique per test

    def open(self) -> IdempotencyStore:
        if self.kind == "sqlite":
            return SqliteStore(self.url, table=self.name)
        if self.kind == "postgres":
            from kworkers.idempotency.postgres import PostgresStore

            return PostgresStore(self.url, table=self.name)
        from kworkers.idempotency.redis import RedisStore

        return RedisStore(self.url, prefix=self.name + ":")

    @property
    def sql(self) -> bool:
        return self.kind != "redis"

    @property
    def effects(self) -> str:
        return self.name + "_effects"


def _mark(spec: Spec) -> str:
    return "%s" if spec.kind == "postgres" else "?"


_reachable: dict[str, str | None] = {}


def _check_reachable(kind: str, url: str) -> None:
    """Fail (not skip) when a configured server does not answer; checked once per session."""
    if kind not in _reachable:
        try:
            s = Spec(kind, url, "kwt_ping").open()
            s.is_done("ping")
            s.close()
            _reachable[kind] = None
        except Exception as exc:  # report whatever the driver says
            _reachable[kind] = f"{type(exc).__name__}: {exc}"
    if _reachable[kind] is not None:
        pytest.fail(f"{ENV[kind]}={url} is set but the server does not answer: {_reachable[kind]}")


def _cleanup(spec: Spec) -> None:
    if spec.kind == "postgres":
        import psycopg

        with psycopg.connect(spec.url, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {spec.name}, {spec.effects}")
    elif spec.kind == "redis":
        import redis

        r = redis.Redis.from_url(spec.url)
        keys = list(r.scan_iter(match=spec.name + ":*"))
        if keys:
            r.delete(*keys)
        r.close()


def make_spec(kind: str, tmp_path: Any) -> Spec:
    name = f"kwt_{uuid.uuid4().hex[:10]}"
    if kind == "sqlite":
        return Spec(kind, str(tmp_path / "idem.db"), name)
    url = os.environ.get(ENV[kind], "")
    if not url:
        pytest.skip(
            f"{ENV[kind]} is unset: no {kind} server to run the contract against "
            f"(source scripts/services.sh && {SETUP[kind]})"
        )
    _check_reachable(kind, url)
    return Spec(kind, url, name)


@pytest.fixture(params=BACKENDS)
def spec(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Spec]:
    s = make_spec(request.param, tmp_path)
    yield s
    _cleanup(s)


@pytest.fixture(params=["sqlite", "postgres"])
def sql_spec(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Spec]:
    s = make_spec(request.param, tmp_path)
    yield s
    _cleanup(s)


@pytest.fixture
def store(spec: Spec) -> Iterator[IdempotencyStore]:
    s = spec.open()
    yield s
    s.close()


@pytest.fixture
def sql_store(sql_spec: Spec) -> Iterator[TransactionalStore[Any]]:
    s = sql_spec.open()
    assert isinstance(s, SqliteStore) or sql_spec.kind == "postgres"
    conn_store: TransactionalStore[Any] = s  # type: ignore[assignment]
    with conn_store.atomic() as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {sql_spec.effects} (key TEXT NOT NULL)", ())
    yield conn_store
    s.close()


def effect(spec: Spec, key: str) -> Callable[[Any], None]:
    """The effect under test: one row per application (no unique key, so doubles show)."""

    def apply(conn: Any) -> None:
        conn.execute(f"INSERT INTO {spec.effects} (key) VALUES ({_mark(spec)})", (key,))

    return apply


def effect_count(store: TransactionalStore[Any], spec: Spec, key: str) -> int:
    with store.atomic() as conn:
        row = conn.execute(
            f"SELECT COUNT(*) FROM {spec.effects} WHERE key = {_mark(spec)}", (key,)
        ).fetchone()
    return int(row[0])


KEY = "wf-1/act-1"


# --- the lease --------------------------------------------------------------------------------


def test_claim_complete_then_done(store: IdempotencyStore) -> None:
    c = store.claim(KEY, "w1", 30, now=100.0)
    assert c == Claim(ClaimState.ACQUIRED, KEY, 1, None, 130.0, False)
    assert c.acquired
    assert not store.is_done(KEY)
    store.complete(KEY, c.token, now=101.0)
    assert store.is_done(KEY)
    for owner, now in [("w1", 102.0), ("w2", 102.0), ("w2", 10_000.0)]:
        again = store.claim(KEY, owner, 30, now=now)
        assert again.state is ClaimState.DONE
        assert again.token == 1
        assert not again.acquired
    # Repeating the completion with the token that completed is harmless (a lost reply).
    store.complete(KEY, c.token, now=103.0)
    assert store.is_done(KEY)


def test_keys_are_independent(store: IdempotencyStore) -> None:
    a = store.claim("wf/a", "w1", 30, now=0.0)
    b = store.claim("wf/b", "w2", 30, now=0.0)
    assert a.acquired and b.acquired
    store.complete("wf/a", a.token, now=1.0)
    assert store.is_done("wf/a") and not store.is_done("wf/b")
    assert store.claim("wf/b", "w3", 30, now=1.0).state is ClaimState.BUSY


def test_busy_on_live_lease_of_another_owner(store: IdempotencyStore) -> None:
    c = store.claim(KEY, "w1", 30, now=100.0)
    busy = store.claim(KEY, "w2", 30, now=129.9)
    assert busy.state is ClaimState.BUSY
    assert busy.token == c.token
    assert busy.lease_until == 130.0
    assert not busy.acquired


def test_same_owner_reclaims_live_lease_with_same_token(store: IdempotencyStore) -> None:
    c = store.claim(KEY, "w1", 30, now=100.0)
    again = store.claim(KEY, "w1", 30, now=110.0)
    assert again.state is ClaimState.ACQUIRED
    assert again.token == c.token
    assert again.lease_until == 140.0  # extended, never shortened
    shorter = store.claim(KEY, "w1", 1, now=111.0)
    assert shorter.lease_until == 140.0
    assert store.claim(KEY, "w2", 30, now=139.0).state is ClaimState.BUSY


def test_takeover_after_expiry_bumps_token_and_keeps_details(store: IdempotencyStore) -> None:
    c = store.claim(KEY, "w1", 10, now=100.0)
    store.heartbeat(KEY, c.token, b"offset=42", 10, now=105.0)  # lease now ends at 115
    assert store.claim(KEY, "w2", 10, now=114.0).state is ClaimState.BUSY
    assert store.details(KEY) == b"offset=42"
    t = store.claim(KEY, "w2", 10, now=115.0)  # a lease ending exactly now has expired
    # expired: the attempt before never finished (a failed attempt, ``AttemptCrashed``)
    assert t == Claim(ClaimState.ACQUIRED, KEY, c.token + 1, b"offset=42", 125.0, True, True)
    # The old owner is fenced out of everything; the new one proceeds.
    with pytest.raises(FencedError):
        store.heartbeat(KEY, c.token, b"offset=50", 10, now=116.0)
    with pytest.raises(FencedError):
        store.complete(KEY, c.token, now=116.0)
    assert store.details(KEY) == b"offset=42"
    store.heartbeat(KEY, t.token, b"offset=60", 10, now=116.0)
    store.complete(KEY, t.token, now=117.0)
    assert store.is_done(KEY)
    assert store.details(KEY) == b"offset=60"


def test_same_owner_after_own_expiry_is_not_a_takeover(store: IdempotencyStore) -> None:
    c = store.claim(KEY, "w1", 10, now=0.0)
    again = store.claim(KEY, "w1", 10, now=50.0)
    assert again.acquired and again.token == c.token + 1 and not again.takeover
    assert not again.expired


def test_heartbeat_without_details_keeps_the_last_ones(store: IdempotencyStore) -> None:
    c = store.claim(KEY, "w1", 10, now=0.0)
    store.heartbeat(KEY, c.token, b"", 10, now=1.0)
    assert store.details(KEY) == b""  # empty details are details, not "none"
    store.heartbeat(KEY, c.token, b"ck1", 10, now=2.0)
    store.heartbeat(KEY, c.token, None, 10, now=3.0)
    assert store.details(KEY) == b"ck1"
    assert store.claim(KEY, "w2", 10, now=12.9).state is ClaimState.BUSY
    assert store.claim(KEY, "w2", 10, now=13.0).acquired


def test_stale_or_unknown_token_is_fenced(store: IdempotencyStore) -> None:
    with pytest.raises(FencedError):
        store.heartbeat("never/claimed", 1, None, 10, now=0.0)
    with pytest.raises(FencedError):
        store.complete("never/claimed", 1, now=0.0)
    c = store.claim(KEY, "w1", 10, now=0.0)
    for bad in (c.token - 1, c.token + 1, 0):
        with pytest.raises(FencedError):
            store.heartbeat(KEY, bad, b"x", 10, now=1.0)
        with pytest.raises(FencedError):
            store.complete(KEY, bad, now=1.0)
    assert store.details(KEY) is None
    assert not store.is_done(KEY)
    store.complete(KEY, c.token, now=2.0)
    with pytest.raises(FencedError, match="done"):
        store.heartbeat(KEY, c.token, b"late", 10, now=3.0)


def test_release_lets_the_next_claim_take_over_at_once(store: IdempotencyStore) -> None:
    c = store.claim(KEY, "w1", 60, now=0.0)
    store.heartbeat(KEY, c.token, b"half", 60, now=1.0)
    store.release(KEY, c.token)
    assert store.details(KEY) == b"half"
    assert not store.is_done(KEY)
    # The released holder may not heartbeat or complete any more.
    with pytest.raises(FencedError):
        store.heartbeat(KEY, c.token, b"more", 60, now=2.0)
    with pytest.raises(FencedError):
        store.complete(KEY, c.token, now=2.0)
    t = store.claim(KEY, "w2", 60, now=2.0)  # long before the old lease would have expired
    # released, not expired: the attempt before ended (it failed and said so)
    assert t == Claim(ClaimState.ACQUIRED, KEY, c.token + 1, b"half", 62.0, True, False)
    store.release(KEY, c.token)  # stale release: no-op
    assert store.claim(KEY, "w3", 60, now=3.0).state is ClaimState.BUSY
    store.release("never/claimed", 1)  # no-op too
    assert store.details("never/claimed") is None
    store.complete(KEY, t.token, now=4.0)
    store.release(KEY, t.token)  # after done: no-op, stays done
    assert store.is_done(KEY)


def test_release_then_same_owner_retries_under_a_new_token(store: IdempotencyStore) -> None:
    c = store.claim(KEY, "w1", 60, now=0.0)
    store.release(KEY, c.token)
    again = store.claim(KEY, "w1", 60, now=1.0)
    assert again.acquired and again.token == c.token + 1 and not again.takeover


def test_a_delivery_older_than_the_keys_latest_turn_in_its_run_is_stale(
        store: IdempotencyStore) -> None:
    """Issue #43: a source record redelivered after its retry claimed the key (the source's
    commit lost with a crash between the hand-off and the commit) is STALE, whatever the lease
    says; the same attempt again, a later one, another run or an untracked claim are not."""
    first, retry = Turn("run-a", 1), Turn("run-a", 2)
    c1 = store.claim(KEY, "w1", 30, now=0.0, turn=first)
    store.release(KEY, c1.token)
    c2 = store.claim(KEY, "w1", 30, now=1.0, turn=retry)
    assert c2.acquired
    # the retry's worker died holding the lease: the stale source is refused live or expired
    assert store.claim(KEY, "w2", 30, now=2.0, turn=first).state is ClaimState.STALE
    assert store.claim(KEY, "w2", 30, now=99.0, turn=first).state is ClaimState.STALE
    # the retry redelivered takes the expired lease over (counted as crashed by the invoker)
    again = store.claim(KEY, "w2", 30, now=99.0, turn=retry)
    assert again.acquired and again.expired
    store.release(KEY, again.token)
    # a redrive (another run) and an untracked claim are never stale
    assert store.claim(KEY, "w3", 30, now=100.0, turn=UNTRACKED).acquired
    assert store.claim(KEY, "w3", 30, now=100.0, turn=Turn("run-b", 1)).acquired
    assert store.claim(KEY, "w4", 1, now=200.0, turn=first).acquired  # run-b is the latest now
    c = store.claim(KEY, "w4", 1, now=200.5, turn=first)
    store.complete(KEY, c.token, now=201.0)
    assert store.claim(KEY, "w5", 1, now=300.0, turn=Turn("run-b", 1)).state is ClaimState.DONE


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_table_made_before_turns_gets_their_columns(kind: str, tmp_path: Any) -> None:
    """A store opened on a table of an earlier release adds the turn columns and keeps rows."""
    spec = make_spec(kind, tmp_path)
    old = (f"CREATE TABLE {spec.name} (key TEXT PRIMARY KEY, owner TEXT, token BIGINT NOT NULL,"
           " status TEXT NOT NULL, lease_until DOUBLE PRECISION NOT NULL, details "
           f"{'BYTEA' if kind == 'postgres' else 'BLOB'}, done_at DOUBLE PRECISION)")
    row = ("INSERT INTO {t} VALUES ('old/done', 'w0', 1, 'done', 0, NULL, 5.0)"
           .replace("{t}", spec.name))
    try:
        if kind == "postgres":
            import psycopg

            with psycopg.connect(spec.url, autocommit=True) as conn:
                conn.execute(old)
                conn.execute(row)
        else:
            import sqlite3

            with sqlite3.connect(spec.url) as conn:
                conn.execute(old)
                conn.execute(row)
        store = spec.open()
        try:
            assert store.claim("old/done", "w1", 30, now=1.0, turn=Turn("r", 2)).state \
                is ClaimState.DONE
            c = store.claim(KEY, "w1", 30, now=1.0, turn=Turn("r", 2))
            store.release(KEY, c.token)
            assert store.claim(KEY, "w1", 30, now=2.0, turn=Turn("r", 1)).state \
                is ClaimState.STALE
        finally:
            store.close()
    finally:
        _cleanup(spec)


def test_bad_arguments_are_config_errors(store: IdempotencyStore) -> None:
    with pytest.raises(ConfigError):
        store.claim("", "w1", 10, now=0.0)
    with pytest.raises(ConfigError):
        store.claim(KEY, "", 10, now=0.0)
    for lease in (0, -1.0, float("nan")):
        with pytest.raises(ConfigError):
            store.claim(KEY, "w1", lease, now=0.0)
    c = store.claim(KEY, "w1", 10, now=0.0)
    with pytest.raises(ConfigError):
        store.heartbeat(KEY, c.token, None, 0, now=1.0)


def test_two_store_instances_share_the_state(spec: Spec) -> None:
    a, b = spec.open(), spec.open()
    try:
        c = a.claim(KEY, "w1", 10, now=0.0)
        assert b.claim(KEY, "w2", 10, now=1.0).state is ClaimState.BUSY
        a.complete(KEY, c.token, now=2.0)
        assert b.is_done(KEY)
    finally:
        a.close()
        b.close()


def test_threads_racing_on_one_store_acquire_once(store: IdempotencyStore) -> None:
    n = 8
    barrier = threading.Barrier(n)
    results: list[Claim] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        barrier.wait()
        c = store.claim(KEY, f"t{i}", 60, now=0.0)
        with lock:
            results.append(c)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    states = sorted(c.state.value for c in results)
    assert states == ["acquired"] + ["busy"] * (n - 1)


# --- processes: races and crashes -------------------------------------------------------------


def _child(body: Callable[..., Any], args: tuple[Any, ...], barrier: Any, out: Any) -> None:
    """Runs in a spawned process: reports the body's result, or its traceback, to the parent
    (and breaks the barrier, so siblings fail fast instead of waiting out the timeout)."""
    import traceback

    try:
        out.put(("ok", body(*args, barrier)))
    except BaseException:
        barrier.abort()
        out.put(("error", traceback.format_exc()))


def _in_processes(n: int, body: Callable[..., Any], *args: Any) -> list[Any]:
    """``body(*args, barrier)`` in ``n`` spawned processes; their results, in no order."""
    barrier, out = SPAWN.Barrier(n), SPAWN.Queue()
    procs = [SPAWN.Process(target=_child, args=(body, args, barrier, out)) for _ in range(n)]
    for p in procs:
        p.start()
    try:
        reports = [out.get(timeout=240) for _ in range(n)]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    errors = [r for kind, r in reports if kind == "error"]
    if errors:
        # the root cause first: siblings that only saw the barrier break come last
        errors.sort(key=lambda e: "BrokenBarrierError" in e)
        pytest.fail(f"{len(errors)} child process(es) failed; first:\n" + errors[0])
    return [r for _kind, r in reports]


# A barrier timeout bounds a hung test only: spawning under load can take a while.
BARRIER_S = 200


def _race_claims(spec: Spec, rounds: list[tuple[str, float]], barrier: Any) -> list[Any]:
    store = spec.open()
    me = f"pid{os.getpid()}"
    try:
        results = []
        for key, now in rounds:
            barrier.wait(BARRIER_S)
            c = store.claim(key, me, 60, now=now)
            results.append((key, now, c.state.value, c.token))
        return results
    finally:
        store.close()


def test_processes_racing_to_claim_exactly_one_acquires(spec: Spec) -> None:
    n, keys = 6, [f"race/{i}" for i in range(15)]
    spec.open().close()  # create the schema up front: the race is about claims
    # First fresh keys; then, every lease having expired, the takeover is a race too.
    rounds = [(k, 1000.0) for k in keys] + [(k, 2000.0) for k in keys]
    results = [r for rs in _in_processes(n, _race_claims, spec, rounds) for r in rs]
    for key, now in rounds:
        got = sorted((s, t) for k, w, s, t in results if (k, w) == (key, now))
        token = 1 if now == 1000.0 else 2
        assert got == [("acquired", token)] + [("busy", token)] * (n - 1), (key, now)


def _claim_then_hang(spec: Spec, key: str, claimed: Any) -> None:
    store = spec.open()
    store.claim(key, "doomed", 30, now=100.0)
    claimed.set()
    time.sleep(600)  # SIGKILLed here: after the claim, before the effect


def _kill_when(event: Any, target: Callable[..., None], *args: Any) -> None:
    proc = SPAWN.Process(target=target, args=(*args, event))
    proc.start()
    try:
        deadline = time.monotonic() + BARRIER_S
        while not event.wait(0.5):
            assert proc.is_alive(), f"the child died before the crash point ({proc.exitcode})"
            assert time.monotonic() < deadline, "the child never reached the crash point"
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # type: ignore[arg-type]
        proc.join(30)
    assert proc.exitcode == -signal.SIGKILL


def test_worker_killed_between_claim_and_effect_effect_happens_once(spec: Spec) -> None:
    """Decision 6: the plain SETNX design loses this effect forever; the lease does not."""
    _kill_when(SPAWN.Event(), _claim_then_hang, spec, KEY)
    store = spec.open()
    applied: list[str] = []
    try:
        assert store.claim(KEY, "next", 30, now=120.0).state is ClaimState.BUSY
        t = store.claim(KEY, "next", 30, now=130.0)
        assert t.acquired and t.takeover and t.token == 2
        applied.append(KEY)
        store.complete(KEY, t.token, now=131.0)
        for attempt in range(3):  # redeliveries after the completion
            c = store.claim(KEY, f"later{attempt}", 30, now=500.0 + attempt)
            if c.acquired:
                applied.append(KEY)
        assert applied == [KEY]
    finally:
        store.close()


# --- the transactional form (SQL stores) ------------------------------------------------------


def test_transaction_marks_done_with_the_effect(sql_spec: Spec, sql_store: Any) -> None:
    c = sql_store.claim(KEY, "w1", 30, now=0.0)
    with sql_store.transaction(KEY, c.token, now=1.0) as conn:
        effect(sql_spec, KEY)(conn)
        assert not _done_elsewhere(sql_spec, KEY)  # not visible before the commit
    assert sql_store.is_done(KEY)
    assert effect_count(sql_store, sql_spec, KEY) == 1
    assert sql_store.claim(KEY, "w2", 30, now=100.0).state is ClaimState.DONE


def _done_elsewhere(spec: Spec, key: str) -> bool:
    other = spec.open()
    try:
        return other.is_done(key)
    finally:
        other.close()


def test_transaction_error_rolls_back_effect_and_keeps_the_lease(
    sql_spec: Spec, sql_store: Any
) -> None:
    c = sql_store.claim(KEY, "w1", 30, now=0.0)
    with pytest.raises(RuntimeError, match="boom"), sql_store.transaction(KEY, c.token) as conn:
        effect(sql_spec, KEY)(conn)
        raise RuntimeError("boom")
    assert not sql_store.is_done(KEY)
    assert effect_count(sql_store, sql_spec, KEY) == 0
    sql_store.heartbeat(KEY, c.token, b"still mine", 30, now=1.0)  # the lease is intact
    with sql_store.transaction(KEY, c.token) as conn:
        effect(sql_spec, KEY)(conn)
    assert effect_count(sql_store, sql_spec, KEY) == 1


def test_transaction_with_stale_token_runs_nothing(sql_spec: Spec, sql_store: Any) -> None:
    c = sql_store.claim(KEY, "w1", 10, now=0.0)
    t = sql_store.claim(KEY, "w2", 10, now=20.0)  # took over
    ran = []
    with pytest.raises(FencedError), sql_store.transaction(KEY, c.token) as conn:
        ran.append(conn)
    assert ran == []
    with sql_store.transaction(KEY, t.token) as conn:
        effect(sql_spec, KEY)(conn)
    with pytest.raises(FencedError, match="done"), sql_store.transaction(KEY, t.token):
        ran.append("second")
    assert ran == []
    assert effect_count(sql_store, sql_spec, KEY) == 1


def test_a_takeover_waits_for_an_open_transaction(sql_spec: Spec, sql_store: Any) -> None:
    """The lease expires while the effect is running: the would-be successor must not slip in;
    it waits for the row lock and then finds the key done."""
    c = sql_store.claim(KEY, "slow", 1, now=0.0)
    inside, result = threading.Event(), []

    def successor() -> None:
        assert inside.wait(30)
        other = sql_spec.open()
        try:
            result.append(other.claim(KEY, "fast", 1, now=50.0))
        finally:
            other.close()

    t = threading.Thread(target=successor)
    t.start()
    with sql_store.transaction(KEY, c.token) as conn:
        effect(sql_spec, KEY)(conn)
        inside.set()
        time.sleep(0.3)  # the successor is now blocked on the lock
    t.join(60)
    assert [r.state for r in result] == [ClaimState.DONE]
    assert effect_count(sql_store, sql_spec, KEY) == 1


def test_apply_once_applies_once(sql_spec: Spec, sql_store: Any) -> None:
    assert sql_store.apply_once(KEY, effect(sql_spec, KEY), now=1.0) is True
    assert sql_store.apply_once(KEY, effect(sql_spec, KEY), now=2.0) is False
    assert sql_store.is_done(KEY)
    assert effect_count(sql_store, sql_spec, KEY) == 1
    assert sql_store.claim(KEY, "w", 10, now=3.0).state is ClaimState.DONE


def test_apply_once_fences_a_lease_holder(sql_spec: Spec, sql_store: Any) -> None:
    c = sql_store.claim(KEY, "w1", 10, now=0.0)
    assert sql_store.apply_once(KEY, effect(sql_spec, KEY))
    with pytest.raises(FencedError):
        sql_store.complete(KEY, c.token, now=1.0)


def test_apply_once_crash_between_effect_and_mark_rolls_back(
    sql_spec: Spec, sql_store: Any
) -> None:
    def crashing(conn: Any) -> None:
        effect(sql_spec, KEY)(conn)
        raise SystemExit("simulated crash after the effect, before the mark")

    with pytest.raises(SystemExit):
        sql_store.apply_once(KEY, crashing)
    assert effect_count(sql_store, sql_spec, KEY) == 0
    assert not sql_store.is_done(KEY)
    assert sql_store.apply_once(KEY, effect(sql_spec, KEY)) is True
    assert sql_store.apply_once(KEY, effect(sql_spec, KEY)) is False
    assert effect_count(sql_store, sql_spec, KEY) == 1


def _apply_then_hang(spec: Spec, key: str, inside: Any) -> None:
    store: Any = spec.open()

    def fn(conn: Any) -> None:
        effect(spec, key)(conn)
        inside.set()
        time.sleep(600)  # SIGKILLed here: effect written, mark not yet, nothing committed

    store.apply_once(key, fn)


def test_apply_once_sigkill_between_effect_and_mark(sql_spec: Spec, sql_store: Any) -> None:
    _kill_when(SPAWN.Event(), _apply_then_hang, sql_spec, KEY)
    assert effect_count(sql_store, sql_spec, KEY) == 0
    assert not sql_store.is_done(KEY)
    assert sql_store.apply_once(KEY, effect(sql_spec, KEY)) is True
    assert sql_store.apply_once(KEY, effect(sql_spec, KEY)) is False
    assert effect_count(sql_store, sql_spec, KEY) == 1


def _race_apply(spec: Spec, key: str, barrier: Any) -> bool:
    store: Any = spec.open()
    try:
        barrier.wait(BARRIER_S)
        return bool(store.apply_once(key, effect(spec, key)))
    finally:
        store.close()


def test_processes_racing_apply_once_apply_exactly_once(sql_spec: Spec, sql_store: Any) -> None:
    n = 6
    applied = sorted(_in_processes(n, _race_apply, sql_spec, KEY))
    assert applied == [False] * (n - 1) + [True]
    assert effect_count(sql_store, sql_spec, KEY) == 1


def test_nested_use_on_one_thread_is_refused(sql_spec: Spec, sql_store: Any) -> None:
    c = sql_store.claim(KEY, "w1", 10, now=0.0)
    with pytest.raises(ConfigError), sql_store.transaction(KEY, c.token):
        sql_store.claim("wf/other", "w1", 10, now=0.0)
    assert not sql_store.is_done(KEY)


def test_closed_sql_store_refuses_work(sql_spec: Spec) -> None:
    s = sql_spec.open()
    s.close()
    with pytest.raises(ConfigError):
        s.claim(KEY, "w1", 10, now=0.0)


# --- every backend against the reference decisions ---------------------------------------------

OWNERS = ["a", "b", "c"]
TURNS = [UNTRACKED, *(Turn(run, a) for run in ("r1", "r2") for a in (1, 2, 3))]
op = st.one_of(
    st.tuples(st.just("claim"), st.sampled_from(OWNERS), st.sampled_from([1.0, 5.0]),
              st.sampled_from(TURNS)),
    st.tuples(st.just("advance"), st.sampled_from([0.0, 0.5, 1.0, 3.0, 6.0])),
    st.tuples(
        st.just("heartbeat"),
        st.sampled_from([0, -1, 1]),
        st.one_of(st.none(), st.binary(max_size=4)),
        st.sampled_from([1.0, 5.0]),
    ),
    st.tuples(st.just("complete"), st.sampled_from([0, -1, 1])),
    st.tuples(st.just("release"), st.sampled_from([0, -1, 1])),
)


class Model:
    """The reference: the pure decisions over one in-memory row."""

    def __init__(self) -> None:
        self.row: LeaseRow | None = None

    def claim(self, key: str, owner: str, lease_s: float, now: float,
              turn: Turn = UNTRACKED) -> Claim:
        claim, new = decide_claim(self.row, key, owner, lease_s, now, turn)
        self.row = new or self.row
        return claim

    def heartbeat(self, key: str, token: int, d: bytes | None, lease_s: float, now: float) -> None:
        self.row = decide_heartbeat(self.row, key, token, d, lease_s, now)

    def complete(self, key: str, token: int, now: float) -> None:
        self.row = decide_complete(self.row, key, token, now) or self.row

    def release(self, key: str, token: int) -> None:
        self.row = decide_release(self.row, token) or self.row


def _apply(target: Any, o: Any, key: str, cur: int, now: float) -> Any:
    """One operation on the model or the store (same interface), as a comparable outcome."""
    try:
        if o[0] == "claim":
            return ("ok", target.claim(key, o[1], o[2], now, o[3]))
        if o[0] == "heartbeat":
            return ("ok", target.heartbeat(key, cur + o[1], o[2], o[3], now))
        if o[0] == "complete":
            return ("ok", target.complete(key, cur + o[1], now))
        return ("ok", target.release(key, cur + o[1]))
    except FencedError:
        return ("fenced", None)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=st.lists(op, min_size=1, max_size=14))
def test_backend_matches_the_reference_decisions(store: IdempotencyStore, ops: list[Any]) -> None:
    key = f"model/{uuid.uuid4().hex}"
    model, now = Model(), 1000.0
    for o in ops:
        if o[0] == "advance":
            now += o[1]
            continue
        cur = model.row.token if model.row else 1
        want = _apply(model, o, key, cur, now)
        got = _apply(store, o, key, cur, now)
        assert got == want, o
        assert store.details(key) == (model.row.details if model.row else None)
        assert store.is_done(key) == (model.row is not None and model.row.status == "done")


# --- configuration ----------------------------------------------------------------------------


def test_open_store_by_url(tmp_path: Any) -> None:
    s = open_store(f"sqlite://{tmp_path}/x.db")
    assert isinstance(s, SqliteStore) and s.path == f"{tmp_path}/x.db"
    s.close()
    for bad in ["nothing", "ftp://x", "sqlite://"]:
        with pytest.raises(ConfigError):
            open_store(bad)
    with pytest.raises(ConfigError):
        SqliteStore(":memory:")
    with pytest.raises(ConfigError):
        SqliteStore(tmp_path / "y.db", table="bad; DROP TABLE x")
