"""A handler that never returns, at the defaults, on the real broker (issue #43, item 1).

The issue's run: default settings (no ``message_timeout``), one record whose sync handler
blocks forever in a socket read with no timeout, the others on three partitions: none of the
records behind the hung one ran, ``/healthz`` and ``/readyz`` answered 200 and nothing was
logged. Here ``kworkers run`` runs it as an operator would (small bounds through the settings:
``KWORKERS_STALL_TIMEOUT=2s``, so readiness at 2 s and health at 6 s of a call without a
heartbeat), and beside it, on the same records, the canary: the same worker under the rule
before the fix (no deadline, no bound).

Judged over HTTP and from the broker, as an order of events (no wall-clock threshold): the
fixed worker's ``/readyz`` answers 503 naming the record and how long it has run, then its
``/healthz`` 503, and it exits 1 having committed what finished (the hung record's partition
up to it, the others to their end, read back); the canary, at the moment the fixed worker is
out, is still running, ready and healthy, with nothing logged about the call.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Producer

from kworkers.testing import Broker
from kworkers.testing.broker import free_port
from kworkers.testing.commits import committed
from kworkers.testing.ledger import Ledger
from kworkers.testing.workload import make_topic, unique

pytestmark = [pytest.mark.integration, pytest.mark.faults]
ROOT = str(Path(__file__).resolve().parents[2])
PARTS, PER_PART, HUNG_AT = 3, 10, 3
STALL_S = "2s"


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


class _Run:
    def __init__(self, name: str, bs: str, topic: str, tmp: Path, canary: bool) -> None:
        self.name, self.port, self.group = name, free_port(), unique(f"g-hung-{name}")
        self.ledger_path = tmp / f"{name}.db"
        Ledger(self.ledger_path)  # the tables exist before the first read
        env = {**os.environ, "KWORKERS_BOOTSTRAP_SERVERS": bs, "KWORKERS_TOPICS": topic,
               "KWORKERS_GROUP_ID": self.group, "KWORKERS_STALL_TIMEOUT": STALL_S,
               "KWORKERS_DRAIN_TIMEOUT": "1s", "PYTHONUNBUFFERED": "1",
               "HUNG_WORKER_LEDGER": str(self.ledger_path)}
        if canary:
            env["HUNG_WORKER_CANARY"] = "old-bound"
        self.log_path = tmp / f"{name}.log"
        log = open(self.log_path, "wb")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kworkers.cli", "run", "tests.apps.hung_worker:worker",
             "--metrics-port", str(self.port)], cwd=ROOT, env=env, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        #: (/readyz, /healthz) answers in order, from the first ready one
        self.seen: list[tuple[tuple[int, str], tuple[int, str]]] = []

    def look(self) -> None:
        ready = _get(self.port, "/readyz")
        if ready[0] == 200 or self.seen:
            self.seen.append((ready, _get(self.port, "/healthz")))

    def log(self) -> str:
        return self.log_path.read_text("utf-8", "replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def test_a_handler_that_never_returns_is_named_then_the_worker_exits_committing_what_finished(
        kafka_broker: Broker, tmp_path: Path) -> None:
    bs = kafka_broker.bootstrap_servers
    topic = make_topic(bs, unique("hung"), PARTS)
    p = Producer({"bootstrap.servers": bs, "log_level": 3})
    for part in range(PARTS):
        for off in range(PER_PART):
            hang = (part, off) == (0, HUNG_AT)
            p.produce(topic, value=b"hang" if hang else str(off).encode(), partition=part)
    assert p.flush(30) == 0
    fixed = _Run("fixed", bs, topic, tmp_path, canary=False)
    canary = _Run("canary", bs, topic, tmp_path, canary=True)
    try:
        t0 = time.monotonic()
        deadline = t0 + 120  # a bound on the test, not a judgement
        while fixed.proc.poll() is None and time.monotonic() < deadline:
            fixed.look()
            canary.look()
            time.sleep(0.1)
        code = fixed.proc.wait(10)
        print(f"fixed worker out after {time.monotonic() - t0:.1f}s (stall bound {STALL_S}: "
              f"unready past it, unhealthy past three); /readyz and /healthz read "
              f"{len(fixed.seen)} times, the canary's {len(canary.seen)} times")
        canary.look()
        canary_alive = canary.proc.poll() is None
    finally:
        fixed.close()
        canary.close()
    out = fixed.log()
    record = f"{topic}/0@{HUNG_AT}"
    unready = [r for r, _h in fixed.seen if r[0] == 503]
    unhealthy = [i for i, (_r, h) in enumerate(fixed.seen) if h[0] == 503]
    first_unready = next(i for i, (r, _h) in enumerate(fixed.seen) if r[0] == 503)
    assert unready and record in unready[0][1] and "has been running" in unready[0][1], \
        (unready[:1], out[-3000:])
    assert unhealthy and unhealthy[0] > first_unready and record in fixed.seen[unhealthy[0]][1][1]
    assert code == 1, out[-3000:]
    assert out.count("a handler call runs on") == 1 and record in out
    # committed what finished: the hung record's partition up to it, the others to the end
    assert committed(bs, fixed.group, topic) == {0: HUNG_AT, 1: PER_PART, 2: PER_PART}
    started = {(d.partition, d.offset) for d in Ledger(fixed.ledger_path).deliveries()}
    assert started == {(0, o) for o in range(HUNG_AT + 1)} | {
        (q, o) for q in (1, 2) for o in range(PER_PART)}
    # the canary, at the moment the fixed worker was out: running, ready and healthy throughout
    assert canary_alive, canary.log()[-3000:]
    assert canary.seen and all(r[0] == 200 and h[0] == 200 for r, h in canary.seen), \
        canary.seen[-3:]
    assert "a handler call runs on" not in canary.log()
    assert (0, HUNG_AT) in {(d.partition, d.offset)
                            for d in Ledger(canary.ledger_path).deliveries()}
