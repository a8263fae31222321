"""A pool scaled by KEDA's algorithm on a real broker, with real ``kworkers run`` replicas (#47
item 4).

The loop (``kworkers.testing.scaling_loop``: KEDA's poll and the HPA's sync as documented) reads
what KEDA would read: the rendered ScaledObject's Kafka triggers from KEDA's own Kafka scaler
(``kworkers.testing.keda_probe``, one scaler per trigger kept across polls), its Prometheus
trigger from a real Prometheus scraping the replicas' metrics ports and evaluating the rendered
query. Its answer starts ``kworkers run`` processes or SIGTERMs the newest, as a Deployment's
pods. Everything is counted from the broker (committed offsets, end offsets) and an
append-only ledger, never from the worker's counters.

Speed: every interval divided by ``SPEEDUP`` = 30 (KEDA's pollingInterval 30 s -> 1 s, the
HPA's 15 s sync -> 0.5 s, cooldownPeriod and the scale-down window 300 s -> 10 s, the policies'
periods 15/60 s -> 0.5/2 s, Prometheus scraping every second, the workers' lag gauges
refreshed every 1/6 s instead of 5 s); the retry tier's delay is 15 s (7.5 minutes at full
scale). Records that must not look like a backlog arrive paced, 100 a second: a worker runs as
fast as ever while every interval shrinks thirty-fold, so a burst that fails in half a second,
which a 30 s scrape would almost never see, would be caught by a one-second scrape.

Each scenario keeps its canary beside it, driven by the same loop on the same moments: a
shadow loop (its replicas counted, not started) reading the ScaledObject kworkers rendered
before #47 (raw lag on the source topic and on every retry tier, lagThreshold 100, tiers with
``excludePersistentLag``) from KEDA's scaler on the same broker, or the same ScaledObject
without its drainable-lag trigger; each canary must fail the scenario's check.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from kworkers import TierLadder, WorkerConfig
from kworkers.consumer.processor import LAG_INTERVAL_S
from kworkers.deploy import manifests
from kworkers.retry_tiers.headers import due_at_of
from kworkers.testing import Broker
from kworkers.testing.autoscaling import (
    PARTITIONS,
    RETRY_S,
    SPEEDUP,
    Replicas,
    before_47,
    committed_and_ends,
    drive,
    explain,
    produce_paced,
    render,
    replay,
    reversals,
    topics,
    unstabilized,
    without_drainable,
)
from kworkers.testing.keda_probe import probe_path
from kworkers.testing.ledger import Ledger
from kworkers.testing.prometheus import PrometheusServer, prometheus_binary
from kworkers.testing.scaling_loop import ScalingLoop
from kworkers.testing.workload import full_size, make_topic, produce, read_all, unique

pytestmark = pytest.mark.integration


@pytest.fixture
def prom(tmp_path: Path) -> Iterator[PrometheusServer]:
    prometheus_binary()
    probe_path()
    with PrometheusServer(tmp_path / "prometheus", scrape_interval=30 / SPEEDUP) as p:
        yield p


def _env(monkeypatch: pytest.MonkeyPatch, ledger: Path, **kw: str) -> None:
    monkeypatch.setenv("KW_AS_LEDGER", str(ledger))
    monkeypatch.setenv("KW_AS_RETRY_S", f"{RETRY_S:g}")
    monkeypatch.setenv("KW_AS_LAG_INTERVAL_S", f"{LAG_INTERVAL_S / SPEEDUP:g}")
    for k, v in kw.items():
        monkeypatch.setenv(k, v)


def backlog_problems(loop: ScalingLoop, n: int, applied: Mapping[str, int],
                     committed: int, ends: int) -> list[str]:
    out = []
    if loop.peak <= 1:
        out.append(f"never scaled out past {loop.peak} replica(s) with a backlog of {n}")
    if loop.peak > PARTITIONS:
        out.append(f"scaled to {loop.peak} replicas, more than the {PARTITIONS} partitions")
    lost = [str(i) for i in range(n) if str(i) not in applied]
    twice = {k: c for k, c in applied.items() if c > 1}
    if lost or twice:
        out.append(f"{len(lost)} records lost, {len(twice)} run twice")
    if committed != ends:
        out.append(f"committed {committed} of {ends}")
    if loop.replicas != 0:
        out.append(f"ended at {loop.replicas} replicas, not 0")
    return out


@pytest.mark.parametrize("scale_on", [
    "records",
    # --scale-on seconds (a replica per partition whose drainable time lag is past the
    # target: 30 s, 1 s here): the same proof, by hand only (CI's minutes go to the others)
    pytest.param("seconds", marks=pytest.mark.full_only)])
def test_a_backlog_scales_out_drains_once_and_returns_to_zero(
        kafka_broker: Broker, prom: PrometheusServer, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, scale_on: str) -> None:
    from kworkers.deploy.autoscale import DEFAULT_TIME_LAG_TARGET_S, Autoscale

    bs = kafka_broker.bootstrap_servers
    topic, group = topics(bs, "scale"), unique("g")
    n = full_size(4000, 800)
    ledger_path = tmp_path / "ledger.db"
    _env(monkeypatch, ledger_path, KW_AS_SLOW_MS="100")
    if scale_on == "records":
        so = render(bs, topic, group, prom.url)
    else:
        cfg = WorkerConfig(topics=(topic,), group_id=group, bootstrap_servers=bs,
                           tiers=TierLadder((RETRY_S,)))
        so = manifests(cfg, image="kworkers/worker:test", app="scaled", module="m:worker",
                       partitions=PARTITIONS, allow_loopback=True, autoscale=Autoscale(
                           prom.url, "seconds",
                           time_lag_target=DEFAULT_TIME_LAG_TARGET_S / SPEEDUP),
                       )["keda/scaledobject.yaml"]
        assert "kworkers_drainable_time_lag_seconds" in str(so)
    produce(bs, topic, ((f"k{i}".encode(), str(i).encode()) for i in range(n)))
    replicas = Replicas(tmp_path, bs, topic, group, prom)
    drained: list[float] = []

    def until(now: float, loop: ScalingLoop) -> bool:
        if not drained and now > 1 and int(now * 10) % 5 == 0:
            committed, ends = committed_and_ends(bs, group, topic)
            if committed == ends:
                drained.append(now)
        return bool(drained) and loop.replicas == 0

    run = drive(so, {"no drainable trigger": without_drainable(so)}, bs, prom, replicas, until)
    committed, ends = committed_and_ends(bs, group, topic)
    applied = Ledger(ledger_path).applications()
    events = [(round(e.at, 1), e.before, e.after, e.by) for e in run.loop.events]
    print(f"backlog {n} ({scale_on}): events {events}; drained at {drained[0]:.1f} s; "
          f"replicas started {replicas.started}")
    assert all(code == 0 for _, code in run.exit_codes), run.exit_codes
    assert backlog_problems(run.loop, n, applied, committed, ends) == []
    # the loop went to zero only after the cooldown: KEDA's last active poll + cooldownPeriod
    last = run.loop.events[-1]
    assert last.after == 0 and last.by == "keda"
    assert run.loop.last_active is not None
    assert last.at - run.loop.last_active >= run.loop.spec.cooldown
    canary = run.shadows["no drainable trigger"].loop
    problems = backlog_problems(canary, n, applied, committed, ends)
    print(f"canary (no drainable trigger): {problems}")
    assert any("never scaled out" in p for p in problems)


def test_retries_waiting_in_a_tier_keep_one_replica_never_more_never_zero(
        kafka_broker: Broker, prom: PrometheusServer, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every record's first attempt fails: it waits RETRY_S in the tier. From the moment the
    source topic is drained (read from the broker) until the first record comes due (its
    kw-due-at, read from the tier topic), the pool holds exactly one replica; it never goes to
    zero before the ledger holds every record; after, it returns to zero. Canary: the
    ScaledObject before #47 (raw tier lag, excludePersistentLag) asks for more than one."""
    bs = kafka_broker.bootstrap_servers
    topic, group = topics(bs, "wait"), unique("g")
    n = full_size(2000, 400)
    ledger_path = tmp_path / "ledger.db"
    _env(monkeypatch, ledger_path, KW_AS_FAIL_FIRST="1")
    so = render(bs, topic, group, prom.url)
    canary_so = before_47(render(bs, topic, group, None))
    tier = f"{topic}.retry.{int(RETRY_S)}s"
    replicas = Replicas(tmp_path, bs, topic, group, prom)
    ledger = Ledger(ledger_path)
    state: dict[str, Any] = {"produced": False, "drained": None, "first_due": None,
                             "complete": None}
    produce(bs, topic, [(b"k0", b"0")])  # wakes the pool: one replica
    paced = threading.Thread(target=produce_paced, args=(bs, topic, range(1, n)), daemon=True)

    def on_step(now: float, loop: ScalingLoop) -> None:
        if not state["produced"] and replicas.ready():
            # the rest only once a replica runs, paced: each fails at once, so the source
            # topic's drainable lag stays near 0 and only the tier's waiting records remain
            paced.start()
            state["produced"] = True
        if state["produced"] and state["drained"] is None and int(now * 10) % 5 == 0:
            committed, ends = committed_and_ends(bs, group, topic)
            tier_records = read_all(bs, tier, 2) if committed == ends else []
            if committed == ends and len(tier_records) >= n:
                state["drained"] = now
                dues = [due_at_of(tuple(h.items())) for _, _, h in tier_records]
                # wall-clock due times, mapped onto the loop's clock
                state["first_due"] = now + min(d for d in dues if d is not None) - time.time()
        if state["drained"] is not None and state["complete"] is None \
                and int(now * 10) % 5 == 0 and len(ledger.applications()) >= n:
            state["complete"] = now

    def until(now: float, loop: ScalingLoop) -> bool:
        return state["complete"] is not None and loop.replicas == 0

    run = drive(so, {"before #47": canary_so}, bs, prom, replicas, until, on_step)
    applied = ledger.applications()
    print(f"waiting retries {n}: events "
          f"{[(round(e.at, 1), e.before, e.after, e.by) for e in run.loop.events]}; "
          f"drained {state['drained']:.1f}, first due {state['first_due']:.1f}, "
          f"complete {state['complete']:.1f}")
    assert all(code == 0 for _, code in run.exit_codes), run.exit_codes
    assert sorted(applied, key=int) == [str(i) for i in range(n)]
    assert set(applied.values()) == {1}

    def waiting_problems(events: Sequence[Any], trace: Sequence[tuple[float, int]]) -> list[str]:
        lo, hi = state["drained"], state["first_due"]
        out = [f"{r} replicas at {t:.1f} s while the retries waited" for t, r in trace
               if lo <= t < hi and r != 1]
        out += [f"{r} replicas at {t:.1f} s before every retry ran" for t, r in trace
                if state["drained"] <= t < state["complete"] and r == 0]
        return out

    assert state["first_due"] > state["drained"], state
    assert waiting_problems(run.loop.events, run.trace) == [], explain(run)
    assert run.loop.replicas == 0
    shadow = run.shadows["before #47"].loop
    shadow_trace = replay(shadow)
    problems = waiting_problems(shadow.events, shadow_trace)
    print(f"canary (before #47): {problems[:3]} ({len(problems)} in all)")
    assert problems


