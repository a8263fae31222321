"""A pool of three worker processes sharing one rate limit through its store (issue #33, 3).

Three processes of ``tests/apps/pace_worker.py`` consume one topic as one group with
``RateLimit(per_second=50, burst=50)`` shared through PostgreSQL; the records are produced
once all three hold partitions, so the pool could run far faster. Judged from the append-only
ledger (each handler's start time, taken at its first line): in every window of ``T >= 5`` s
at most ``burst + rate * T`` starts (an upper bound only), and every record delivered. The
canary is the same pool with ``scope="replica"`` (each process its own bucket, no shared
store): the same check finds a window over the bound.

CI runs 600 records (12 s at the limit); ``KWORKERS_FULL=1`` runs 6,000 (two minutes).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from kworkers.testing.broker import Broker
from kworkers.testing.ledger import Ledger
from kworkers.testing.processes import WorkerProcess
from kworkers.testing.windows import Windows, judge
from kworkers.testing.workload import full_size, make_topic, produce_numbered, unique
from tests.faults.support import store_url
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RATE, BURST, WINDOW = 50.0, 50, 5.0


def _members_with_partitions(bootstrap: str, group: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    try:
        desc = admin.describe_consumer_groups([group])[group].result(10)
    except (KafkaException, TimeoutError):  # the group is not there yet (NOT_COORDINATOR)
        return 0
    return sum(1 for m in desc.members if m.assignment.topic_partitions)


def _pool(bootstrap: str, tmp: Path, scope: str, n: int) -> tuple[Windows, int, int]:
    """Runs three processes over ``n`` fresh records: (the verdict, distinct records
    delivered, deliveries)."""
    topic = make_topic(bootstrap, unique("pace"), partitions=6)
    group = unique("pace-g")
    ledger_path = tmp / f"ledger-{scope}.db"
    ledger = Ledger(ledger_path)
    store = store_url("postgres", tmp)
    procs = [WorkerProcess(["-m", "tests.apps.pace_worker", bootstrap, topic, group,
                            "--ledger", str(ledger_path), "--rate", str(RATE),
                            "--burst", str(BURST), "--scope", scope, "--store", store,
                            "--name", group], tmp, f"{scope}-{i}", cwd=str(ROOT)).start()
             for i in range(3)]
    try:
        wait_for(lambda: _members_with_partitions(bootstrap, group) == 3, 90,
                 "three members holding partitions")
        produce_numbered(bootstrap, topic, n)
        wait_for(lambda: len({(d.partition, d.offset) for d in ledger.deliveries()}) >= n,
                 60 + 3 * n / RATE, f"{n} records delivered")
        assert all(p.alive for p in procs), [p.log()[-2000:] for p in procs if not p.alive]
    finally:
        for p in procs:
            if p.alive:
                p.terminate(60)
    deliveries = ledger.deliveries()
    verdict = judge([d.at for d in deliveries], RATE, BURST, WINDOW)
    print(f"{scope}: {len(deliveries)} starts by {len({d.pid for d in deliveries})} processes, "
          f"busiest {WINDOW:g} s window {verdict.busiest} (bound {BURST + RATE * WINDOW:g}), "
          f"worst excess {verdict.excess:+.1f} over {verdict.worst}", file=sys.stderr)
    return verdict, len({(d.partition, d.offset) for d in deliveries}), len(deliveries)


def test_three_processes_sharing_a_limit_stay_within_burst_plus_rate_times_t(
        kafka_broker: Broker, tmp_path: Path) -> None:
    n = full_size(6000, 600)
    t0 = time.monotonic()
    verdict, distinct, starts = _pool(kafka_broker.bootstrap_servers, tmp_path, "pool", n)
    assert distinct == n  # no loss (a rebalance may deliver a record twice: both count)
    assert verdict.starts == starts >= n
    assert verdict.excess <= 0, verdict
    # the limit was reached, not merely kept: the pool ran at its rate, not far below it
    assert verdict.busiest >= 0.6 * RATE * WINDOW, verdict
    assert time.monotonic() - t0 >= n / RATE * 0.9


def test_canary_three_processes_each_with_its_own_bucket_exceed_the_pool_bound(
        kafka_broker: Broker, tmp_path: Path) -> None:
    verdict, distinct, _starts = _pool(kafka_broker.bootstrap_servers, tmp_path, "replica",
                                       600)
    assert distinct == 600
    assert verdict.excess > 0, verdict
