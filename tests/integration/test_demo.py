"""The README's main job, small: the demo verifies exactly-once charging with the product's
idempotent receiver (exit 0), and without it shows seed 003's double charge (exit 1).

Both runs share the session broker (``--bootstrap``); ``scripts/demo`` itself only adds the
set-up and a broker of its own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kworkers.testing import Broker

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _demo(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo" / "demo.py"), "--bootstrap", bootstrap,
         "--orders", "30", "--processes", "2", "--timeout", "240", *args],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**os.environ, "COLUMNS": "200"})


def _row(out: str, name: str) -> str:
    m = re.search(rf"│ {re.escape(name)}\s*│ ([^│]*?)\s*│", out)
    assert m is not None, f"no {name!r} row in:\n{out}"
    return m.group(1)


def test_demo_charges_each_order_once_and_without_the_receiver_twice(
        kafka_broker: Broker) -> None:
    bs = kafka_broker.bootstrap_servers
    ok = _demo(bs, "--kills", "1")
    out = ok.stdout
    assert ok.returncode == 0, out[-4000:] + ok.stderr[-2000:]
    assert "verified: 30 orders, each charged exactly once" in out
    assert _row(out, "orders charged once") == "30"
    assert _row(out, "orders charged twice or more") == "0"
    assert _row(out, "orders never charged") == "0"
    assert _row(out, "killed right after its charge") == "order-10/charge: charged 1 time(s)"
    assert "SIGKILL worker" in out
    # the certain kill point fired: a worker died after a charge, before its offset commit
    assert re.search(r"SIGKILLs\s*│ 1 by the demo, [2-9]\d* restarts", out), out[-3000:]

    bad = _demo(bs, "--kills", "0", "--fail-rate", "0", "--without-receiver")
    out = bad.stdout
    assert bad.returncode == 1, out[-4000:] + bad.stderr[-2000:]
    assert "NOT verified: charged twice" in out
    # the worker died after charging order 10 and before committing: certainly charged twice
    # (so may be other orders that worker had handled since its last commit)
    assert _row(out, "killed right after its charge") == "order-10/charge: charged 2 time(s)"
    assert int(_row(out, "orders charged twice or more")) >= 1
    assert _row(out, "orders never charged") == "0"
