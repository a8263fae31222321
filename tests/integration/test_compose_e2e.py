"""docker-compose.yml end to end: Kafka, the schema registry, topic creation, the worker and the
demo producer.

Builds the worker image locally (deploy/images/worker/build), brings the stack up on free ports
(never 9092, so it cannot meet another test's broker), waits until the group's committed
positions, read back from the stack's broker, are past every record the demo producer wrote
(never the worker's own counters), and tears everything down. Prometheus is left out: its
image lives on Docker Hub, which this machine cannot reach (the service sits behind the
`prometheus` profile).

Skips, saying why, without a Docker engine, without a compose tool, or without a local Kafka
image (pulling one needs a registry). Every step is bounded in time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from kworkers.testing import Broker
from kworkers.testing.broker import default_image, free_port
from kworkers.testing.checker import read_log
from kworkers.testing.registry import CCOMPAT_PATH, LOCAL_REGISTRY_IMAGE, wait_ready
from kworkers.testing.workload import make_topic, produce_numbered, unique
from tests.faults.hostile import stalled, until_clean

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT = 1200  # a first build runs debootstrap and pip; later ones are cached
UP_TIMEOUT = 300
RECORDS = 200


def _ok(cmd: list[str], timeout: float = 30) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=timeout).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def compose_command() -> list[str] | None:
    """``docker compose`` (the plugin) where it exists, else Debian's ``docker-compose``."""
    if shutil.which("docker") and _ok(["docker", "compose", "version"]):
        return ["docker", "compose"]
    if shutil.which("docker-compose") and _ok(["docker-compose", "version"]):
        return ["docker-compose"]
    return None


def kafka_image() -> str | None:
    image = os.environ.get("KWORKERS_KAFKA_IMAGE") or default_image()
    return image if _ok(["docker", "image", "inspect", image]) else None


def metric_total(port: int, name: str) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as r:
            text = r.read().decode()
    except (urllib.error.URLError, OSError):
        return -1.0
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == name)


def not_consumed(bs: str, group: str, topic: str, produced: int) -> list[str]:
    """Read back from the broker: the topic holds the ``produced`` records (a producer's retry
    may add one), and the group's committed position is past the last record of every
    partition (none committed, or one short of the end, is a problem). Never the worker's own
    counters."""
    log = read_log(bs, topic, timeout=30)
    held = sum(len(records) for records in log.records.values())
    problems = [] if held >= produced else [f"{topic} holds {held} records, {produced} produced"]
    return problems + stalled(bs, group, [topic])


def http_status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (urllib.error.URLError, OSError):
        return -1


@pytest.fixture
def stack() -> Iterator[tuple[list[str], dict[str, str], int]]:
    if not shutil.which("docker") or not _ok(["docker", "info"], 15):
        pytest.skip("no Docker engine is running")
    compose = compose_command()
    if compose is None:
        pytest.skip("no compose tool: neither `docker compose` nor `docker-compose` works "
                    "(apt-get install docker-compose)")
    kafka = kafka_image()
    if kafka is None:
        pytest.skip("no Kafka image on this machine (deploy/images/kafka/build makes one)")
    registry = os.environ.get("KWORKERS_REGISTRY_IMAGE") or LOCAL_REGISTRY_IMAGE
    if not _ok(["docker", "image", "inspect", registry]):
        pytest.skip(f"no schema registry image {registry} (deploy/images/registry/build makes it)")
    build = subprocess.run([str(ROOT / "deploy/images/worker/build")], capture_output=True,
                           text=True, timeout=BUILD_TIMEOUT)
    assert build.returncode == 0, f"worker image build failed:\n{build.stderr[-3000:]}"
    image = build.stdout.strip().splitlines()[-1]
    metrics_port = free_port()
    env = {
        **os.environ,
        "KWORKERS_KAFKA_IMAGE": kafka,
        "KWORKERS_REGISTRY_IMAGE": registry,
        "KWORKERS_WORKER_IMAGE": image,
        "KWORKERS_COMPOSE_KAFKA_PORT": str(free_port()),
        "KWORKERS_COMPOSE_CONTROLLER_PORT": str(free_port()),
        "KWORKERS_METRICS_PORT": str(metrics_port),
        "KWORKERS_COMPOSE_REGISTRY_PORT": str(free_port()),
        "KWORKERS_COMPOSE_REGISTRY_MANAGEMENT_PORT": str(free_port()),
        "KWORKERS_DEMO_RECORDS": str(RECORDS),
        "KWORKERS_DEMO_RATE": "200",
    }
    project = f"kworkers-e2e-{uuid.uuid4().hex[:8]}"
    cmd = [*compose, "-p", project, "-f", str(ROOT / "docker-compose.yml")]
    try:
        yield cmd, env, metrics_port
    finally:
        logs = subprocess.run([*cmd, "logs", "--no-color", "--tail", "60"], env=env,
                              capture_output=True, text=True, timeout=60)
        print(logs.stdout[-6000:])
        subprocess.run([*cmd, "down", "-v", "--timeout", "60"], env=env, capture_output=True,
                       timeout=180)


