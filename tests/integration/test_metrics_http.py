"""/metrics, /healthz and /readyz over HTTP while a worker handles a known mix of records.

50 records on a real broker: 46 succeed at once, #10 and #20 fail once (a retry tier, then
success), #30 raises NonRetryableError (the DLQ at once), #40 always fails (a tier, then the DLQ
when its attempts run out). Every number scraped must match that story exactly.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kworkers import Message, NonRetryableError, RetryPolicy, TierLadder, Worker
from kworkers.metrics import MetricsServer
from kworkers.testing import Broker
from kworkers.testing.workload import make_topic, produce_numbered, read_all, unique
from tests.integration.conftest import running, wait_for

pytestmark = pytest.mark.integration

N = 50
TRANSIENT, NON_RETRYABLE, ALWAYS = {10, 20}, 30, 40
Sample = tuple[str, frozenset[tuple[str, str]]]


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def scrape(port: int) -> dict[Sample, float]:
    status, text = get(port, "/metrics")
    assert status == 200
    out: dict[Sample, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: dict[Sample, float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_over_http_match_what_happened(kafka_broker: Broker) -> None:
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("metrics"), 2), unique("g")
    w = Worker(topics=[topic], group_id=group, bootstrap_servers=bs,
               retry=RetryPolicy(initial=0.2, max_interval=0.2, max_attempts=2),
               tiers=TierLadder((0.25, 1.0)), jitter_seed=3)
    w.create_topics()
    retry_group = w.config.retry_group_id
    lock = threading.Lock()
    calls: Counter[int] = Counter()

    @w.handler
    def handle(msg: Message) -> None:
        i = int(msg.value or b"-1")
        with lock:
            calls[i] += 1
            n = calls[i]
        if i == NON_RETRYABLE:
            raise NonRetryableError("Malformed", "no field x")
        if i == ALWAYS:
            raise RuntimeError("always")
        if i in TRANSIENT and n == 1:
            raise ConnectionError("transient")

    server = MetricsServer(w.metrics, 0, "127.0.0.1", ready=lambda: w.ready).start()
    port = server.port
    try:
        assert get(port, "/healthz") == (200, "ok\n")
        assert get(port, "/readyz") == (503, "not ready\n")  # not consuming yet
        assert get(port, "/nope")[0] == 404

        produce_numbered(bs, topic, N)
        main_ok = N - len(TRANSIENT) - 2

        def settled() -> bool:
            m = scrape(port)
            return (value(m, "kworkers_records_total", group=group, outcome="ok") == main_ok
                    and value(m, "kworkers_records_total", group=retry_group,
                              outcome="ok") == len(TRANSIENT)
                    and value(m, "kworkers_records_total", group=retry_group,
                              outcome="dead_lettered") == 1
                    and value(m, "kworkers_in_flight_records", group=group) == 0
                    and value(m, "kworkers_in_flight_records", group=retry_group) == 0)

        with running(w):
            assert get(port, "/readyz") == (200, "ready\n")
            wait_for(settled, 90, "every record handled, as the metrics tell it")
            m = scrape(port)
            dlq = w.config.tiers.dlq_topic(topic)
            wait_for(lambda: len(read_all(bs, dlq, 5)) >= 2, 60, "2 dead letters")

        # records by outcome, per group
        assert value(m, "kworkers_records_total", group=group, outcome="ok") == main_ok
        assert value(m, "kworkers_records_total", group=group, outcome="retried") == 3
        assert value(m, "kworkers_records_total", group=group, outcome="dead_lettered") == 1
        assert value(m, "kworkers_records_total", group=retry_group, outcome="ok") == 2
        assert value(m, "kworkers_records_total", group=retry_group, outcome="retried") == 0
        # retries by tier: three first attempts failed with a 0..0.2 s backoff -> tier 250ms
        assert value(m, "kworkers_retries_total", group=group, tier="250ms") == 3
        assert sum(v for (name, _), v in m.items() if name == "kworkers_retries_total") == 3
        # dead letters by error type: one at once from the main loop, one out of attempts
        assert value(m, "kworkers_dead_letters_total", group=group, error_type="Malformed") == 1
        assert value(m, "kworkers_dead_letters_total", group=retry_group,
                     error_type="RuntimeError") == 1
        assert sum(v for (name, _), v in m.items() if name == "kworkers_dead_letters_total") == 2
        # each retry ran no earlier than due: lateness observed once per retry run
        assert value(m, "kworkers_retry_lateness_seconds_count", group=retry_group) == 3
        # handler time is observed per dispatched batch of successes
        assert value(m, "kworkers_handler_duration_seconds_count", group=group) >= 1
        assert value(m, "kworkers_rebalances_total", group=group, kind="assign") >= 1
        assert value(m, "kworkers_handoff_blocked", group=group) == 0
        for reason in ("backpressure", "breaker", "draining"):  # exported, and none paused
            labels = frozenset({"group": group, "reason": reason}.items())
            assert m[("kworkers_paused_partitions", labels)] == 0, reason
        assert not any(v for (name, _), v in m.items() if name == "kworkers_partition_stalled")
        assert calls[ALWAYS] == 2 and calls[NON_RETRYABLE] == 1
        assert all(calls[i] == 2 for i in TRANSIENT)

        # after a clean stop: commits happened in both groups, nothing uncertain or failed
        end = scrape(port)
        for g in (group, retry_group):
            assert value(end, "kworkers_commits_total", group=g) > 0, g
            assert value(end, "kworkers_commit_uncertain_total", group=g) == 0
            assert value(end, "kworkers_commit_failures_total", group=g) == 0
            assert value(end, "kworkers_in_flight_records", group=g) == 0
            assert value(end, "kworkers_fenced_results_total", group=g) == 0
        assert value(end, "kworkers_rebalances_total", group=group, kind="revoke") >= 1
        assert get(port, "/healthz") == (200, "ok\n")
    finally:
        server.close()


def test_consumer_lag_gauge_is_exported(kafka_broker: Broker) -> None:
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("lag"), 1), unique("g")
    w = Worker(topics=[topic], group_id=group, bootstrap_servers=bs)
    w.create_topics()
    w.handler(lambda msg: None)
    produce_numbered(bs, topic, 5)
    server = MetricsServer(w.metrics, 0, "127.0.0.1").start()
    try:
        with running(w):
            wait_for(lambda: value(scrape(server.port), "kworkers_records_total", group=group,
                                   outcome="ok") == 5, 60, "5 records")
            lag_key = ("kworkers_consumer_lag", frozenset({("group", group), ("topic", topic),
                                                           ("partition", "0")}))
            # refreshed every few seconds; once everything is committed the lag is 0
            wait_for(lambda: scrape(server.port).get(lag_key) == 0, 60, "lag gauge at 0")
    finally:
        server.close()
