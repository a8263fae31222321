"""A flaky worker pool under SIGKILL applies every effect exactly once (transactional form).

Worker processes claim tasks with a short lease and apply each effect with
``store.transaction(key, token)``; the test SIGKILLs a random worker every few hundred
milliseconds (before a claim, between claim and effect, inside the effect transaction, after the
commit) and starts a replacement, until every key is done. Then every effect row must exist
exactly once. No Kafka: this is the idempotent receiver on its own, against real SQLite files
and a real PostgreSQL server (when ``KWORKERS_PG_DSN`` is set). Redis has no transactional
form, so a kill between its effect and ``complete`` would repeat the effect by design; its lease
is covered by the contract suite's kill-between-claim-and-effect test.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, cast

import pytest

from tests.unit.test_idempotency_contract import Spec, _cleanup, make_spec

ROOT = Path(__file__).resolve().parents[2]

WORKER = r"""
import os, random, sys, time
from kworkers.errors import FencedError
kind, url, table, effects, n = sys.argv[1:6]
if kind == "sqlite":
    from kworkers.idempotency import SqliteStore
    store = SqliteStore(url, table=table)
    mark = "?"
else:
    from kworkers.idempotency.postgres import PostgresStore
    store = PostgresStore(url, table=table)
    mark = "%s"
me = f"w{os.getpid()}"
keys = [f"task/{i}" for i in range(int(n))]
while True:
    pending = [k for k in keys if not store.is_done(k)]
    if not pending:
        break
    random.shuffle(pending)
    for k in pending:
        c = store.claim(k, me, 0.4, time.time())
        if c.state.value != "acquired":
            continue
        time.sleep(random.random() * 0.01)  # a kill here: between the claim and the effect
        try:
            with store.transaction(k, c.token, now=time.time()) as conn:
                conn.execute(
                    f"INSERT INTO {effects} (key, owner) VALUES ({mark}, {mark})", (k, me)
                )
                time.sleep(random.random() * 0.01)  # a kill here: effect written, not committed
        except FencedError:
            pass  # the lease went to a successor, which applies (or applied) the effect
    time.sleep(0.02)
"""


@pytest.fixture(params=["sqlite", "postgres"])
def spec(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Spec]:
    s = make_spec(request.param, tmp_path)
    yield s
    _cleanup(s)


def _start(spec: Spec, n: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-c", WORKER, spec.kind, spec.url, spec.name, spec.effects, str(n)]
    return subprocess.Popen(args, env=env, stderr=subprocess.PIPE)


def test_flaky_pool_under_sigkill_applies_each_effect_exactly_once(spec: Spec) -> None:
    n, pool_size, rnd = 200, 3, random.Random(1234)
    store: Any = spec.open()
    with store.atomic() as conn:
        conn.execute(f"CREATE TABLE {spec.effects} (key TEXT NOT NULL, owner TEXT NOT NULL)", ())
    keys = [f"task/{i}" for i in range(n)]
    pool = [_start(spec, n) for _ in range(pool_size)]
    kills, deadline = 0, time.monotonic() + 240
    try:
        while not all(store.is_done(k) for k in keys):
            assert time.monotonic() < deadline, "the pool made no progress"
            time.sleep(rnd.uniform(0.1, 0.3))
            victim = rnd.randrange(pool_size)
            if pool[victim].poll() is None:
                pool[victim].send_signal(signal.SIGKILL)
                pool[victim].wait(30)
                kills += 1
            elif pool[victim].returncode != 0:  # a crash of its own is a bug, not a fault
                err = (cast(IO[bytes], pool[victim].stderr).read().decode()
                       if pool[victim].stderr else "")
                pytest.fail(f"worker exited {pool[victim].returncode}: {err}")
            pool[victim] = _start(spec, n)
    finally:
        for p in pool:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait(30)
    with store.atomic() as conn:
        rows = conn.execute(
            f"SELECT key, COUNT(*) FROM {spec.effects} GROUP BY key ORDER BY key", ()
        ).fetchall()
        takeovers = conn.execute(f"SELECT COUNT(*) FROM {spec.name} WHERE token > 1", ()).fetchone()
    store.close()
    counts = {k: c for k, c in rows}
    assert sorted(counts) == sorted(keys)
    assert {k: c for k, c in counts.items() if c != 1} == {}
    assert kills > 0
    assert takeovers[0] > 0, "no kill ever cost a lease: the takeover path went untested"
    print(f"{kills} SIGKILLs, {takeovers[0]} keys taken over after a lost lease")
