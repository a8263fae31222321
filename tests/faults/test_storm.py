"""A failure storm on the real broker: the downstream is down, every record fails, then it is back.

Judged from data read back: the source topic (every key in it must be applied), the ledger in
the idempotency store's database (one row per application, no unique key), the tier topics' end
offsets (how many hand-offs were written), /healthz over HTTP and the process's RSS from /proc.
CI size 20,000 records (``KWORKERS_FULL=1``: 100,000).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import NamedTuple

import pytest

from kworkers.idempotency import open_store
from kworkers.testing import Broker
from kworkers.testing.broker import free_port
from kworkers.testing.checker import Report, check, committed, read_log
from kworkers.testing.ledger import Ledger
from kworkers.testing.workload import end_offsets_total, full_size, make_topic, unique
from tests.integration.conftest import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.faults]
ROOT = str(Path(__file__).resolve().parents[2])
PARTS = 6
TIERS = ("1s", "2s", "4s")
#: what the worker may hold, whatever the backlog: both consumers' read-ahead (64 MiB each by
#: default), max_in_flight and the timer heap (+ one batch), the hand-off window, the runtime
RSS_BOUND_MB = 600


def _fill(bs: str, topic: str, n: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bs, "linger.ms": 20, "log_level": 3})
    for i in range(n):
        while True:
            try:
                p.produce(topic, key=b"k%d" % (i % 64), value=b"%d" % i, partition=i % PARTS)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0


def _health(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _store_url(tmp: Path) -> str:
    return os.environ.get("KWORKERS_PG_DSN") or f"sqlite:///{tmp}/store.db"


class Storm(NamedTuple):
    report: Report
    code: int
    out: str
    health: list[int]
    rss: list[float]
    tier_writes: int
    log_records: int


def _storm(bs: str, tmp: Path, n: int, outage_s: float, breaker: bool) -> Storm:
    topic, group = make_topic(bs, unique("storm"), PARTS), unique("g")
    table = "ledger_" + topic.replace("-", "_")
    _fill(bs, topic, n)
    down = tmp / "down"
    down.touch()
    port = free_port()
    env = {**os.environ, "KWORKERS_BOOTSTRAP_SERVERS": bs, "KWORKERS_TOPICS": topic,
           "KWORKERS_GROUP_ID": group, "STORM_DOWN": str(down), "PYTHONUNBUFFERED": "1",
           "STORM_STORE": _store_url(tmp), "STORM_TABLE": table,
           "STORM_BREAKER": "1" if breaker else "0"}
    log_path = tmp / f"worker-{int(breaker)}.log"
    log = open(log_path, "wb")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [sys.executable, "-m", "kworkers.cli", "run", "tests.apps.storm_worker:worker",
         "--metrics-port", str(port), "--log-level", "WARNING"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    ledger = Ledger.on_store(open_store(_store_url(tmp)), table=table)
    health: list[int] = []
    rss: list[float] = []

    def sample() -> None:
        assert proc.poll() is None, log_path.read_text("utf-8", "replace")[-3000:]
        health.append(_health(port))
        rss.append(_rss_mb(proc.pid))

    try:
        wait_for(lambda: _health(port) == 200 or proc.poll() is not None, 90, "worker up")
        t_end = time.monotonic() + outage_s

        def tiers() -> int:
            return sum(end_offsets_total(bs, f"{topic}.retry.{t}", PARTS) for t in TIERS)

        # Down for at least ``outage_s`` and, without a breaker, until every record failed once
        # (on a loaded machine the first pass takes longer than the outage).
        while time.monotonic() < t_end or (not breaker and tiers() < n):
            sample()
            time.sleep(0.25)
        tier_writes = tiers()
        down.unlink()  # the downstream is back

        def done() -> bool:
            sample()
            return len(ledger.applications()) >= n

        wait_for(done, 600, "every record applied")
        wait_for(lambda: sum(v for v in committed(bs, group, topic).values()) == n, 60,
                 "committed to the end")
        sample()
        proc.terminate()
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    out = log_path.read_text("utf-8", "replace")
    report = check(ledger, log=None, expected={f"{topic}/{i}" for i in range(n)})
    source = read_log(bs, topic)
    return Storm(report, code, out, health, rss, tier_writes,
                 sum(len(r) for r in source.records.values()))


def test_a_downstream_outage_loses_nothing_and_applies_each_record_once(
        kafka_broker: Broker, tmp_path: Path) -> None:
    n = full_size(100_000, 20_000)
    r = _storm(kafka_broker.bootstrap_servers, tmp_path, n, outage_s=8.0, breaker=False)
    print(f"storm: {r.report.summary()} tier_writes={r.tier_writes} "
          f"peak_rss_mb={max(r.rss):.0f} health={sorted(set(r.health))} exit={r.code}")
    assert r.report.ok, r.report.summary()
    assert r.report.applications == n and r.log_records == n
    assert r.tier_writes >= n  # the storm happened: every record went through a tier
    assert set(r.health) == {200}, r.health  # truthful: the worker itself was fine
    assert max(r.rss) < RSS_BOUND_MB, max(r.rss)
    assert r.code == 0, r.out[-3000:]
    assert "worker unhealthy" not in r.out and "Traceback" not in r.out


def test_with_the_breaker_on_records_wait_in_the_source_instead_of_the_tiers(
        kafka_broker: Broker, tmp_path: Path) -> None:
    n = full_size(20_000, 5_000)
    r = _storm(kafka_broker.bootstrap_servers, tmp_path, n, outage_s=8.0, breaker=True)
    print(f"breaker: {r.report.summary()} tier_writes={r.tier_writes} "
          f"peak_rss_mb={max(r.rss):.0f} health={sorted(set(r.health))} exit={r.code}")
    assert r.report.ok, r.report.summary()
    assert r.report.applications == n
    assert "circuit breaker closed -> open" in r.out, r.out[-3000:]
    assert "half_open -> closed" in r.out, r.out[-3000:]
    # Without a breaker every record goes through a tier (the test above); with it, the ones
    # tried before it opened, plus one probe per cool-down, while the rest waits in Kafka.
    assert r.tier_writes < n // 10, r.tier_writes
    assert set(r.health) == {200} and r.code == 0
