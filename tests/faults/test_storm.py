"""A failure storm on the real broker: the downstream is down, every record fails, then it is back.

Judged from data read back: the source topic (every record in it must be applied once, judged
per record by the checker against the ledger's deliveries and the commits read back
throughout), the ledger in the idempotency store's database (one row per handler call and per
application, no unique key), the tier topics' end offsets and each record's deliveries from a
tier (the storm happened to every record), /healthz over HTTP and the process's RSS from
/proc.

The memory bound is asserted where it can fail: the worker runs with small bounds (in flight,
timer heap, hand-offs, librdkafka's read-ahead), records of 4 KB and a backlog far above what
those bounds let it hold, and its RSS must stay within the bound docs/RELIABILITY.md states for
those settings (``rss_bound_mb``). The canary runs the same storm with the bounds lifted (the
defaults) and exceeds the same limit.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple, cast

import pytest
from confluent_kafka import Producer

from kworkers.envelope.envelope import ids_to_headers
from kworkers.idempotency import TransactionalStore, open_store
from kworkers.testing import Broker, processes
from kworkers.testing.broker import free_port
from kworkers.testing.checker import CommitSampler, LogRecord, Report, check, read_log, record_key
from kworkers.testing.ledger import Ledger
from kworkers.testing.workload import (
    end_offsets_total,
    full_size,
    make_topic,
    produce_patiently,
    unique,
)
from tests.faults import support
from tests.integration.conftest import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.faults]
ROOT = str(Path(__file__).resolve().parents[2])
PARTS = 6
TIERS = ("1s", "2s", "4s")
VALUE_BYTES = 4096
#: small bounds, so that the memory bound can fail: a few thousand records of 4 KB
SMALL = {"max_in_flight": 600, "max_in_flight_per_partition": 100, "delay_buffer": 600,
         "handoff_limit": 300, "consume_batch": 100}
SMALL_CLIENT = {"queued.max.messages.kbytes": 1024, "fetch.max.bytes": 1_048_576,
                "max.partition.fetch.bytes": 262_144}
#: what a record held in memory may cost beyond its value (docs/RELIABILITY.md): the Message
#: tuple, its key and headers (a tier record carries a dozen kw-* headers), its lane entry
RECORD_OVERHEAD = 4096
#: what a busy worker uses beyond an idle one whatever it holds (docs/RELIABILITY.md): the
#: clients' working buffers, the store's and the runners' (measured: about 6 MB)
BUSY_MB = 8


def records_bound(limits: Mapping[str, int]) -> int:
    """Records the worker may hold at worst: the main loop's (``max_in_flight`` plus one poll
    each partition), the timer heap's (``delay_buffer`` likewise, over the tier partitions)
    and both loops' unacknowledged hand-offs."""
    return (limits["max_in_flight"] + max(limits["max_in_flight"], PARTS)
            + limits["delay_buffer"] + max(limits["delay_buffer"], PARTS * len(TIERS))
            + 2 * limits["handoff_limit"])


def rss_bound_mb(limits: Mapping[str, int], client: Mapping[str, int]) -> float:
    """What the worker may hold beyond its idle RSS, by docs/RELIABILITY.md's memory bound:
    each consumer's read-ahead (``queued.max.messages.kbytes``, plus one fetch), the records
    of ``records_bound``, each its value plus ``RECORD_OVERHEAD``, and ``BUSY_MB``."""
    fetched = 2 * (client["queued.max.messages.kbytes"] * 1024 + client["fetch.max.bytes"])
    held = records_bound(limits) * (VALUE_BYTES + RECORD_OVERHEAD)
    return (fetched + held) / 2**20 + BUSY_MB


