"""The Grafana dashboard is generated from code and cannot drift from it (issue #49 item 1).

``deploy/grafana/kworkers.json`` must equal what ``kworkers.observability.dashboard`` renders
now; its queries are exactly ``panels.ROWS``' (which the metric-name check of
``test_alert_rules`` and the real Prometheus of ``tests/integration/test_prometheus_scrape``
read); a group PromQL cannot quote is refused by the builder and by ``kworkers deploy render
--dashboard`` in one line, exit 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kworkers.errors import ConfigError
from kworkers.observability import dashboard
from kworkers.observability.panels import ROWS, concrete, queries

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "deploy" / "grafana" / "kworkers.json"
RENDER = [sys.executable, "-m", "kworkers.cli", "deploy", "render",
          "kworkers.deploy.example:worker", "--image", "img:1", "--app", "orders",
          "--partitions", "6", "-b", "kafka.example:9092"]


def _targets(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for p in board["panels"] for t in p.get("targets", [])]


def test_the_committed_dashboard_is_what_the_code_renders() -> None:
    assert COMMITTED.read_text("utf-8") == dashboard.render(), (
        "deploy/grafana/kworkers.json differs from kworkers/observability/panels.py: run "
        "`python -m kworkers.observability dashboard > deploy/grafana/kworkers.json`")


def test_rendering_twice_gives_the_same_bytes() -> None:
    assert dashboard.render() == dashboard.render()
    assert dashboard.render("orders") == dashboard.render("orders")


def test_its_panels_and_queries_are_the_panel_specs() -> None:
    board = json.loads(COMMITTED.read_text("utf-8"))
    assert [t["expr"] for t in _targets(board)] == [q.expr for _, q in queries()]
    titles = [p["title"] for p in board["panels"] if p["type"] != "row"]
    assert titles == [p.title for r in ROWS for p in r.panels]
    assert [p["title"] for p in board["panels"] if p["type"] == "row"] == [r.title for r in ROWS]
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert set(variables) == {"datasource", "namespace", "group"}
    for name in ("namespace", "group"):
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
    for t in _targets(board):  # every query filters on both variables, or on the namespace
        assert '$namespace"' in t["expr"], t["expr"]
        assert t["datasource"]["uid"] == "${datasource}"


def test_the_issue_s_panels_are_all_there() -> None:
    text = " ".join(q.expr for _, q in queries())
    for metric in ("kworkers_consumer_lag", "kworkers_consumer_time_lag_seconds",
                   "kworkers_drainable_lag", "kworkers_group_processes_ready",
                   "kube_horizontalpodautoscaler_spec_max_replicas", "kworkers_records_total",
                   "kworkers_handler_duration_seconds_bucket", "kworkers_dead_letters_total",
                   "kworkers_retries_total", "kworkers_tier_waiting_records",
                   "kworkers_tier_due_records", "kworkers_breaker_state",
                   "kworkers_partition_stalled", "kworkers_commit_duration_seconds_bucket",
                   "kworkers_commit_uncertain_total", "kworkers_transactions_total",
                   "kworkers_rate_limit_wait_seconds_bucket",
                   "kworkers_payload_waiting_partitions", "kworkers_output_topic_missing"):
        assert metric in text, metric


def test_one_group_is_selected_with_its_retry_group() -> None:
    board = dashboard.build("orders")
    (group,) = [v for v in board["templating"]["list"] if v["name"] == "group"]
    assert group["current"]["value"] == ["orders", "orders.retry"]
    assert concrete('x{group=~"$group"}', group="orders") == 'x{group=~"orders"}'


@pytest.mark.parametrize("group", ['or"ders', "or\\ders", "or\nders", ""])
def test_a_group_promql_cannot_quote_is_refused(group: str) -> None:
    with pytest.raises(ConfigError, match="cannot be quoted in a PromQL label matcher"):
        dashboard.render(group)


def _render(*extra: str, group: str = "orders") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KWORKERS_")}
    return subprocess.run([*RENDER, *extra], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**env, "KWORKERS_GROUP_ID": group})


def test_deploy_render_writes_the_dashboard_and_alerts_beside_the_manifests(
        tmp_path: Path) -> None:
    out = _render("--dashboard", "--alerts", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    cm = yaml.safe_load((tmp_path / "grafana" / "dashboard.yaml").read_text())
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["orders.json"]) == dashboard.build("orders")
    assert (tmp_path / "grafana" / "orders.json").read_text() == dashboard.render("orders")
    rules = (tmp_path / "prometheus" / "orders-alerts.yml").read_text()
    assert 'group=~"orders|orders\\\\.retry"' in rules
    streamed = _render("--dashboard")  # printed: the ConfigMap is one more document
    assert streamed.returncode == 0, streamed.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(streamed.stdout)]
    assert kinds.count("ConfigMap") == 2, kinds


@pytest.mark.parametrize("flags", [["--dashboard"], ["--alerts"]])
def test_deploy_render_refuses_a_group_promql_cannot_quote_in_one_line(
        tmp_path: Path, flags: list[str]) -> None:
    out = _render(*flags, "--out", str(tmp_path / "out"), group='or"ders')
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert "cannot be quoted in a PromQL label matcher" in lines[0]
    assert not (tmp_path / "out").exists()


def test_alerts_without_out_is_refused() -> None:
    out = _render("--alerts")
    assert out.returncode == 2 and "--out" in out.stderr
