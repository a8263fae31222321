"""`kworkers topics plan|create` and broker errors, through the real entry point."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kworkers.kafka.admin import admin_client, existing_topics
from kworkers.testing import Broker
from kworkers.testing.workload import make_topic, unique
from tests.integration.test_cli_support import ROOT, cli, one_error_line

pytestmark = pytest.mark.integration


def test_plan_changes_nothing_then_create_creates(kafka_broker: Broker) -> None:
    bs = kafka_broker.bootstrap_servers
    t = unique("orders")
    plan = cli("topics", "plan", "-b", bs, "--topic", t, "--partitions", "3",
               "--tiers", "500ms,1s,2m")
    assert plan.returncode == 0, plan.stderr
    for name in (t, f"{t}.retry.500ms", f"{t}.retry.1s", f"{t}.retry.2m", f"{t}.dlq"):
        assert name in plan.stdout
    assert "plan: create=5 exists=0 (nothing was changed)" in plan.stdout
    assert not {n for n in existing_topics(admin_client(bs)) if n.startswith(t)}

    made = cli("topics", "create", "-b", bs, "--topic", t, "--partitions", "3",
               "--tiers", "500ms,1s,2m")
    assert made.returncode == 0, made.stderr
    assert "created=5 exists=0" in made.stdout
    have = existing_topics(admin_client(bs))
    assert {n: have[n] for n in have if n.startswith(t)} == {
        t: 3, f"{t}.retry.500ms": 3, f"{t}.retry.1s": 3, f"{t}.retry.2m": 3, f"{t}.dlq": 3}

    again = cli("topics", "create", "-b", bs, "--topic", t, "--tiers", "500ms,1s,2m,10m")
    assert again.returncode == 0, again.stderr
    assert "created=1 exists=5" in again.stdout
    assert f"created {t}.retry.10m (3 partitions" in again.stdout


def test_existing_source_without_partitions(kafka_broker: Broker) -> None:
    bs = kafka_broker.bootstrap_servers
    t = make_topic(bs, unique("src"), 2)
    p = cli("topics", "plan", "-b", bs, "-t", t)
    assert p.returncode == 0, p.stderr
    assert "plan: create=6 exists=1" in p.stdout  # the default ladder: 5 tiers + the DLQ


@pytest.mark.parametrize(("args", "needle"), [
    (["--topic", "no-such-topic-kw"], "does not exist on"),
    (["--topic", "t", "--tiers", "1s,5x"], "--tiers: expected a duration"),
    (["--topic", "t", "--tiers", "30s,1s"], "strictly increase"),
    (["--topic", "t.dlq", "--partitions", "1"], "is a retry tier or DLQ"),
])
def test_bad_arguments(kafka_broker: Broker, args: list[str], needle: str) -> None:
    for command in ("plan", "create"):
        p = cli("topics", command, "-b", kafka_broker.bootstrap_servers, *args)
        assert p.returncode == 2
        assert needle in one_error_line(p)


UNREACHABLE = [
    ["topics", "plan", "--topic", "t"],
    ["dlq", "list", "--dlq", "t.dlq"],
    ["dlq", "redrive", "--dlq", "t.dlq"],
    ["lag", "--group", "g"],
]


def test_unreachable_broker_is_one_line() -> None:
    """Each command against a port nobody listens on. The probe gives up after 10 s, so the
    four run at once (one wait, not four); the timeout only bounds a hang."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-m", "kworkers.cli", *args, "-b", "127.0.0.1:1"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env, cwd=ROOT) for args in UNREACHABLE]
    for args, proc in zip(UNREACHABLE, procs, strict=True):
        out, err = proc.communicate(timeout=60)
        p = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        assert p.returncode == 2, (args, p.stderr)
        assert "cannot reach Kafka at 127.0.0.1:1" in one_error_line(p), args
