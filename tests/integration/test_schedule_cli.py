"""``kworkers schedule`` as a new user meets it (issue #46's friction), on the session broker.

- ``schedule add`` to a destination whose rungs do not exist: one line at once (before, 30 s
  and "no acknowledgement"), naming the rung and a ``kworkers schedule topics`` command;
- that command, pasted as printed, creates the rungs (and the scheduler worker's tiers and
  DLQs); the same ``add`` then succeeds;
- ``schedule run`` with a destination that does not exist: one line naming it;
- ``schedule run --metrics-port``: /readyz answers, /metrics has the scheduler's counters,
  every log line has its time, and the record is delivered once (read back, read_committed).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from kworkers.kafka.clients import list_topics
from kworkers.testing import Broker
from kworkers.testing.broker import free_port
from kworkers.testing.workload import make_topic, read_all, unique
from tests.integration.conftest import wait_for
from tests.integration.test_cli_support import ROOT, cli, one_error_line

pytestmark = pytest.mark.integration

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \d+ [A-Z]+ ")


def _get(port: int, path: str) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1) as r:
            return str(r.read().decode())
    except OSError:
        return None


def test_schedule_topics_add_and_run_as_a_new_user_meets_them(kafka_broker: Broker,
                                                               tmp_path: Path) -> None:
    bs = kafka_broker.bootstrap_servers
    dest, store = unique("reminders"), f"sqlite:{tmp_path / 's.db'}"
    common = ["-b", bs, "--store", store, "--thresholds", "60,3600"]
    add = ["schedule", "add", *common, "-t", dest, "--after", "1", "--id", "r-1", "call Ann"]

    line = one_error_line(cli(*add, timeout=20))  # at once: the timeout only bounds a hang
    assert f"rung topic {dest}.scheduled.due does not exist" in line, line
    command = shlex.split(line.split("`")[1])
    assert command[:3] == ["kworkers", "schedule", "topics"], command
    made = cli(*command[1:])
    assert made.returncode == 0, made.stderr
    have = set(list_topics(bs))
    assert {f"{dest}.scheduled.due", f"{dest}.scheduled.1m", f"{dest}.scheduled.1h",
            f"{dest}.scheduled.due.dlq"} <= have, sorted(t for t in have if dest in t)

    added = cli(*add)
    assert added.returncode == 0 and "scheduled id=r-1" in added.stdout, added.stderr

    run = ["schedule", "run", *common, "-d", dest, "-g", unique("sched")]
    line = one_error_line(cli(*run, timeout=30))
    assert f"destination topic {dest} does not exist" in line, line

    make_topic(bs, dest, 1)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(tmp_path / "run.log", "w") as log:
        p = subprocess.Popen([sys.executable, "-m", "kworkers.cli", *run, "--metrics-port",
                              str(port)], cwd=tmp_path, env=env, stdout=log,
                             stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: len(read_all(bs, dest, 2)) >= 1 or p.poll() is not None, 60,
                 "the delivery")
        assert p.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
        wait_for(lambda: _get(port, "/readyz") is not None, 30, "/readyz")
        metrics = _get(port, "/metrics") or ""
    finally:
        p.send_signal(signal.SIGTERM)
        code = p.wait(60)
    text = (tmp_path / "run.log").read_text()
    assert code == 0, text[-3000:]
    delivered = read_all(bs, dest, 3)
    assert [v for _k, v, _h in delivered] == [b"call Ann"]
    assert f'kworkers_scheduled_records_total{{destination="{dest}",outcome="delivered"}} 1.0' \
        in metrics, metrics[-2000:]
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("%")]
    assert lines and all(LOG_LINE.match(ln) for ln in lines), lines[:5]