def test_records_flow_through_the_compose_stack(
        stack: tuple[list[str], dict[str, str], int]) -> None:
    cmd, env, port = stack
    up = subprocess.run([*cmd, "up", "-d", "--no-build", "kafka", "schema-registry", "init",
                         "worker", "producer"],
                        env=env, capture_output=True, text=True, timeout=UP_TIMEOUT)
    assert up.returncode == 0, f"compose up failed:\n{up.stderr[-3000:]}"

    # read back from the stack's broker: every record the producer wrote is in the topic and
    # the group committed past it on every partition (commits are periodic and asynchronous:
    # waited for, bounded; the timeout only bounds a hang)
    bs = f"127.0.0.1:{env['KWORKERS_COMPOSE_KAFKA_PORT']}"
    topic, group = env.get("KWORKERS_DEMO_TOPIC", "orders"), env.get("KWORKERS_DEMO_GROUP",
                                                                       "orders-workers")
    deadline = time.monotonic() + UP_TIMEOUT
    while metric_total(port, "kworkers_records_total") < 0 and \
            time.monotonic() < deadline:
        time.sleep(1)  # the worker's /metrics up: the stack is running
    until_clean(lambda: not_consumed(bs, group, topic, RECORDS), UP_TIMEOUT,
                f"{group} committed past all {RECORDS} records of {topic}")
    assert http_status(port, "/healthz") == 200
    assert http_status(port, "/readyz") == 200
    # the stack's schema registry answers the Confluent protocol on loopback
    registry = (f"http://127.0.0.1:{env['KWORKERS_COMPOSE_REGISTRY_PORT']}"
                f"{CCOMPAT_PATH}")
    wait_ready(registry, timeout=UP_TIMEOUT)

    # init and the producer ran to completion
    ps = subprocess.run([*cmd, "ps", "-a"], env=env, capture_output=True, text=True, timeout=60)
    assert ps.returncode == 0
    rows = [line for line in ps.stdout.splitlines() if "_init_" in line or "_producer_" in line
            or "-init-" in line or "-producer-" in line]
    assert len(rows) == 2 and all("Exit 0" in r or "exited (0)" in r.lower() for r in rows), \
        ps.stdout

    # a clean stop: SIGTERM drains and the worker exits 0 well within its grace period
    stop = subprocess.run([*cmd, "stop", "-t", "45", "worker"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert stop.returncode == 0, stop.stderr
    cid = subprocess.run([*cmd, "ps", "-q", "worker"], env=env, capture_output=True, text=True,
                         timeout=60).stdout.strip()
    code = subprocess.run(["docker", "inspect", "-f", "{{.State.ExitCode}}", cid],
                          capture_output=True, text=True, timeout=30).stdout.strip()
    assert code == "0", f"the worker exited with {code} after SIGTERM"


def test_canary_a_group_short_of_the_end_is_not_consumed(kafka_broker: Broker) -> None:
    """The check above on the session's broker (the stack costs minutes): a group that
    committed nothing, one that stopped one record short of the end, a topic short of a
    record are each caught; the group committed to the end passes."""
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("e2e-canary"), 1), unique("g")
    produce_numbered(bs, topic, 20)

    def commit(offset: int) -> None:
        c = Consumer({"bootstrap.servers": bs, "group.id": group, "log_level": 3,
                      "enable.auto.commit": False})
        try:
            c.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
        finally:
            c.close()

    nothing = not_consumed(bs, group, topic, 20)
    assert len(nothing) == 1 and f"{group} on {topic}/0: committed" in nothing[0], nothing
    commit(19)  # the broken worker: the last record handled, its commit never sent
    assert not_consumed(bs, group, topic, 20) == [
        f"{group} on {topic}/0: committed 19, last record 19"]
    commit(20)
    assert not_consumed(bs, group, topic, 21) == [f"{topic} holds 20 records, 21 produced"]
    assert not_consumed(bs, group, topic, 20) == []