def _fill(bs: str, topic: str, n: int) -> None:
    """``n`` activities ``s<i>/a`` of ``VALUE_BYTES`` each, spread over the partitions."""
    p = Producer({"bootstrap.servers": bs, "linger.ms": 20, "log_level": 3})
    pad = b"x" * VALUE_BYTES
    for i in range(n):
        value = (b"%d " % i + pad)[:VALUE_BYTES]
        produce_patiently(p, topic, key=b"k%d" % (i % 64), value=value, partition=i % PARTS,
                          headers=list(ids_to_headers(f"s{i}", "a")))
    assert p.flush(60) == 0


def _store_url(tmp: Path) -> str:
    return os.environ.get("KWORKERS_PG_DSN") or f"sqlite:///{tmp}/store.db"


def _env(pairs: Mapping[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in pairs.items())


class Storm(NamedTuple):
    report: Report
    code: int
    out: str
    health: list[int]
    rss: list[float]
    idle_rss: float
    tier_writes: int
    log_records: int
    through_a_tier: int


def _storm(bs: str, tmp: Path, n: int, outage_s: float, breaker: bool,
           limits: Mapping[str, int] | None = None, client: Mapping[str, int] | None = None,
           stop_above_mb: float | None = None) -> Storm:
    """One ``kworkers run`` worker on an empty topic (its idle RSS read first), then ``n``
    records while the downstream is down. ``stop_above_mb``: the canary's run, stopped once
    the RSS grew that much past idle (or every record failed once)."""
    topic, group = make_topic(bs, unique("storm"), PARTS), unique("g")
    table = "ledger_" + topic.replace("-", "_")
    down = tmp / "down"
    down.touch()
    port = free_port()
    env = {**os.environ, "KWORKERS_BOOTSTRAP_SERVERS": bs, "KWORKERS_TOPICS": topic,
           "KWORKERS_GROUP_ID": group, "STORM_DOWN": str(down), "PYTHONUNBUFFERED": "1",
           "STORM_STORE": _store_url(tmp), "STORM_TABLE": table,
           "STORM_BREAKER": "1" if breaker else "0", "STORM_LIMITS": _env(limits or {}),
           "STORM_CONSUMER": _env(client or {})}
    log_path = tmp / f"worker-{int(breaker)}-{topic}.log"
    log = open(log_path, "wb")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [sys.executable, "-m", "kworkers.cli", "run", "tests.apps.storm_worker:worker",
         "--metrics-port", str(port), "--log-level", "WARNING"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    ledger = Ledger.on_store(cast(TransactionalStore[Any], open_store(_store_url(tmp))),
                             table=table)  # an SQL store's URL
    commits = CommitSampler(bs, group, topic, every=0.5)
    health: list[int] = []
    rss: list[float] = []

    def sample() -> None:
        assert proc.poll() is None, log_path.read_text("utf-8", "replace")[-3000:]
        health.append(processes.health(port))
        rss.append(support.proc_mb(proc.pid))

    def tier_ends() -> int:
        return sum(end_offsets_total(bs, f"{topic}.retry.{t}", PARTS) for t in TIERS)

    def failed_once() -> int:
        """Records delivered from the source while it was down (each of those failed): tier
        writes are no measure, a record that failed again is written again."""
        return len({d.key for d in ledger.deliveries() if d.topic == topic})

    try:
        wait_for(lambda: processes.health(port) == 200 or proc.poll() is not None, 90, "worker up")
        time.sleep(1.0)  # idle: subscribed, assigned, nothing to fetch
        # the sleep's None lets the comprehension pause between samples
        idle = max(support.proc_mb(proc.pid) for _ in range(4)
                   if time.sleep(0.25) is None)  # type: ignore[func-returns-value]
        commits.start()
        _fill(bs, topic, n)
        t_end = time.monotonic() + outage_s
        # Down for at least ``outage_s`` and, without a breaker, until every record failed once
        # (on a loaded machine the first pass takes longer than the outage).
        failed, asked = 0, 0.0
        while time.monotonic() < t_end or (not breaker and failed < n):
            sample()
            if stop_above_mb is not None and max(rss) - idle > stop_above_mb:
                break
            if not breaker and time.monotonic() - asked >= 1.0:
                failed, asked = failed_once(), time.monotonic()
            time.sleep(0.25)
        tier_writes = tier_ends()
        if stop_above_mb is not None:  # the canary: its RSS is all it shows
            proc.kill()
            proc.wait(30)
            return Storm(check(ledger, expected=set(), allow_empty=True), -9, "", health, rss,
                         idle, tier_writes, n, 0)
        down.unlink()  # the downstream is back

        def done() -> bool:
            sample()
            return len(ledger.applications()) >= n

        # under pytest's 300 s in CI, so a stuck run fails with what it waited for (ci100)
        wait_for(done, full_size(600, 200), "every record applied")
        wait_for(lambda: sum(commits.sample().positions.values()) == n, 60,
                 "committed to the end")
        sample()
        proc.terminate()
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
        commits.stop(final=False)
    out = log_path.read_text("utf-8", "replace")
    source = read_log(bs, topic)

    def key_of(r: LogRecord) -> str:
        return f"{topic}/{record_key(r.headers, r.value)}"

    report = check(ledger, log=source, commits=commits.stop(), key_of=key_of)
    # the storm, per record: every source record was also delivered from a tier
    through = {d.key for d in ledger.deliveries() if d.topic != topic and d.attempt >= 2}
    return Storm(report, code, out, health, rss, idle, tier_writes, len(source), len(through))


def test_a_downstream_outage_loses_nothing_and_applies_each_record_once(
        kafka_broker: Broker, tmp_path: Path) -> None:
    n = full_size(60_000, 12_000)
    bound = rss_bound_mb(SMALL, SMALL_CLIENT)
    r = _storm(kafka_broker.bootstrap_servers, tmp_path, n, outage_s=4.0, breaker=False,
               limits=SMALL, client=SMALL_CLIENT)
    grown = max(r.rss) - r.idle_rss
    print(f"storm: {r.report.summary()} tier_writes={r.tier_writes} through a tier "
          f"{r.through_a_tier}; RSS idle {r.idle_rss:.0f} MB, peak {max(r.rss):.0f} MB, grew "
          f"{grown:.0f} MB (bound {bound:.0f} MB for {n} records of {VALUE_BYTES} B, "
          f"{n * VALUE_BYTES / 2**20:.0f} MB); health={sorted(set(r.health))} exit={r.code}")
    assert r.report.ok, r.report.summary()
    assert r.report.applications == n and r.log_records == n
    assert r.report.dup == 0 and r.report.expected == n
    assert r.tier_writes >= n and r.through_a_tier == n  # the storm happened, to every record
    assert set(r.health) == {200}, r.health  # truthful: the worker itself was fine
    # the backlog is far above what the worker may hold: 4 times its records, more than its bytes
    assert n >= 4 * records_bound(SMALL) and n * VALUE_BYTES / 2**20 > bound
    assert grown < bound, (grown, bound)
    assert r.code == 0, r.out[-3000:]
    assert "worker unhealthy" not in r.out and "Traceback" not in r.out


def test_canary_with_the_bounds_lifted_the_same_storm_exceeds_the_bound(
        kafka_broker: Broker, tmp_path: Path) -> None:
    """The defaults (20,000 in flight, 64 MiB of read-ahead per consumer, ...) hold the whole
    backlog: the RSS bound the test above asserts for the small settings is exceeded."""
    n = full_size(60_000, 12_000)
    bound = rss_bound_mb(SMALL, SMALL_CLIENT)
    r = _storm(kafka_broker.bootstrap_servers, tmp_path, n, outage_s=4.0, breaker=False,
               stop_above_mb=bound)
    grown = max(r.rss) - r.idle_rss
    print(f"storm canary (default bounds): RSS idle {r.idle_rss:.0f} MB, grew {grown:.0f} MB "
          f"against the small settings' bound {bound:.0f} MB")
    assert grown > bound, (grown, bound)


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
