"""A worker process that aborts in native code, as librdkafka's failed assertion did after a
broker pause (issue #43, item 3: ``rd_kafka_enq_once_del_source_return: Assertion
'eonce->refcnt > 0' failed``, confluent-kafka 2.16.1 / librdkafka 2.16.0, seen once, with no
kworkers message at all).

``kworkers run --processes 2`` runs ``tests/apps/abort_worker.py``, whose handler calls
``os.abort()`` (the same SIGABRT) for one record, once. Judged from what is read back: the
child's output holds Python's ``faulthandler`` stack of the abort (``kworkers run`` enables
it), the pool parent says in one line which process died of which signal and exits non-zero
(stopping the others, so the orchestrator restarts the pool); restarted as Kubernetes would,
the pool then runs everything: every record is in the append-only ledger and the group's
committed position is the end. Canary: the same abort with ``faulthandler`` off again leaves
no stack, so the check of the stack has teeth.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kworkers.testing import Broker
from kworkers.testing.ledger import Ledger
from kworkers.testing.workload import committed_total, make_topic, produce, unique

pytestmark = [pytest.mark.integration, pytest.mark.faults]
ROOT = str(Path(__file__).resolve().parents[2])
RECORDS = 40


def _start(bs: str, topic: str, group: str, run_dir: Path, log: Path, *extra: str,
           canary: bool = False) -> subprocess.Popen[bytes]:
    env = {**os.environ, "KWORKERS_BOOTSTRAP_SERVERS": bs, "KWORKERS_TOPICS": topic,
           "KWORKERS_GROUP_ID": group, "ABORT_WORKER_DIR": str(run_dir),
           "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONFAULTHANDLER", None)  # kworkers run's own doing, not the environment's
    if canary:
        env["ABORT_WORKER_CANARY"] = "no-faulthandler"
    out = open(log, "ab")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "kworkers.cli", "run", "tests.apps.abort_worker:worker",
             *extra], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    finally:
        out.close()


def _wait(proc: subprocess.Popen[bytes], timeout: float, log: Path) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(log.read_text("utf-8", "replace")[-3000:]) from None


def test_a_native_abort_is_named_by_the_pool_and_loses_nothing(
        kafka_broker: Broker, tmp_path: Path) -> None:
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("abort"), 2), unique("g-abort")
    values = [str(i) for i in range(RECORDS - 1)]
    produce(bs, topic, ((f"k{i % 4}".encode(), v.encode())
                        for i, v in enumerate([*values[:20], "abort", *values[20:]])))
    run_dir = tmp_path / "pool"
    run_dir.mkdir()
    log = tmp_path / "pool.log"
    first = _start(bs, topic, group, run_dir, log, "--processes", "2")
    code = _wait(first, 120, log)
    out = log.read_text("utf-8", "replace")
    aborted_pid = int((run_dir / "aborted").read_text())
    assert code == 1, out[-3000:]
    # the parent's one line: which process, which signal
    assert f"(pid {aborted_pid}) was killed by SIGABRT" in out, out[-3000:]
    # the child's stack, from faulthandler: the abort in the handler
    assert "Fatal Python error: Aborted" in out and "abort_worker.py" in out, out[-3000:]
    # restarted as Kubernetes would: everything runs, nothing is lost
    again = _start(bs, topic, group, run_dir, log, "--processes", "2")
    try:
        end = time.monotonic() + 120  # a bound on the test, not a judgement
        ledger = Ledger(run_dir / "ledger.db")
        while set(ledger.applications()) != {*values, "abort"} or \
                committed_total(bs, group, topic, 2) != RECORDS:
            assert time.monotonic() < end and again.poll() is None, \
                log.read_text("utf-8", "replace")[-3000:]
            time.sleep(0.5)
    finally:
        again.send_signal(signal.SIGTERM)
        assert _wait(again, 60, log) == 0
    print(f"pool exit {code}; the aborted pid {aborted_pid}; "
          f"{len(ledger.effects())} effects for {RECORDS} records")


def test_canary_without_faulthandler_an_abort_leaves_no_stack(
        kafka_broker: Broker, tmp_path: Path) -> None:
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("abort-canary"), 1), unique("g-abort-canary")
    produce(bs, topic, [(b"k", b"abort")])
    run_dir = tmp_path / "one"
    run_dir.mkdir()
    log = tmp_path / "one.log"
    code = _wait(_start(bs, topic, group, run_dir, log, canary=True), 120, log)
    out = log.read_text("utf-8", "replace")
    assert code == -signal.SIGABRT, out[-3000:]
    assert (run_dir / "aborted").exists() and "Fatal Python error" not in out
