"""A part of a worker fails: /healthz says which and why, and ``kworkers run`` exits non-zero.

Before supervision, a crashed runner was logged and swallowed (its lane stayed marked running,
its partition stalled) and a dead retry loop went unnoticed, while /healthz answered 200: the
pod was never restarted. Here the worker runs as an operator runs it (``kworkers run``), a record
breaks one part, and the test reads /healthz over HTTP and the process's exit code.
"""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from kworkers.testing import Broker
from kworkers.testing.broker import free_port
from kworkers.testing.workload import make_topic, unique

pytestmark = [pytest.mark.integration, pytest.mark.faults]
ROOT = str(Path(__file__).resolve().parents[2])


def _send(bs: str, topic: str, partition: int, value: bytes) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bs, "log_level": 3})
    p.produce(topic, value=value, partition=partition)
    assert p.flush(30) == 0


def _health(port: int) -> tuple[int, str]:
    """The status and body of ``/healthz``; (0, "") for no whole answer: the worker is meant
    to exit, and one that exits while it answers cuts the body short (seen in CI:
    ``IncompleteRead`` on the last poll, after the 503s it was judged by)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        try:
            return e.code, e.read().decode()
        except (http.client.HTTPException, OSError):
            return 0, ""
    except (http.client.HTTPException, OSError):
        return 0, ""


@pytest.mark.parametrize(("trigger", "names"), [
    ("crash", "kworkers-handler"),  # a runner raised
    ("kill-loop", "kworkers-retry-loop"),  # a loop thread died
])
def test_a_failed_part_turns_health_503_and_the_process_exits_non_zero(
        kafka_broker: Broker, tmp_path: Path, trigger: str, names: str) -> None:
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique(f"sup-{trigger}"), 2), unique("g")
    port = free_port()
    env = {**os.environ, "KWORKERS_BOOTSTRAP_SERVERS": bs, "KWORKERS_TOPICS": topic,
           "KWORKERS_GROUP_ID": group, "PYTHONUNBUFFERED": "1"}
    log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [sys.executable, "-m", "kworkers.cli", "run", "tests.apps.fault_worker:worker",
         "--metrics-port", str(port)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while _health(port)[0] != 200 and time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "worker.log").read_text()
            time.sleep(0.1)
        assert _health(port) == (200, "ok\n")
        # partition 0 keeps the drain busy for 5 s; partition 1 breaks a part of the worker
        _send(bs, topic, 0, b"slow")
        time.sleep(0.5)
        _send(bs, topic, 1, trigger.encode())
        seen: list[tuple[int, str]] = []
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            seen.append(_health(port))
            time.sleep(0.05)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    out = (tmp_path / "worker.log").read_text("utf-8", "replace")
    unhealthy = [body for status, body in seen if status == 503]
    assert unhealthy, (seen[-5:], out[-3000:])
    assert names in unhealthy[0], unhealthy[0]
    assert code == 1, out[-3000:]
    assert "kworkers: error:" in out and names in out  # one line that says why