def test_an_open_breaker_with_the_downstream_down_does_not_grow_the_pool(
        kafka_broker: Broker, prom: PrometheusServer, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The downstream is down: the first records fail and open the breaker (seen in the
    ledger's deliveries); then a backlog arrives and waits, held by the breaker, for
    ``DOWN_S`` = 10 s (5 minutes at full scale). All that time the pool keeps exactly one
    replica (the backlog is lag, not drainable lag). The downstream comes back: the backlog
    drains (now drainable, it may scale out), every record applied once, back to zero.
    Canary: the ScaledObject before #47 (raw lag) asks for 4 while the downstream is down."""
    down_s = 10.0
    bs = kafka_broker.bootstrap_servers
    topic, group = topics(bs, "down"), unique("g")
    n = full_size(2000, 400)
    ledger_path, down = tmp_path / "ledger.db", tmp_path / "down"
    down.touch()
    _env(monkeypatch, ledger_path, KW_AS_DOWN=str(down), KW_AS_BREAKER="1",
         KW_AS_SLOW_MS="20")
    so = render(bs, topic, group, prom.url)
    canary_so = before_47(render(bs, topic, group, None))
    replicas = Replicas(tmp_path, bs, topic, group, prom)
    ledger = Ledger(ledger_path)
    first = 10
    produce(bs, topic, ((f"k{i}".encode(), str(i).encode()) for i in range(first)))
    state: dict[str, Any] = {"open": None, "up": None, "complete": None}

    def on_step(now: float, loop: ScalingLoop) -> None:
        tick = int(now * 10) % 5 == 0
        if state["open"] is None and tick and len(ledger.deliveries()) >= 5:
            produce(bs, topic, ((f"k{i}".encode(), str(i).encode()) for i in range(first, n)))
            state["open"] = now
        if state["open"] is not None and state["up"] is None and now >= state["open"] + down_s:
            down.unlink()
            state["up"] = now
        if state["up"] is not None and state["complete"] is None and tick \
                and len(ledger.applications()) >= n:
            state["complete"] = now

    def until(now: float, loop: ScalingLoop) -> bool:
        return state["complete"] is not None and loop.replicas == 0

    run = drive(so, {"before #47": canary_so}, bs, prom, replicas, until, on_step)
    applied = ledger.applications()
    print(f"breaker open, backlog {n}: events "
          f"{[(round(e.at, 1), e.before, e.after, e.by) for e in run.loop.events]}; "
          f"open {state['open']:.1f}, up {state['up']:.1f}, complete {state['complete']:.1f}; "
          f"{len(ledger.deliveries())} failed attempts")
    assert all(code == 0 for _, code in run.exit_codes), run.exit_codes
    assert sorted(applied, key=int) == [str(i) for i in range(n)]
    assert set(applied.values()) == {1}
    committed, ends = committed_and_ends(bs, group, topic)
    assert committed == ends

    def down_problems(trace: Sequence[tuple[float, int]]) -> list[str]:
        return [f"{r} replicas at {t:.1f} s with the downstream down" for t, r in trace
                if state["open"] <= t < state["up"] and r != 1]

    assert down_problems(run.trace) == []
    assert run.loop.replicas == 0
    problems = down_problems(replay(run.shadows["before #47"].loop))
    print(f"canary (before #47): {problems[:3]} ({len(problems)} in all)")
    assert problems


def test_steady_load_does_not_flap(kafka_broker: Broker, prom: PrometheusServer,
                                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records arrive at a steady 100/s, more than one replica runs (4 handlers of 50 ms: at
    most 80/s), for 20 s (10 minutes at full scale; 120 s with KWORKERS_FULL). While the load
    lasts the replica count never reverses direction (no scale-down followed by a scale-up,
    or the reverse); every record is applied once; back to zero after. Canary: the same loop
    without scale-down stabilization, on the same figures, reverses."""
    from kworkers.testing.workload import produce_steady

    load_s, rate = float(full_size(120, 20)), 100.0
    bs = kafka_broker.bootstrap_servers
    topic, group = topics(bs, "steady"), unique("g")
    n = int(load_s * rate)
    ledger_path = tmp_path / "ledger.db"
    _env(monkeypatch, ledger_path, KW_AS_SLOW_MS="50")
    so = render(bs, topic, group, prom.url)
    replicas = Replicas(tmp_path, bs, topic, group, prom)
    ledger = Ledger(ledger_path)
    producer = threading.Thread(target=produce_steady, args=(bs, topic, n, rate), daemon=True)
    state: dict[str, Any] = {"started": None, "ended": None, "complete": None}

    def on_step(now: float, loop: ScalingLoop) -> None:
        if state["started"] is None:
            producer.start()
            state["started"] = now
        if state["ended"] is None and not producer.is_alive():
            state["ended"] = now
        if state["ended"] is not None and state["complete"] is None \
                and int(now * 10) % 5 == 0 and len(ledger.applications()) >= n:
            state["complete"] = now

    def until(now: float, loop: ScalingLoop) -> bool:
        return state["complete"] is not None and loop.replicas == 0

    run = drive(so, {"unstabilized": unstabilized(so)}, bs, prom, replicas, until, on_step)
    applied = ledger.applications()
    settled, ended = state["started"], state["ended"]
    print(f"steady {rate:g}/s for {load_s:g} s: events "
          f"{[(round(e.at, 1), e.before, e.after, e.by) for e in run.loop.events]}; "
          f"load ended {ended:.1f}, complete {state['complete']:.1f}")
    assert all(code == 0 for _, code in run.exit_codes), run.exit_codes
    assert len(applied) == n and set(applied.values()) == {1}
    assert run.loop.peak > 1  # the load needs more than one replica: it did scale
    assert reversals(run.trace, settled, ended) == 0
    assert run.loop.replicas == 0
    canary = reversals(replay(run.shadows["unstabilized"].loop), settled, ended)
    print(f"canary (no scale-down stabilization): {canary} reversals; events "
          f"{[(round(e.at, 1), e.after) for e in run.shadows['unstabilized'].loop.events]}")
    assert canary > 0


def _transactions(bs: str, topic: str, n: int) -> None:
    """``n`` records in committed transactions of 50, each spread over every partition, and
    one aborted transaction of 20 in the middle (never to be applied)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bs, "transactional.id": unique("tx"), "log_level": 3})
    p.init_transactions(30)
    for start in range(0, n, 50):
        p.begin_transaction()
        for i in range(start, min(n, start + 50)):
            p.produce(topic, key=f"k{i}".encode(), value=str(i).encode(),
                      partition=i % PARTITIONS)
        p.commit_transaction(30)
        if start == 100:
            p.begin_transaction()
            for i in range(20):
                p.produce(topic, value=f"aborted-{i}".encode(), partition=i % PARTITIONS)
            p.abort_transaction(30)


def _naive_commit(bs: str, topic: str, group: str) -> None:
    """Commits for ``group`` what a consumer that processed every committed record commits
    when it does not step past the transaction markers: the last record's offset + 1."""
    c = Consumer({"bootstrap.servers": bs, "group.id": unique("reader"), "log_level": 3,
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    last: dict[int, int] = {}
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        idle = 0
        while idle < 10:
            m = c.poll(0.5)
            if m is None or m.error():
                idle += 1
                continue
            part, offset = m.partition(), m.offset()
            assert part is not None and offset is not None
            last[part] = max(last.get(part, -1), offset)
        # the ends read after the records, not before: read first, under load, one partition's
        # end once came back below records read after it (95 against 106, a fresh clone's CI)
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                for p in range(PARTITIONS)}
    finally:
        c.close()
    assert all(last[p] + 1 < ends[p] for p in last), (last, ends)  # a marker follows
    naive = Consumer({"bootstrap.servers": bs, "group.id": group, "log_level": 3})
    try:
        naive.commit(offsets=[TopicPartition(topic, p, o + 1) for p, o in last.items()],
                     asynchronous=False)
    finally:
        naive.close()


def test_a_group_reading_an_exactly_once_topic_scales_to_zero(
        kafka_broker: Broker, prom: PrometheusServer, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A downstream pool reads a topic written in transactions (committed ones, and an aborted
    one it must never apply): woken by the lag, it runs every committed record once, commits
    past the markers, and KEDA's own scaler then reads lag 0: the loop takes it to zero.
    Canary: a group that committed what it processed (the last record + 1, not past the
    markers; KEDA issue 5880) keeps the same loop at one replica for good."""
    bs = kafka_broker.bootstrap_servers
    topic, group = topics(bs, "eos"), unique("g")
    n = full_size(2000, 400)
    ledger_path = tmp_path / "ledger.db"
    _env(monkeypatch, ledger_path, KW_AS_SLOW_MS="5")
    _transactions(bs, topic, n)
    naive = unique("naive")
    _naive_commit(bs, topic, naive)
    so = render(bs, topic, group, prom.url)
    canary_so = render(bs, topic, naive, prom.url)
    replicas = Replicas(tmp_path, bs, topic, group, prom)
    ledger = Ledger(ledger_path)
    state: dict[str, Any] = {"complete": None}

    def on_step(now: float, loop: ScalingLoop) -> None:
        if state["complete"] is None and int(now * 10) % 5 == 0 \
                and len(ledger.applications()) >= n:
            state["complete"] = now

    def until(now: float, loop: ScalingLoop) -> bool:
        return state["complete"] is not None and loop.replicas == 0

    run = drive(so, {"naive commits": canary_so}, bs, prom, replicas, until, on_step)
    applied = ledger.applications()
    committed, ends = committed_and_ends(bs, group, topic)
    print(f"exactly-once topic, {n} records: events "
          f"{[(round(e.at, 1), e.before, e.after, e.by) for e in run.loop.events]}; "
          f"complete {state['complete']:.1f}; committed {committed} of {ends}")
    assert all(code == 0 for _, code in run.exit_codes), run.exit_codes
    assert sorted(applied, key=int) == [str(i) for i in range(n)]
    assert set(applied.values()) == {1}
    assert committed == ends
    assert run.loop.replicas == 0 and run.loop.events[-1].by == "keda"
    shadow = run.shadows["naive commits"].loop
    print(f"canary (naive commits): ends at {shadow.replicas} replica(s); last reading "
          f"{[(f.name, f.value, f.active) for f in shadow.readings[-1][1]]}")
    assert shadow.replicas == 1




def test_a_pool_wide_rate_limit_at_its_bound_does_not_grow_the_pool(
        kafka_broker: Broker, prom: PrometheusServer, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A backlog behind a pool-wide rate limit (20 records/s for every replica, one bucket in
    Redis): more replicas would only wait for the same tokens. The pool keeps exactly one
    replica until the backlog ran, every record once, then zero. Canary: the ScaledObject
    before #47 (raw lag; it wanted an explicit max_replicas for this reason) asks for 3."""
    from kworkers.pace import RateLimit
    from tests.faults.support import store_url

    store = store_url("redis", tmp_path)
    bs = kafka_broker.bootstrap_servers
    topic, group = topics(bs, "rate"), unique("g")
    n = full_size(1200, 300)
    ledger_path = tmp_path / "ledger.db"
    _env(monkeypatch, ledger_path, KW_AS_RATE="20", KW_AS_RATE_STORE=store,
         KW_AS_RATE_NAME=unique("bucket"))
    limit = RateLimit(per_second=20, burst=5, scope="pool")
    so = render(bs, topic, group, prom.url, rate_limit=limit)
    # before #47, raw lag: an operator gave max_replicas = the partitions (render's default)
    canary_so = before_47(render(bs, topic, group, None))
    produce(bs, topic, ((f"k{i}".encode(), str(i).encode()) for i in range(n)))
    replicas = Replicas(tmp_path, bs, topic, group, prom)
    ledger = Ledger(ledger_path)
    state: dict[str, Any] = {"complete": None}

    def on_step(now: float, loop: ScalingLoop) -> None:
        if state["complete"] is None and int(now * 10) % 5 == 0 \
                and len(ledger.applications()) >= n:
            state["complete"] = now

    def until(now: float, loop: ScalingLoop) -> bool:
        return state["complete"] is not None and loop.replicas == 0

    run = drive(so, {"before #47": canary_so}, bs, prom, replicas, until, on_step)
    applied = ledger.applications()
    print(f"rate-limited backlog {n}: events "
          f"{[(round(e.at, 1), e.before, e.after, e.by) for e in run.loop.events]}; "
          f"complete {state['complete']:.1f}")
    assert all(code == 0 for _, code in run.exit_codes), run.exit_codes
    assert sorted(applied, key=int) == [str(i) for i in range(n)]
    assert set(applied.values()) == {1}

    def limited_problems(trace: Sequence[tuple[float, int]]) -> list[str]:
        return [f"{r} replicas at {t:.1f} s behind the pool's rate limit" for t, r in trace
                if 0 < t < state["complete"] and r > 1]

    assert limited_problems(run.trace) == [], explain(run)
    assert run.loop.replicas == 0
    problems = limited_problems(replay(run.shadows["before #47"].loop))
    print(f"canary (before #47): {problems[:3]} ({len(problems)} in all)")
    assert problems


def test_scheduled_records_not_yet_due_keep_one_replica_never_more_never_zero(
        kafka_broker: Broker, prom: PrometheusServer, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler's pool (``kworkers run`` of a Scheduler's worker: its rungs are its source
    topics), rendered by ``deploy render`` like any pool: 200 records scheduled 20 s ahead
    (10 minutes at full scale; scheduling them takes a few seconds, each durable in its rung)
    wake it and keep exactly one replica until the first comes due, never zero until every
    one was delivered (read from the destination topic: each id once), then zero. Canary: the
    ScaledObject before #47 (raw lag on the rungs) asks for 2."""
    from kworkers.idempotency import SqliteStore
    from tests.apps.autoscale_scheduler import LADDER, SETTINGS, scheduler

    bs = kafka_broker.bootstrap_servers
    dest, group = make_topic(bs, unique("sched"), PARTITIONS), unique("g")
    store = f"sqlite:///{tmp_path / 'schedule.db'}"
    SqliteStore(tmp_path / "schedule.db")  # made before the replicas share it
    s = scheduler(bs, store, dest)
    s.create_topics(PARTITIONS, **SETTINGS)
    cfg = s.worker(group, transactional_id="render", **SETTINGS).config
    objs = manifests(cfg, image="kworkers/worker:test", app="scheduler", module="m:worker",
                     partitions=PARTITIONS, prometheus=prom.url, allow_loopback=True)
    so = objs["keda/scaledobject.yaml"]
    canary_so = before_47(manifests(cfg, image="kworkers/worker:test", app="scheduler",
                                    module="m:worker", partitions=PARTITIONS,
                                    allow_loopback=True)["keda/scaledobject.yaml"])
    n, ahead = full_size(1000, 200), 20.0
    monkeypatch.setenv("KW_AS_BOOTSTRAP", bs)
    monkeypatch.setenv("KW_AS_STORE", store)
    monkeypatch.setenv("KW_AS_DEST", dest)
    monkeypatch.setenv("KW_AS_GROUP", group)
    monkeypatch.setenv("KW_AS_LAG_INTERVAL_S", f"{LAG_INTERVAL_S / SPEEDUP:g}")
    first_due = time.time() + ahead
    try:
        for i in range(n):
            s.schedule(dest, str(i).encode(), key=f"k{i}", after=ahead, id=f"id-{i}")
    finally:
        s.close()
    replicas = Replicas(tmp_path, bs, "", group, prom, app="tests.apps.autoscale_scheduler:worker")
    state: dict[str, Any] = {"first_due": None, "complete": None}

    def delivered() -> list[bytes]:
        return [h["kw-scheduled-id"] for _, _, h in read_all(bs, dest, 2)
                if "kw-scheduled-id" in h]

    def on_step(now: float, loop: ScalingLoop) -> None:
        if state["first_due"] is None:
            state["first_due"] = now + first_due - time.time()
        if state["complete"] is None and now > state["first_due"] and int(now * 10) % 10 == 0 \
                and len(set(delivered())) >= n:
            state["complete"] = now

    def until(now: float, loop: ScalingLoop) -> bool:
        return state["complete"] is not None and loop.replicas == 0

    run = drive(so, {"before #47": canary_so}, bs, prom, replicas, until, on_step)
    ids = delivered()
    print(f"scheduled {n}: events "
          f"{[(round(e.at, 1), e.before, e.after, e.by) for e in run.loop.events]}; "
          f"first due {state['first_due']:.1f}, complete {state['complete']:.1f}; "
          f"rungs {LADDER.thresholds}")
    assert all(code == 0 for _, code in run.exit_codes), run.exit_codes
    assert len(ids) == n and len(set(ids)) == n

    def waiting_problems(trace: Sequence[tuple[float, int]]) -> list[str]:
        out = [f"{r} replicas at {t:.1f} s while the scheduled records waited"
               for t, r in trace if 0 < t < state["first_due"] and r > 1]
        out += [f"0 replicas at {t:.1f} s before every record was delivered"
                for t, r in trace if 0 < t < state["complete"] and r == 0]
        return out

    assert waiting_problems(run.trace) == [], explain(run)
    # stricter than the replica count (which needs a reading above 110 at an HPA sync): no
    # drainable record at all while every record waited, read from Prometheus at each poll
    # and sync (1 s of slack for the wall clock the due time was taken from)
    waiting = [(t, f.value) for t, figs in run.loop.readings for f in figs
               if f.name.startswith("drain-") and 0 < t < state["first_due"] - 1.0]
    assert len(waiting) >= 3, run.loop.readings
    assert [w for w in waiting if w[1] > 0] == [], explain(run)
    assert run.loop.replicas == 0
    problems = waiting_problems(replay(run.shadows["before #47"].loop))
    print(f"canary (before #47): {problems[:3]} ({len(problems)} in all)")
    assert problems


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-x", "-s"]))
