"""The alert rules are proven, not just named (issue #49 item 2).

``promtool`` (Debian's ``prometheus`` package) checks ``deploy/prometheus/alerts.yml`` and runs
``tests/unit/promtool/alerts_test.yml``: every rule fires on its fixture series and stays silent
on the quiet series beside them and before its ``for:`` has passed. The canaries show the
fixtures have teeth: a threshold changed, a metric renamed, each rule made never to fire and
each made to fire on everything, and promtool reports the failure every time. Every metric an
expression names is one ``kworkers.metrics`` registers (or one of the few external series the
dashboard and alerts read), with labels it has: a rename fails here before any broker starts.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import Counter

from kworkers.errors import ConfigError
from kworkers.metrics import MetricName, Metrics
from kworkers.observability import alerts
from kworkers.observability.panels import EXTERNAL_METRICS, TARGET_LABELS, queries
from kworkers.testing.prometheus import prometheus_binary

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
FIXTURES = ROOT / "tests" / "unit" / "promtool" / "alerts_test.yml"


def promtool() -> str:
    return prometheus_binary("promtool")


def run_fixtures(tmp: Path, rules_text: str) -> subprocess.CompletedProcess[str]:
    """``promtool test rules`` of the fixtures against ``rules_text`` (written under ``tmp``,
    where the fixtures' relative ``rule_files`` path finds it)."""
    rules = tmp / "deploy" / "prometheus" / "alerts.yml"
    rules.parent.mkdir(parents=True, exist_ok=True)
    rules.write_text(rules_text, encoding="utf-8")
    fixtures = tmp / "tests" / "unit" / "promtool" / "alerts_test.yml"
    fixtures.parent.mkdir(parents=True, exist_ok=True)
    fixtures.write_text(FIXTURES.read_text("utf-8"), encoding="utf-8")
    out = subprocess.run([promtool(), "test", "rules", str(fixtures)], capture_output=True,
                         text=True, timeout=120)
    # promtool prints its failures on stderr: one text to search
    return subprocess.CompletedProcess(out.args, out.returncode, out.stdout + out.stderr, "")


# --- the committed file is the code's ----------------------------------------------------------

def test_the_committed_rules_are_what_the_code_renders() -> None:
    assert RULES.read_text("utf-8") == alerts.render_rules(), (
        "deploy/prometheus/alerts.yml differs from kworkers/observability/alerts.py: run "
        "`python -m kworkers.observability alerts > deploy/prometheus/alerts.yml`")


def test_promtool_checks_the_rules_and_every_fixture_passes() -> None:
    check = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(alerts.rules())} rules found" in check.stdout
    test = subprocess.run([promtool(), "test", "rules", str(FIXTURES)], capture_output=True,
                          text=True, timeout=120)
    assert test.returncode == 0, test.stdout + test.stderr
    assert "SUCCESS" in test.stdout


def test_every_rule_has_a_firing_and_a_silent_fixture() -> None:
    fixtures = yaml.safe_load(FIXTURES.read_text("utf-8"))
    fires: set[str] = set()
    silent: set[str] = set()
    for test in fixtures["tests"]:
        for case in test.get("alert_rule_test", []):
            (fires if case["exp_alerts"] else silent).add(case["alertname"])
    names = {r.alert for r in alerts.rules()}
    assert names - fires == set(), "rules never shown firing"
    assert names - silent == set(), "rules never shown silent"
    assert fires | silent <= names, "fixtures for rules that do not exist"


# --- the canaries: promtool must report each broken rule -----------------------------------------

def _changed(alert: str, expr: str) -> tuple[alerts.Rule, ...]:
    """The rules with ``alert``'s expression replaced (its signals dropped: they were the old
    expression's)."""
    return tuple(dataclasses.replace(r, expr=expr, signals=()) if r.alert == alert else r
                 for r in alerts.rules())


def test_canary_a_threshold_changed_fails(tmp_path: Path) -> None:
    (rule,) = [r for r in alerts.rules() if r.alert == "KworkersTimeLagHigh"]
    text = alerts.render(_changed(rule.alert, expr=rule.expr.replace("> 300", "> 5")))
    out = run_fixtures(tmp_path, text)
    assert out.returncode != 0 and "KworkersTimeLagHigh" in out.stdout, out.stdout
    # the same copy of the fixtures passes on the committed rules (the canary is the change)
    assert run_fixtures(tmp_path / "ok", alerts.render_rules()).returncode == 0


def test_canary_the_old_retry_lateness_threshold_never_fired(tmp_path: Path) -> None:
    """``> 30`` on a histogram whose top bucket is 30 s: the p99 reads 30 at most."""
    (rule,) = [r for r in alerts.rules() if r.alert == "KworkersRetriesLate"]
    out = run_fixtures(tmp_path, alerts.render(
        _changed(rule.alert, expr=rule.expr.replace(">= 30", "> 30"))))
    assert out.returncode != 0 and "KworkersRetriesLate" in out.stdout, out.stdout


