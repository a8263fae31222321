"""Every metric kworkers exports, defined in one place.

Names follow Prometheus conventions (``_total`` counters, ``_seconds`` histograms). The
``MetricName`` literal makes a misspelt name a type error. A ``Metrics`` object owns its
registry, so tests and several workers in one process never collide; ``serve()`` exposes it at
``/metrics`` with ``/healthz`` and ``/readyz`` beside it.

Hot-path cost matters: the loop updates counters once per dispatched batch, not per record.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal, Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

MetricName = Literal[
    "kworkers_records_total",
    "kworkers_handler_duration_seconds",
    "kworkers_retries_total",
    "kworkers_dead_letters_total",
    "kworkers_retry_lateness_seconds",
    "kworkers_in_flight_records",
    "kworkers_paused_partitions",
    "kworkers_consumer_lag",
    "kworkers_rebalances_total",
    "kworkers_commits_total",
    "kworkers_commit_failures_total",
    "kworkers_commit_uncertain_total",
    "kworkers_commits_deferred_total",
    "kworkers_handoff_failures_total",
    "kworkers_handoff_blocked",
    "kworkers_fenced_results_total",
    "kworkers_redriven_total",
    "kworkers_worker_ready",
    "kworkers_worker_healthy",
    "kworkers_breaker_state",
    "kworkers_breaker_transitions_total",
    "kworkers_workflow_steps_total",
    "kworkers_workflow_step_duration_seconds",
    "kworkers_workflow_runs_total",
    "kworkers_share_acknowledgements_total",
    "kworkers_share_ack_failures_total",
    "kworkers_share_redeliveries_total",
    "kworkers_share_backlog",
]

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.records = Counter(
            "kworkers_records", "Records handled, by outcome (ok, retried, dead_lettered, "
            "skipped)", ["group", "outcome"], registry=r)
        self.handler_duration = Histogram(
            "kworkers_handler_duration_seconds",
            "Handler time per record, averaged over each dispatched batch",
            ["group"], buckets=LATENCY_BUCKETS, registry=r)
        self.retries = Counter(
            "kworkers_retries", "Failed attempts handed to a retry tier", ["group", "tier"],
            registry=r)
        self.dead_letters = Counter(
            "kworkers_dead_letters", "Records handed to the DLQ", ["group", "error_type"],
            registry=r)
        self.retry_lateness = Histogram(
            "kworkers_retry_lateness_seconds", "How late a retry ran versus its due time",
            ["group"], buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30),
            registry=r)
        self.in_flight = Gauge(
            "kworkers_in_flight_records", "Records fetched and not yet completed", ["group"],
            registry=r)
        self.paused = Gauge(
            "kworkers_paused_partitions", "Partitions paused by backpressure", ["group"],
            registry=r)
        self.lag = Gauge(
            "kworkers_consumer_lag", "High watermark minus committed position",
            ["group", "topic", "partition"], registry=r)
        self.rebalances = Counter(
            "kworkers_rebalances", "Rebalance callbacks, by kind (assign, revoke, lost)",
            ["group", "kind"], registry=r)
        self.commits = Counter(
            "kworkers_commits", "Successful offset commits", ["group"], registry=r)
        self.commit_failures = Counter(
            "kworkers_commit_failures", "Commits confirmed failed", ["group"], registry=r)
        self.commit_uncertain = Counter(
            "kworkers_commit_uncertain",
            "Commits whose outcome is unknown (permanent error after a retryable one)",
            ["group"], registry=r)
        self.commit_deferred = Counter(
            "kworkers_commits_deferred", "Commits refused while the group rebalanced (the next "
            "commit carries their positions)", ["group"], registry=r)
        self.handoff_failures = Counter(
            "kworkers_handoff_failures", "Retry/DLQ produce attempts not acknowledged",
            ["group", "destination"], registry=r)
        self.handoff_blocked = Gauge(
            "kworkers_handoff_blocked",
            "Records whose hand-off to a tier or the DLQ keeps failing (alert on > 0)",
            ["group"], registry=r)
        self.fenced = Counter(
            "kworkers_fenced_results", "Results dropped for partitions no longer owned",
            ["group"], registry=r)
        self.worker_ready = Gauge(
            "kworkers_worker_ready", "1 once the worker's loops have polled (readiness)", [],
            registry=r, multiprocess_mode="livesum")
        self.worker_healthy = Gauge(
            "kworkers_worker_healthy", "0 once a part of the worker failed (it then stops; "
            "see /healthz for why)", [], registry=r, multiprocess_mode="livemin")
        self.breaker_state = Gauge(
            "kworkers_breaker_state", "Circuit breaker: 0 closed, 1 half-open, 2 open",
            ["group"], registry=r, multiprocess_mode="livemax")
        self.breaker_transitions = Counter(
            "kworkers_breaker_transitions", "Circuit breaker state changes, by new state",
            ["group", "to"], registry=r)
        self.share_acks = Counter(
            "kworkers_share_acknowledgements", "Share-group acknowledgements sent, by type "
            "(accept, release, reject)", ["group", "type"], registry=r)
        self.share_ack_failures = Counter(
            "kworkers_share_ack_failures", "Share-group acknowledgements the broker refused "
            "(the record is delivered again)", ["group"], registry=r)
        self.share_redeliveries = Counter(
            "kworkers_share_redeliveries", "Share-group records acquired with a delivery count "
            "above 1", ["group"], registry=r)
        self.share_backlog = Gauge(
            "kworkers_share_backlog", "Share group: log end minus one past the highest offset "
            "this worker acquired; per partition take the min over replicas, then sum",
            ["group", "topic", "partition"], registry=r, multiprocess_mode="livemin")
        self.redriven = Counter(
            "kworkers_redriven", "Dead letters replayed to their topic", ["dlq_topic"],
            registry=r)
        self.workflow_steps = Counter(
            "kworkers_workflow_steps", "Workflow activity attempts (steps and compensations) by "
            "outcome: completed, retrying, failed (for good), skipped (stale or duplicate)",
            ["workflow", "step", "outcome"], registry=r)
        self.workflow_step_duration = Histogram(
            "kworkers_workflow_step_duration_seconds",
            "Time in a workflow step or compensation function, per attempt",
            ["workflow", "step"], buckets=LATENCY_BUCKETS, registry=r)
        self.workflow_runs = Counter(
            "kworkers_workflow_runs", "Workflow runs entering a status (running: started)",
            ["workflow", "status"], registry=r)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class Exposes(Protocol):
    def exposition(self) -> bytes: ...


class MultiProcessMetrics:
    """What ``kworkers run --processes N`` serves on one port: every child's metrics, summed
    by prometheus-client's multiprocess mode (children write to ``PROMETHEUS_MULTIPROC_DIR``)."""

    def __init__(self, directory: str) -> None:
        from prometheus_client import multiprocess

        self.registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(self.registry, path=directory)  # type: ignore[no-untyped-call]

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def ready_workers(self) -> int:
        total = 0.0
        for metric in self.registry.collect():
            if metric.name == "kworkers_worker_ready":
                total += sum(s.value for s in metric.samples)
        return int(total)


class MetricsServer:
    """``/metrics``, ``/healthz`` (the worker works: 503 with the reason once a part of it
    failed) and ``/readyz`` (the worker is consuming)."""

    def __init__(self, metrics: Exposes, port: int, host: str = "0.0.0.0",
                 ready: Callable[[], bool] = lambda: True,
                 fault: Callable[[], object | None] = lambda: None) -> None:
        expo = metrics.exposition

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                if path == "/metrics":
                    body, ctype, code = expo(), CONTENT_TYPE_LATEST, 200
                elif path == "/healthz":
                    why = fault()
                    body = b"ok\n" if why is None else f"unhealthy: {why}\n".encode()
                    ctype, code = "text/plain", 200 if why is None else 503
                elif path == "/readyz":
                    ok = ready()
                    body = b"ready\n" if ok else b"not ready\n"
                    ctype, code = "text/plain", 200 if ok else 503
                else:
                    body, ctype, code = b"not found\n", "text/plain", 404
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return None

        self._server = ThreadingHTTPServer((host, port), Handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="kworkers-metrics")

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
