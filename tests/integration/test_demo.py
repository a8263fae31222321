"""The README's main job, small: the demo verifies exactly-once charging with the product's
idempotent receiver (exit 0), and without it shows seed 003's double charge (exit 1).

Both runs share the session broker (``--bootstrap``); ``scripts/demo`` itself only adds the
set-up and a broker of its own. Judged from what the demo leaves in ``--workdir``, not from its
printed table: the charges table the workers append to (one row per charge, with the pid that
made it), the certain kill point's marker, and the workers' logs (one "--- process started"
line per process start, written by the demo before the process runs).
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from kworkers.testing import Broker

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
ORDERS, PROCESSES = 30, 2
VICTIM = f"order-{ORDERS // 3}/charge"  # the demo's worker dies right after charging it


def _demo(bootstrap: str, work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo" / "demo.py"), "--bootstrap", bootstrap,
         "--orders", str(ORDERS), "--processes", str(PROCESSES), "--timeout", "240",
         "--workdir", str(work), *args],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**os.environ, "COLUMNS": "200"})


def _charges(work: Path) -> list[tuple[str, int]]:
    """(order, pid) of every charge row, read from the table the workers wrote."""
    conn = sqlite3.connect(work / "demo.db")
    try:
        return [(str(k), int(p)) for k, p in
                conn.execute("SELECT order_key, pid FROM charges ORDER BY rowid")]
    finally:
        conn.close()


def _starts(work: Path) -> int:
    """Worker processes started (the demo marks each start in its log before the process
    runs: a worker killed again before it said "worker ready" was still started; one so
    killed made a CI run count 3 ready lines for 4 starts, 2026-12-05)."""
    return sum(p.read_text("utf-8", "replace").count("--- process started")
               for p in work.glob("worker-*.log"))


def test_demo_charges_each_order_once_and_without_the_receiver_twice(
        kafka_broker: Broker, tmp_path: Path) -> None:
    bs = kafka_broker.bootstrap_servers
    expected = {f"order-{i}/charge" for i in range(ORDERS)}

    ok = _demo(bs, tmp_path / "with", "--kills", "1")
    assert ok.returncode == 0, ok.stdout[-4000:] + ok.stderr[-2000:]
    charged = Counter(k for k, _pid in _charges(tmp_path / "with"))
    assert charged == Counter(dict.fromkeys(expected, 1)), charged  # each once, nothing else
    assert (tmp_path / "with" / "markers" / VICTIM.replace("/", "_")).exists()  # kill fired
    # the certain kill and the demo's own SIGKILL each started a worker again
    assert _starts(tmp_path / "with") >= PROCESSES + 2, _starts(tmp_path / "with")
    # issue #46: the dead letters are counted once, at one moment (orders and dead letters
    # both), and the first redrive replays at least those (the DLQ only grows)
    said = re.search(r"(\d+) orders in (\d+) dead letters", ok.stdout)
    first = re.search(r"redrive: redriven=(\d+) skipped_already=(\d+)", ok.stdout)
    assert said is not None and first is not None, ok.stdout[-3000:]
    orders, letters = int(said[1]), int(said[2])
    assert letters >= orders and int(first[1]) + int(first[2]) >= letters, ok.stdout[-3000:]

    bad = _demo(bs, tmp_path / "without", "--kills", "0", "--fail-rate", "0",
                "--without-receiver")
    assert bad.returncode == 1, bad.stdout[-4000:] + bad.stderr[-2000:]
    rows = _charges(tmp_path / "without")
    charged = Counter(k for k, _pid in rows)
    assert set(charged) == expected  # none lost
    # the worker died after charging order 10 and before committing: charged again by the
    # process the order was redelivered to (so may be others that worker had handled since
    # its last commit)
    assert charged[VICTIM] == 2, charged
    victim_pids = [pid for k, pid in rows if k == VICTIM]
    assert victim_pids[0] != victim_pids[1], rows
    assert (tmp_path / "without" / "markers" / VICTIM.replace("/", "_")).exists()