def test_canary_plain_increase_misses_the_first_dead_letters_of_a_new_error_type(
        tmp_path: Path) -> None:
    """The old expression, ``increase(...[15m]) > 0``: a series born at its first value has
    no increase, so the fixture's ``born`` group goes unseen (the real worker of
    tests/integration/test_prometheus_scrape.py showed the same)."""
    (rule,) = [r for r in alerts.rules() if r.alert == "KworkersDeadLetters"]
    old = ("sum by (group, error_type) (increase(kworkers_dead_letters_total[15m])) > 0")
    out = run_fixtures(tmp_path, alerts.render(_changed(rule.alert, expr=old)))
    assert out.returncode != 0 and 'group="born"' in out.stdout, out.stdout


def test_canary_a_renamed_metric_fails_promtool_and_the_name_check(tmp_path: Path) -> None:
    (rule,) = [r for r in alerts.rules() if r.alert == "KworkersPartitionStalled"]
    expr = rule.expr.replace("kworkers_partition_stalled", "kworkers_partition_stall")
    out = run_fixtures(tmp_path, alerts.render(_changed(rule.alert, expr=expr)))
    assert out.returncode != 0 and "KworkersPartitionStalled" in out.stdout, out.stdout
    assert unknown_names(expr) == ["kworkers_partition_stall"]


@pytest.mark.parametrize("way", ["never", "always"])
def test_canary_each_rule_made_never_or_always_to_fire_fails(tmp_path: Path, way: str) -> None:
    """Every rule replaced, one at a time, by one that never fires (its fixture must see it
    missing) and by its first signal without its threshold (it then fires for the quiet
    series too, which its fixture must see)."""
    missed = []
    for i, rule in enumerate(alerts.rules()):
        expr = "vector(1) < 0" if way == "never" else f"({rule.signals[0]}) >= 0"
        out = run_fixtures(tmp_path / str(i), alerts.render(_changed(rule.alert, expr=expr)))
        if out.returncode == 0 or rule.alert not in out.stdout:
            missed.append(rule.alert)
    assert missed == [], f"fixtures that pass with the rule {way} firing: {missed}"


# --- names and labels ------------------------------------------------------------------------

def _registered() -> dict[str, tuple[str, ...]]:
    """Every series name kworkers.metrics registers (``_total``, ``_bucket``... included),
    with its labels."""
    reg = Metrics().registry
    return {name: tuple(getattr(c, "_labelnames", ()))
            for name, c in reg._names_to_collectors.items()}


_NAME = re.compile(r"\b(?:kworkers|kube)_[a-z_]+\b")


def unknown_names(expr: str) -> list[str]:
    known = _registered()
    return [n for n in _NAME.findall(expr) if n not in known and n not in EXTERNAL_METRICS]


def unknown_labels(expr: str) -> list[str]:
    """Labels an expression matches or aggregates by that none of its metrics has."""
    known = _registered()
    names = [n for n in _NAME.findall(expr) if n in known]
    have = set(TARGET_LABELS).union(*(known[n] for n in names))
    used = set(re.findall(r"\b([a-z_]+)\s*(?:=~|!~|!=|=)\s*\"", expr))
    for group in re.findall(r"\b(?:by|on|without|ignoring)\s*\(([^)]*)\)", expr):
        used |= {x.strip() for x in group.split(",") if x.strip()}
    used -= {"__name__"}
    return sorted(used - have)


def test_every_expression_names_registered_metrics_and_their_labels() -> None:
    exprs = [r.expr for r in alerts.rules()] + [q.expr for _, q in queries()]
    problems = {e: (unknown_names(e), unknown_labels(e)) for e in exprs}
    assert {e: p for e, p in problems.items() if p != ([], [])} == {}


def test_the_metric_name_literal_is_what_the_registry_registers() -> None:
    """``MetricName`` (a typo is a type error) names exactly the series families
    ``Metrics`` registers (counters with ``_total``), so neither can drift from the other."""
    families: list[Any] = list(set(Metrics().registry._names_to_collectors.values()))
    registered = {f"{c._name}_total" if isinstance(c, Counter) else c._name for c in families}
    assert set(typing.get_args(MetricName)) == registered


def test_canary_the_label_check_sees_a_wrong_label() -> None:
    assert unknown_labels('max by (groupid) (kworkers_consumer_lag{group="g"})') == ["groupid"]
    assert unknown_labels('kworkers_dead_letters_total{error="x"}') == ["error"]


# --- bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize("group", ['or"ders', "or\\ders", "or\nders", ""])
def test_a_group_promql_cannot_quote_is_refused(group: str) -> None:
    with pytest.raises(ConfigError, match="cannot be quoted in a PromQL label matcher"):
        alerts.render_rules(group)


def test_rules_for_one_group_select_it_and_its_retry_group(tmp_path: Path) -> None:
    text = alerts.render_rules("orders.v1")
    assert 'group=~"orders\\\\.v1|orders\\\\.v1\\\\.retry"' in text
    path = tmp_path / "alerts.yml"
    path.write_text(text, encoding="utf-8")
    check = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
