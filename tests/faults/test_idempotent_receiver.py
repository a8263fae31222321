"""The idempotent receiver under SIGKILLs and a broker restart: every effect exactly once.

Seed 000's TestFlakyActivityKillLoopExactlyOnce, larger, per store backend.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kworkers.envelope.envelope import ids_to_headers
from kworkers.testing import Broker
from kworkers.testing.effects import Ledger
from kworkers.testing.processes import WorkerProcess
from kworkers.testing.workload import make_topic, produce, unique

pytestmark = [pytest.mark.integration, pytest.mark.faults]
ROOT = str(Path(__file__).resolve().parents[2])


def _stores(tmp: Path) -> list[object]:
    out: list[object] = [pytest.param(f"sqlite:///{tmp}/store.db", id="sqlite")]
    for env, name in (("KWORKERS_PG_DSN", "postgres"), ("KWORKERS_REDIS_URL", "redis")):
        url = os.environ.get(env)
        out.append(pytest.param(url, id=name, marks=pytest.mark.skipif(
            not url, reason=f"{env} not set (scripts/test starts the server)")))
    return out


STORES = _stores(Path("/tmp/kworkers-stores"))


def _fresh_store_url(url: str, tmp: Path) -> str:
    if url.startswith("sqlite"):
        return f"sqlite:///{tmp}/store.db"
    return url


def _produce_activities(bs: str, topic: str, n: int, prefix: str) -> set[str]:
    keys = set()
    p = produce(bs, topic, [])
    assert p == 0
    for i in range(n):
        wf, act = f"{prefix}-wf{i}", f"act{i % 3}"
        keys.add(f"{wf}/{act}")
        produce(bs, topic, [(wf.encode(), f"{wf}/{act}".encode())],
                headers=list(ids_to_headers(wf, act)))  # type: ignore[arg-type]
    return keys


def _produce_many(bs: str, topic: str, n: int, prefix: str) -> set[str]:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bs, "enable.idempotence": True, "log_level": 3})
    keys = set()
    for i in range(n):
        wf, act = f"{prefix}-wf{i}", "charge"
        keys.add(f"{wf}/{act}")
        p.produce(topic, key=wf.encode(), value=b"payload",
                  headers=list(ids_to_headers(wf, act)))
        if i % 100 == 0:
            p.poll(0)
    assert p.flush(30) == 0
    return keys


def _until(cond: Callable[[], bool], timeout: float, tick: Callable[[], None], what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        tick()
        time.sleep(0.2)


def _workers(n: int, bs: str, topic: str, group: str, ledger: Path, store: str, tmp: Path,
             *extra: str) -> list[WorkerProcess]:
    args = ["-m", "tests.apps.activity_worker", bs, topic, group, str(ledger), store, *extra]
    return [WorkerProcess(args, tmp, f"w{i}", cwd=ROOT) for i in range(n)]


def _keep_alive(workers: list[WorkerProcess]) -> Callable[[], None]:
    def tick() -> None:
        for w in workers:
            if not w.alive:
                w.start()
    return tick


def _effects_for(ledger: Ledger, keys: set[str]) -> dict[str, int]:
    rows = ledger.effect_values()
    return {k: rows.count(k) for k in keys}


def test_worker_killed_between_claim_and_effect(kafka_broker: Broker, tmp_path: Path) -> None:
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("claim"), 2), unique("g")
    markers = tmp_path / "markers"
    markers.mkdir()
    ledger = Ledger(tmp_path / "ledger.db")
    keys = _produce_many(bs, topic, 6, "claim")
    workers = _workers(2, bs, topic, group, tmp_path / "ledger.db",
                       f"sqlite:///{tmp_path}/store.db", tmp_path,
                       "--die-between-claim-and-effect", str(markers), "--lease-s", "2")
    try:
        tick = _keep_alive(workers)
        tick()
        _until(lambda: set(ledger.effect_values()) >= keys, 240, tick, "every effect")
        assert len(os.listdir(markers)) == len(keys)  # every key's first claimant died
        assert all(n == 1 for n in _effects_for(ledger, keys).values())
        deliveries = ledger.delivery_counts()
        assert all(deliveries[k] >= 2 for k in keys)
    finally:
        for w in workers:
            w.close()


def test_heartbeat_checkpoint_survives_a_kill(kafka_broker: Broker, tmp_path: Path) -> None:
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("hb"), 1), unique("g")
    markers = tmp_path / "markers"
    markers.mkdir()
    ledger = Ledger(tmp_path / "ledger.db")
    keys = _produce_many(bs, topic, 1, "hb")
    (key,) = keys
    workers = _workers(1, bs, topic, group, tmp_path / "ledger.db",
                       f"sqlite:///{tmp_path}/store.db", tmp_path,
                       "--heartbeat-and-die", str(markers), "--lease-s", "2")
    try:
        tick = _keep_alive(workers)
        tick()
        _until(lambda: key in ledger.effect_values(), 180, tick, "the effect")
        seen = dict(ledger._conn().execute(
            "SELECT key, value FROM effects WHERE key LIKE 'seen/%'").fetchall())
        assert seen[f"seen/{key}/1"] == f"|{key}"  # attempt 1 started from scratch
        assert seen[f"seen/{key}/2"] == f"ckpt-3|{key}"  # attempt 2 resumed, same key
    finally:
        for w in workers:
            w.close()


@pytest.mark.parametrize("store", STORES)
def test_flaky_kill_loop_exactly_once(fault_broker: Broker, tmp_path: Path, store: str) -> None:
    bs = fault_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("loop"), 6), unique("g")
    ledger = Ledger(tmp_path / "ledger.db")
    prefix = unique("act")  # fresh keys: the Postgres/Redis stores are shared between runs
    keys = _produce_many(bs, topic, 500, prefix)
    workers = _workers(3, bs, topic, group, tmp_path / "ledger.db",
                       _fresh_store_url(store, tmp_path), tmp_path, "--fail-rate", "0.5",
                       "--lease-s", "3")
    rnd = random.Random(5)
    kills = 0
    restarted = False
    try:
        tick = _keep_alive(workers)
        tick()

        def chaos() -> None:
            nonlocal kills, restarted
            tick()
            done = len(set(ledger.effect_values()) & keys)
            if kills < 8 and done >= (kills + 1) * 40:
                victim = rnd.choice([w for w in workers if w.alive] or workers)
                if victim.alive:
                    victim.kill()
                    kills += 1
            if not restarted and done >= 250:
                fault_broker.restart(hard=True)
                restarted = True

        _until(lambda: keys <= set(ledger.effect_values()) and kills >= 8 and restarted, 420,
               chaos, "every activity, 8 kills and a broker restart")
        effects = _effects_for(ledger, keys)
        assert all(n == 1 for n in effects.values()), "an effect was applied twice"
        deliveries = ledger.delivery_counts()
        assert any(deliveries[k] > 1 for k in keys), "no redelivery happened"
        assert kills >= 8 and restarted
    finally:
        for w in workers:
            w.close()
        threading.Event().wait(0)
