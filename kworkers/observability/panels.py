"""The dashboard's panels as data: titles, units and PromQL, no Grafana library.

Why pure: the same queries are rendered into Grafana's JSON (``dashboard.py``, which needs the
``dashboards`` extra), evaluated against a real Prometheus by the tests, and drawn by
``scripts/dashboard_picture.py``; none of those should need the others' libraries.

Every query filters on the two dashboard variables (``$namespace``, ``$group``: regexes, ``.*``
for all) and aggregates the ``pid`` label of a ``--processes`` pool away (every query is an
aggregation ``by`` the labels it shows). A series without a ``namespace`` label (a scrape
outside Kubernetes) still matches ``.*``.

Series from outside kworkers (``source="kube-state-metrics"``): the HPA KEDA made for the
pool, ``keda-hpa-<app>``, joined to the workers' ``app`` target label.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from kworkers.promql import new_in

Source = Literal["kworkers", "kube-state-metrics"]
Kind = Literal["timeseries", "state"]

#: the label filter every kworkers query carries (Grafana fills in the variables)
SEL = 'namespace=~"$namespace", group=~"$group"'
#: the HPA series of the selected namespace
HPA_SEL = 'namespace=~"$namespace", horizontalpodautoscaler=~"keda-hpa-.*"'
RATE = "$__rate_interval"
#: the series of other exporters the dashboard and the alerts read (kube-state-metrics' HPA
#: series; a test allows exactly these beside what kworkers.metrics registers)
EXTERNAL_METRICS = frozenset({"kube_horizontalpodautoscaler_status_current_replicas",
                              "kube_horizontalpodautoscaler_spec_max_replicas"})
#: labels a scrape adds to every series (Prometheus' own, the Kubernetes service discovery's
#: and the compose job's), which queries may use beside a metric's own labels
TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "app", "pid",
                           "horizontalpodautoscaler", "le"})


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str
    source: Source = "kworkers"


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    kind: Kind = "timeseries"


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


def _by_partition(metric: str) -> str:
    return f"max by (group, topic, partition) ({metric}{{{SEL}}})"


def _p99(metric: str, by: str = "group") -> str:
    return (f"histogram_quantile(0.99, sum by ({by}, le) "
            f"(rate({metric}_bucket{{{SEL}}}[{RATE}])))")


PART = "{{group}} {{topic}}[{{partition}}]"

ROWS: tuple[Row, ...] = (
    Row("Lag", (
        Panel("Lag (records)", "Log end minus the group's position, per partition "
              "(kworkers_consumer_lag).", "short",
              (Query(_by_partition("kworkers_consumer_lag"), PART),)),
        Panel("Time lag (seconds)", "How long each partition's oldest record not completed "
              "has waited (a tier partition: how late its due records are).", "s",
              (Query(_by_partition("kworkers_consumer_time_lag_seconds"), PART),)),
        Panel("Drainable lag and replicas", "Records more replicas could drain (held lag left "
              "out: what the autoscaler grows on), the group's ready processes, and the "
              "HPA KEDA made: its replicas against its maximum.", "short",
              (Query(f"sum by (group) ({_by_partition('kworkers_drainable_lag')})",
                     "{{group}} drainable"),
               Query(f"sum by (group) (kworkers_group_processes_ready{{{SEL}}})",
                     "{{group}} ready processes"),
               Query(f"max by (horizontalpodautoscaler) "
                     f"(kube_horizontalpodautoscaler_status_current_replicas{{{HPA_SEL}}})",
                     "{{horizontalpodautoscaler}} replicas", "kube-state-metrics"),
               Query(f"max by (horizontalpodautoscaler) "
                     f"(kube_horizontalpodautoscaler_spec_max_replicas{{{HPA_SEL}}})",
                     "{{horizontalpodautoscaler}} max", "kube-state-metrics"))),
    )),
    Row("Work", (
        Panel("Throughput", "Records handled per second, by outcome.", "ops",
              (Query(f"sum by (group, outcome) (rate(kworkers_records_total{{{SEL}}}[{RATE}]))",
                     "{{group}} {{outcome}}"),)),
        Panel("Handler latency", "Handler time per record, p50 and p99.", "s",
              (Query(_p99("kworkers_handler_duration_seconds").replace("0.99", "0.5", 1),
                     "{{group}} p50"),
               Query(_p99("kworkers_handler_duration_seconds"), "{{group}} p99"))),
        Panel("Failures by error type and destination", "Dead letters by error type, retries "
              "by tier, hand-offs not acknowledged by destination (per second).", "ops",
              (Query(f"sum by (group, error_type) "
                     f"(rate(kworkers_dead_letters_total{{{SEL}}}[{RATE}]))",
                     "{{group}} dlq {{error_type}}"),
               Query(f"sum by (group, tier) (rate(kworkers_retries_total{{{SEL}}}[{RATE}]))",
                     "{{group}} retry {{tier}}"),
               Query(f"sum by (group, destination) "
                     f"(rate(kworkers_handoff_failures_total{{{SEL}}}[{RATE}]))",
                     "{{group}} hand-off failed {{destination}}"))),
        Panel("DLQ growth", "Records dead-lettered in the last hour, by error type.", "short",
              (Query(f"sum by (group, error_type) "
                     f"({new_in(f'kworkers_dead_letters_total{{{SEL}}}', '1h')})",
                     "{{group}} {{error_type}}"),)),
        Panel("Retry tiers: waiting and due", "A tier partition's fetched records waiting for "
              "their due time, and due (running or queued).", "short",
              (Query(_by_partition("kworkers_tier_waiting_records"), PART + " waiting"),
               Query(_by_partition("kworkers_tier_due_records"), PART + " due"))),
    )),
    Row("Health", (
        Panel("Breaker state", "0 closed, 1 half-open, 2 open (the worst replica).", "short",
              (Query(f"max by (group) (kworkers_breaker_state{{{SEL}}})", "{{group}}"),),
              "state"),
        Panel("Stalled partitions", "1 while an assigned partition with lag makes no progress "
              "with nothing running or holding it.", "short",
              (Query(_by_partition("kworkers_partition_stalled"), PART),), "state"),
        Panel("In flight and paused", "Records fetched and not completed; partitions paused, "
              "by reason; records whose hand-off keeps failing.", "short",
              (Query(f"sum by (group) (kworkers_in_flight_records{{{SEL}}})",
                     "{{group}} in flight"),
               Query(f"sum by (group, reason) (kworkers_paused_partitions{{{SEL}}})",
                     "{{group}} paused {{reason}}"),
               Query(f"sum by (group) (kworkers_handoff_blocked{{{SEL}}})",
                     "{{group}} hand-offs blocked"))),
    )),
    Row("Commits and transactions", (
        Panel("Commit latency", "One commit from its first attempt to its outcome, p99.", "s",
              (Query(_p99("kworkers_commit_duration_seconds"), "{{group}} p99"),)),
        Panel("Commit outcomes", "Commits per second: committed, failed, uncertain (a "
              "redelivery may follow), deferred by a rebalance, timed out.", "ops",
              tuple(Query(f"sum by (group) (rate(kworkers_{m}_total{{{SEL}}}[{RATE}]))",
                          f"{{{{group}}}} {label}")
                    for m, label in (("commits", "committed"), ("commit_failures", "failed"),
                                     ("commit_uncertain", "uncertain"),
                                     ("commits_deferred", "deferred"),
                                     ("commit_timeouts", "timed out")))),
        Panel("Transactions", "Exactly-once transactions per second by outcome, and their "
              "p99 duration (exactly-once workers only).", "ops",
              (Query(f"sum by (group, outcome) "
                     f"(rate(kworkers_transactions_total{{{SEL}}}[{RATE}]))",
                     "{{group}} {{outcome}}"),
               Query(_p99("kworkers_transaction_duration_seconds"), "{{group}} p99 (s)"))),
        Panel("Output topics missing", "1 while an exactly-once loop's outputs wait for a "
              "topic that does not exist.", "short",
              (Query(f"max by (group, topic) (kworkers_output_topic_missing{{{SEL}}})",
                     "{{group}} {{topic}}"),), "state"),
    )),
    Row("Waits", (
        Panel("Rate-limit waits", "p99 wait for a rate-limit token, and runners waiting "
              "now.", "s",
              (Query(_p99("kworkers_rate_limit_wait_seconds"), "{{group}} p99 wait"),
               Query(f"sum by (group) (kworkers_rate_limit_waiting{{{SEL}}})",
                     "{{group}} runners waiting"))),
        Panel("Schema registry waits", "Partitions whose next record waits for the registry, "
              "and transient decode failures per second.", "short",
              (Query(f"sum by (group) (kworkers_payload_waiting_partitions{{{SEL}}})",
                     "{{group}} partitions waiting"),
               Query(f"sum by (group) (rate(kworkers_payload_decode_failures_total"
                     f"{{{SEL}, kind=\"transient\"}}[{RATE}]))",
                     "{{group}} transient failures"))),
    )),
)


def queries() -> Iterator[tuple[Panel, Query]]:
    """Every query of the dashboard, with its panel."""
    for row in ROWS:
        for panel in row.panels:
            for q in panel.queries:
                yield panel, q


def concrete(expr: str, namespace: str = ".*", group: str = ".*",
             rate_interval: str = "1m") -> str:
    """``expr`` as Grafana would send it with these variable values (tests, the picture)."""
    return (expr.replace("$namespace", namespace).replace("$group", group)
            .replace("$__rate_interval", rate_interval))
