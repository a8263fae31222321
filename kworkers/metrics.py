"""Every metric kworkers exports, defined in one place.

Names follow Prometheus conventions (``_total`` counters, ``_seconds`` histograms). The
``MetricName`` literal makes a misspelt name a type error. A ``Metrics`` object owns its
registry, so tests and several workers in one process never collide; ``serve()`` exposes it at
``/metrics`` with ``/healthz`` and ``/readyz`` beside it.

Hot-path cost matters: the loop updates counters once per dispatched batch, not per record.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
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
    "kworkers_schedule_lateness_seconds",
    "kworkers_scheduled_records_total",
    "kworkers_in_flight_records",
    "kworkers_in_flight_bytes",
    "kworkers_in_flight_bytes_bound",
    "kworkers_paused_partitions",
    "kworkers_partition_stalled",
    "kworkers_consumer_lag",
    "kworkers_consumer_time_lag_seconds",
    "kworkers_drainable_lag",
    "kworkers_drainable_time_lag_seconds",
    "kworkers_tier_waiting_records",
    "kworkers_tier_due_records",
    "kworkers_rebalances_total",
    "kworkers_commits_total",
    "kworkers_commit_failures_total",
    "kworkers_commit_uncertain_total",
    "kworkers_commits_deferred_total",
    "kworkers_commit_duration_seconds",
    "kworkers_commit_timeouts_total",
    "kworkers_member_fenced",
    "kworkers_transactions_total",
    "kworkers_transaction_duration_seconds",
    "kworkers_transaction_outputs_total",
    "kworkers_output_topic_missing",
    "kworkers_outbox_relayed_total",
    "kworkers_outbox_relay_failures_total",
    "kworkers_outbox_pending",
    "kworkers_handoff_failures_total",
    "kworkers_handoff_blocked",
    "kworkers_fenced_results_total",
    "kworkers_redriven_total",
    "kworkers_worker_ready",
    "kworkers_worker_processes_ready",
    "kworkers_group_processes_ready",
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
    "kworkers_payload_decode_failures_total",
    "kworkers_payload_waiting_partitions",
    "kworkers_rate_limit_wait_seconds",
    "kworkers_rate_limit_waiting",
    "kworkers_rate_limit_tokens_total",
    "kworkers_rate_limit_store_errors_total",
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
            "Handler time per record, every call counted (successes and failures; a batch "
            "handler's records each count), averaged over each report of a runner",
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
        self.schedule_lateness = Histogram(
            "kworkers_schedule_lateness_seconds",
            "How late a scheduled record was written to its destination versus its due time",
            ["destination"], buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r)
        self.scheduled_records = Counter(
            "kworkers_scheduled_records", "Scheduled records the scheduler handled, by outcome "
            "(delivered, moved to a closer rung, duplicate or cancelled: dropped)",
            ["destination", "outcome"], registry=r)
        self.in_flight = Gauge(
            "kworkers_in_flight_records", "Records fetched and not yet completed", ["group"],
            registry=r)
        self.in_flight_bytes = Gauge(
            "kworkers_in_flight_bytes", "What the records fetched and not yet completed cost, "
            "per loop, as max_in_flight_bytes bounds it: keys, values, headers and a fixed cost "
            "per record (kworkers.memory)", ["group"], registry=r)
        self.in_flight_bytes_bound = Gauge(
            "kworkers_in_flight_bytes_bound", "The loop's max_in_flight_bytes: what "
            "kworkers_in_flight_bytes stays under (one poll past it at most)", ["group"],
            registry=r)
        self.paused = Gauge(
            "kworkers_paused_partitions", "Partitions paused, by reason: backpressure (each "
            "holds its share of max_in_flight; held without a pause in the client counted "
            "too), breaker (open), draining (a graceful stop), fenced",
            ["group", "reason"], registry=r)
        self.partition_stalled = Gauge(
            "kworkers_partition_stalled", "1 while an assigned partition with lag makes no "
            "progress with nothing running or holding it (/readyz answers 503 meanwhile)",
            ["group", "topic", "partition"], registry=r, multiprocess_mode="livemax")
        self.lag = Gauge(
            "kworkers_consumer_lag", "Log end minus the group's position (the worker's own, "
            "else the committed offset read at assignment), as `kworkers lag` counts it; "
            "absent until known, removed when the partition is revoked",
            ["group", "topic", "partition"], registry=r, multiprocess_mode="livemax")
        # The figures built on the lag (kworkers.consumer.lag_view; docs/AUTOSCALING.md).
        # livemax: under --processes a partition's owner shows its value, the others 0.
        self.time_lag = Gauge(
            "kworkers_consumer_time_lag_seconds", "How long the partition's oldest record not "
            "yet completed has waited: now minus its timestamp (a retry tier or schedule rung: "
            "minus its kw-due-at, 0 while not due); 0 with nothing outstanding; absent until "
            "known, removed when the partition is revoked",
            ["group", "topic", "partition"], registry=r, multiprocess_mode="livemax")
        self.drainable = Gauge(
            "kworkers_drainable_lag", "Records outstanding that more replicas could drain: 0 "
            "for a partition held on purpose (breaker open, registry down, fenced, a pool-wide "
            "rate limit, a lease, draining); a tier partition counts its due records only",
            ["group", "topic", "partition"], registry=r, multiprocess_mode="livemax")
        self.drainable_time_lag = Gauge(
            "kworkers_drainable_time_lag_seconds", "kworkers_consumer_time_lag_seconds of a "
            "partition with drainable records, else 0 (what the time-lag trigger scales on)",
            ["group", "topic", "partition"], registry=r, multiprocess_mode="livemax")
        # A retry tier partition's records fetched and not completed, split as the tier gate
        # holds them: waiting for their due time (held on purpose, never drainable) or due
        # (running or about to). Tier loops only; per partition, as the lag is.
        self.tier_waiting = Gauge(
            "kworkers_tier_waiting_records", "Records of a retry tier partition fetched and "
            "waiting in the tier's timer heap for their due time (not lag more replicas could "
            "drain)", ["group", "topic", "partition"], registry=r, multiprocess_mode="livemax")
        self.tier_due = Gauge(
            "kworkers_tier_due_records", "Records of a retry tier partition fetched, due and "
            "not yet completed (running, or queued for a runner)",
            ["group", "topic", "partition"], registry=r, multiprocess_mode="livemax")
        self.decode_failures = Counter(
            "kworkers_payload_decode_failures", "Keys and values the deserializers could not "
            "decode, by field and kind: permanent (dead-lettered: bad bytes, unknown schema id) "
            "or transient (a failed try while the registry does not answer; the record waits)",
            ["group", "field", "kind"], registry=r)
        self.decode_waiting = Gauge(
            "kworkers_payload_waiting_partitions", "Partitions whose next record waits for the "
            "schema registry (held on purpose, not stalled)", ["group"], registry=r,
            multiprocess_mode="livesum")
        self.rate_wait = Histogram(
            "kworkers_rate_limit_wait_seconds", "How long a runner waited for rate-limit "
            "tokens before its next record could start (one observation per wait)",
            ["group"], buckets=LATENCY_BUCKETS, registry=r)
        self.rate_waiting = Gauge(
            "kworkers_rate_limit_waiting", "Runners waiting for a rate-limit token now (above "
            "0: the pool is at its limit, and more replicas would only wait too)", ["group"],
            registry=r, multiprocess_mode="livesum")
        self.rate_tokens = Counter(
            "kworkers_rate_limit_tokens", "Rate-limit tokens this replica took from its bucket "
            "(in blocks; unspent ones expire)", ["group"], registry=r)
        self.rate_store_errors = Counter(
            "kworkers_rate_limit_store_errors", "Asks of the shared rate-limit bucket that "
            "failed (no record starts until the store answers)", ["group"], registry=r)
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
        self.commit_duration = Histogram(
            "kworkers_commit_duration_seconds", "One commit from its first attempt sent to its "
            "outcome (committed, deferred, failed or uncertain: the counters say which), "
            "retries and their backoff included", ["group"], registry=r,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.commit_timeouts = Counter(
            "kworkers_commit_timeouts", "Commit attempts the broker did not answer within "
            "commit.timeout_s (each counted as a retryable timeout and sent again)", ["group"],
            registry=r)
        self.member_fenced = Gauge(
            "kworkers_member_fenced", "1 while the member fenced itself: its coordinator was "
            "silent for the session timeout less the margin (no record starts, nothing is "
            "committed; /readyz 503)", ["group"], registry=r, multiprocess_mode="livemax")
        self.transactions = Counter(
            "kworkers_transactions", "Exactly-once transactions by outcome: committed, aborted "
            "(nothing visible; their outputs go into the next one), uncertain (the producer "
            "failed mid-commit: resolved by taking its transactional id over and reading the "
            "committed offsets), fenced (refused because this member or producer is no longer "
            "the owner; counted beside aborted or failed)", ["group", "outcome"], registry=r)
        self.transaction_duration = Histogram(
            "kworkers_transaction_duration_seconds", "One exactly-once transaction, from begin "
            "to its commit or abort", ["group"], registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.transaction_outputs = Counter(
            "kworkers_transaction_outputs", "Records (outputs and hand-offs) committed in "
            "exactly-once transactions", ["group"], registry=r)
        self.output_topic_missing = Gauge(
            "kworkers_output_topic_missing", "1 while an exactly-once loop's outputs to this "
            "topic wait because it does not exist (nothing is committed past their records; "
            "/readyz 503, /healthz 503 past three stall bounds)", ["group", "topic"],
            registry=r, multiprocess_mode="livemax")
        self.outbox_relayed = Counter(
            "kworkers_outbox_relayed", "Outbox rows the broker acknowledged and the relay "
            "deleted (at least once: a relay killed between the two sends a row again)",
            ["table"], registry=r)
        self.outbox_failures = Counter(
            "kworkers_outbox_relay_failures", "Outbox relay passes that failed (the store or the "
            "broker unreachable; retried with a backoff up to 5 s)", ["table"], registry=r)
        self.outbox_pending = Gauge(
            "kworkers_outbox_pending", "Outbox rows not sent yet (counted up to 10,000 every "
            "5 s by the relay): its lag", ["table"], registry=r, multiprocess_mode="livemax")
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
        # Served for a `kworkers run --processes N` pool too, aggregated over its processes:
        # the two flags by their lowest value (the pool is ready / healthy only when every
        # process is), the count by its sum, so no flag reads 2.
        self.worker_ready = Gauge(
            "kworkers_worker_ready", "1 while the worker is ready (its loops polled, nothing "
            "degraded); for a --processes pool, 1 only while every process is", [],
            registry=r, multiprocess_mode="livemin")
        self.worker_processes_ready = Gauge(
            "kworkers_worker_processes_ready", "Worker processes that are ready (1 or 0 for "
            "one process; for a --processes pool, how many of its processes are)", [],
            registry=r, multiprocess_mode="livesum")
        # kworkers_worker_ready has no group label (a process may serve several loops), so a
        # group's ready replicas are counted here: sum by (group) over the scraped targets.
        self.group_processes_ready = Gauge(
            "kworkers_group_processes_ready", "Worker processes of this group (the worker's "
            "--group) that are ready: 1 or 0 for one process, the ready count for a "
            "--processes pool; sum by (group) is the group's ready members", ["group"],
            registry=r, multiprocess_mode="livesum")
        self.worker_healthy = Gauge(
            "kworkers_worker_healthy", "0 once a part of the worker failed (it then stops; "
            "see /healthz for why); for a --processes pool, 0 once any process did", [],
            registry=r, multiprocess_mode="livemin")
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


def observe_many(child: Histogram, value: float, n: int) -> None:
    """``n`` observations of ``value`` at the cost of one: a runner reports many calls at
    once, and the hot path cannot pay a histogram update per record. prometheus-client's
    histogram has no weighted observe; this adds ``n`` to the one bucket ``observe`` would
    (its ``_sum``, ``_upper_bounds`` and ``_buckets``, stable across its releases), and falls
    back to ``n`` observations where they are not there."""
    if n <= 0:
        return
    bounds = getattr(child, "_upper_bounds", None)
    buckets = getattr(child, "_buckets", None)
    total = getattr(child, "_sum", None)
    if bounds is None or buckets is None or total is None:
        for _ in range(n):
            child.observe(value)
        return
    total.inc(value * n)
    for i, bound in enumerate(bounds):
        if value <= bound:
            buckets[i].inc(n)
            break


def observe_all(child: Histogram, observed: list[tuple[float, int]]) -> None:
    """``observe_many`` for each ``(value, n)``, with one update per bucket they fall in and
    one of the sum: the poll loop applies hundreds of runners' reports at once (at thousands
    of async handlers in flight, one per record), and each update takes the metric's lock
    (issue #50). The same bucket as ``observe`` (the first bound at or above the value)."""
    bounds = getattr(child, "_upper_bounds", None)
    buckets = getattr(child, "_buckets", None)
    total = getattr(child, "_sum", None)
    if bounds is None or buckets is None or total is None:
        for value, n in observed:
            observe_many(child, value, n)
        return
    counts: dict[int, int] = {}
    seconds = 0.0
    for value, n in observed:
        if n > 0:
            seconds += value * n
            i = bisect_left(bounds, value)
            counts[i] = counts.get(i, 0) + n
    if counts:
        total.inc(seconds)
        for i, n in counts.items():
            buckets[i].inc(n)


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
        """How many of the pool's processes are ready (``kworkers_worker_processes_ready``)."""
        total = 0.0
        for metric in self.registry.collect():
            if metric.name == "kworkers_worker_processes_ready":
                total += sum(s.value for s in metric.samples)
        return int(total)


def mark_process_dead(pid: int, directory: str) -> None:
    """A pool's child exited: its live gauges no longer count (prometheus-client keeps the
    counters of dead processes, as it should)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]


class MetricsServer:
    """``/metrics``, ``/healthz`` (the worker works: 503 with the reason once a part of it
    failed) and ``/readyz`` (the worker is consuming)."""

    def __init__(self, metrics: Exposes, port: int, host: str = "0.0.0.0",
                 ready: Callable[[], bool] = lambda: True,
                 fault: Callable[[], object | None] = lambda: None,
                 unready: Callable[[], object | None] | None = None) -> None:
        expo = metrics.exposition

        def why_unready() -> object | None:
            """``unready`` says why (None: ready); else ``ready`` says only whether."""
            if unready is not None:
                return unready()
            return None if ready() else "not ready"

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
                    why_not = why_unready()
                    body = (b"ready\n" if why_not is None else
                            (b"not ready\n" if why_not == "not ready" else
                             f"not ready: {why_not}\n".encode()))
                    ctype, code = "text/plain", 200 if why_not is None else 503
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
