"""The Prometheus alert rules (``deploy/prometheus/alerts.yml``), as data.

Why in code: the rules file used to be hand-written, checked only for metric names, and never
evaluated. Here each rule is a value with its reason; ``render_rules`` writes the file the repo
commits (a unit test compares them), ``promtool test rules`` runs every rule against series
fixtures (``tests/unit/promtool/alerts_test.yml``: each fires when it must and stays silent
when it must not), and an integration test evaluates each rule's ``signals`` (the expressions
its thresholds compare) against a real Prometheus scraping a real worker, so a renamed metric
or a wrong label fails a test instead of silently disabling an alert.

``render_rules(group)`` scopes every selector to one group and its retry group (the group
checked as every query builder checks it, ``kworkers.promql.quoted``); the committed file is
for all groups.

Series from outside kworkers: "replicas at max" reads kube-state-metrics' HPA series for the
HPA KEDA made, ``keda-hpa-<app>``, joined to the workers' ``app`` target label (the rendered
pods' label; ``deploy/prometheus/prometheus.yml`` sets it for the compose demo).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal

from kworkers.deploy.yamltext import wrap_words
from kworkers.promql import new_in, quoted
from kworkers.topic_names import retry_group

Severity = Literal["page", "ticket"]

#: a partition's time lag above this many seconds, for ``TIME_LAG_FOR``, is an alert
TIME_LAG_BOUND_S = 300
#: a breaker that has not closed once in this window is "open for long"
BREAKER_OPEN_WINDOW = "15m"


@dataclass(frozen=True)
class Rule:
    alert: str
    #: why the rule exists (a comment above it in the file)
    why: str
    expr: str
    severity: Severity
    summary: str
    #: the expressions the thresholds compare: each must return series where the metric is
    #: exported (the integration test evaluates them against a real worker)
    signals: tuple[str, ...]
    for_: str | None = None

    def __post_init__(self) -> None:
        for s in self.signals:
            if s not in self.expr:
                raise ValueError(f"{self.alert}: signal not in its expression: {s}")


@dataclass(frozen=True)
class Scope:
    """The label filter every kworkers selector of the rules carries ('' for all groups)."""

    matcher: str = ""

    def __call__(self, metric: str, *matchers: str) -> str:
        parts = [*matchers, *([self.matcher] if self.matcher else [])]
        return f"{metric}{{{', '.join(parts)}}}" if parts else metric


def scope_of(group: str | None) -> Scope:
    """All groups, or ``group`` and its retry group (checked: ``quoted``)."""
    if group is None:
        return Scope()
    quoted(group)
    alternatives = "|".join(re.escape(g).replace("\\", "\\\\")
                            for g in (group, retry_group(group)))
    return Scope(f'group=~"{alternatives}"')


def rules(group: str | None = None, time_lag_bound_s: float = TIME_LAG_BOUND_S
          ) -> tuple[Rule, ...]:
    """Every rule, for all groups or one (``scope_of``)."""
    s = scope_of(group)
    blocked = f"max by (group) ({s('kworkers_handoff_blocked')})"
    dead = f"sum by (group, error_type) ({new_in(s('kworkers_dead_letters_total'), '15m')})"
    uncertain = f"sum by (group) (increase({s('kworkers_commit_uncertain_total')}[10m]))"
    txn = s("kworkers_transactions_total", 'outcome="aborted"')
    aborted = f"sum by (group) (increase({txn}[10m]))"
    txn = s("kworkers_transactions_total", 'outcome="committed"')
    committed = f"sum by (group) (increase({txn}[10m]))"
    in_flight = f"max by (group) ({s('kworkers_in_flight_records')})"
    done = f"sum by (group) (rate({s('kworkers_records_total')}[5m]))"
    late = (f"histogram_quantile(0.99, sum by (group, le) "
            f"(rate({s('kworkers_retry_lateness_seconds_bucket')}[10m])))")
    stalled = f"max by (namespace, group, topic, partition) ({s('kworkers_partition_stalled')})"
    time_lag = (f"max by (namespace, group, topic, partition) "
                f"({s('kworkers_consumer_time_lag_seconds')})")
    growing = (f"sum by (namespace, app, group) "
               f"(delta({s('kworkers_drainable_lag')}[10m]))")
    at_max = ('label_replace(kube_horizontalpodautoscaler_status_current_replicas '
              '>= kube_horizontalpodautoscaler_spec_max_replicas, '
              '"app", "$1", "horizontalpodautoscaler", "keda-hpa-(.+)")')
    breaker = (f"max by (namespace, group) "
               f"(min_over_time({s('kworkers_breaker_state')}[{BREAKER_OPEN_WINDOW}]))")
    registry = f"max by (namespace, group) ({s('kworkers_payload_waiting_partitions')})"
    output = f"max by (namespace, group, topic) ({s('kworkers_output_topic_missing')})"
    return (
        Rule("KworkersHandoffBlocked",
             "a failed record cannot reach its retry tier or the DLQ: its partition's commits "
             "stop", f"{blocked} > 0", "page",
             "{{ $labels.group }}: hand-offs to a retry tier or the DLQ keep failing",
             (blocked,), "2m"),
        Rule("KworkersDeadLetters",
             "poison records need a person (or a redrive after a fix): alert on DLQ growth",
             f"{dead} > 0", "ticket",
             "{{ $labels.group }}: {{ $value }} records dead-lettered "
             "({{ $labels.error_type }})", (dead,)),
        Rule("KworkersCommitUncertain",
             "a commit whose outcome is unknown: expect redeliveries (absorbed by idempotency)",
             f"{uncertain} > 0", "ticket",
             "{{ $labels.group }}: commit outcomes uncertain; redeliveries may follow",
             (uncertain,)),
        Rule("KworkersTransactionsNotCommitting",
             "exactly once: transactions abort and none commits (a topic refusing outputs, a "
             "producer fenced over and over): outputs wait and the offsets stand still",
             f"{aborted} > 0\nand {committed} == 0", "page",
             "{{ $labels.group }}: exactly-once transactions abort and none commits",
             (aborted, committed), "5m"),
        Rule("KworkersNoProgress",
             "records are in flight but nothing completes: a stuck handler or a wedged pool",
             f"{in_flight} > 0\nand {done} == 0", "page",
             "{{ $labels.group }}: records in flight but none completed for 10 minutes",
             (in_flight, done), "10m"),
        Rule("KworkersRetriesLate",
             "retries run later than due: the retry loop's timer buffer is full or the pool is "
             "short (the histogram's top bucket is 30 s, so a p99 above it reads 30: the "
             "threshold is >= 30, not > 30, which could never fire)", f"{late} >= 30",
             "ticket", "{{ $labels.group }}: p99 retry lateness 30 s or more", (late,), "10m"),
        Rule("KworkersPartitionStalled",
             "a partition with lag makes no progress and nothing runs or holds it (the worker's "
             "/readyz says 503 meanwhile): its records wait for nobody",
             f"{stalled} > 0", "page",
             "{{ $labels.group }}: {{ $labels.topic }}[{{ $labels.partition }}] is stalled",
             (stalled,), "2m"),
        Rule("KworkersTimeLagHigh",
             f"a partition's oldest record not completed has waited over {time_lag_bound_s:g} "
             "s (held lag counts too: a breaker open, a registry down)",
             f"{time_lag} > {time_lag_bound_s:g}", "ticket",
             "{{ $labels.group }}: {{ $labels.topic }}[{{ $labels.partition }}] is "
             "{{ $value | humanizeDuration }} behind", (time_lag,), "5m"),
        Rule("KworkersDrainableLagGrowingAtMaxReplicas",
             "lag more replicas could drain keeps growing and KEDA's HPA is at its maximum: "
             "the pool cannot keep up (raise maxReplicaCount, up to the partition count, or "
             "add partitions)", f"{growing} > 0\nand on (namespace, app) {at_max}", "page",
             "{{ $labels.group }}: drainable lag grows with the pool at its maximum replicas",
             (growing, at_max), "10m"),
        Rule("KworkersBreakerOpenLong",
             f"a circuit breaker has not closed once in {BREAKER_OPEN_WINDOW} (open, or "
             "half-open probes failing): its dependency is down and its partitions wait",
             f"{breaker} > 0", "ticket",
             f"{{{{ $labels.group }}}}: circuit breaker not closed for {BREAKER_OPEN_WINDOW}",
             (breaker,), "1m"),
        Rule("KworkersSchemaRegistryUnreachable",
             "records wait for the schema registry (held on purpose, not stalled): nothing of "
             "theirs is handled until it answers", f"{registry} > 0", "page",
             "{{ $labels.group }}: {{ $value }} partitions wait for the schema registry",
             (registry,), "5m"),
        Rule("KworkersOutputTopicMissing",
             "an exactly-once loop's outputs wait for a topic that does not exist: nothing is "
             "committed past their records", f"{output} > 0", "page",
             "{{ $labels.group }}: output topic {{ $labels.topic }} does not exist",
             (output,), "5m"),
    )


HEADER = """\
# Alerts on what kworkers exports (kworkers/metrics.py). Generated by
# `python -m kworkers.observability alerts` from kworkers/observability/alerts.py: edit that,
# not this file (a unit test fails when they differ). promtool tests every rule against series
# fixtures (tests/unit/promtool/alerts_test.yml), and an integration test evaluates each one
# against a real Prometheus scraping a real worker.
"""


def render_rules(group: str | None = None) -> str:
    """The rules file: one group ``kworkers``, each rule after a comment saying why."""
    return render(rules(group))


def render(chosen: tuple[Rule, ...]) -> str:
    """A rules file of ``chosen`` (``render_rules``; the canaries render changed rules)."""
    out = [HEADER.rstrip("\n"), "groups:", "  - name: kworkers", "    rules:"]
    for r in chosen:
        out += [f"      # {line}" for line in wrap_words(r.why, 90)]
        out.append(f"      - alert: {r.alert}")
        out.append("        expr: |-")
        out += [f"          {line}" for line in r.expr.splitlines()]
        if r.for_ is not None:
            out.append(f"        for: {r.for_}")
        out.append(f"        labels: {{severity: {r.severity}}}")
        out.append("        annotations:")
        out.append(f"          summary: {json.dumps(r.summary)}")
    return "\n".join(out) + "\n"


