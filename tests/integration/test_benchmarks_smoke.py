"""Every benchmark runs end to end at its smallest size and prints its RESULT line.

Each runs as ``python -m benchmarks NAME --smoke`` against the session broker (through
``KWORKERS_BOOTSTRAP``, so no second broker starts). Figures are never checked: only that the
run succeeds and reports the keys BENCHMARKS.md documents.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kworkers.testing import Broker

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
REQUIRED: dict[str, tuple[str, ...]] = {
    "throughput": ("ratio", "raw_mps", "kworkers_mps"),
    "slow_io": ("ratio", "violations"),
    "rebalance": ("gap_s_eager", "gap_s_cooperative", "gap_s_consumer",
                  "resume_s_cooperative", "resume_s_consumer"),
    "retry_timing": ("early", "p99_ms", "idle_cpu"),
    "commits": ("ratio", "commits_per_partition_s"),
    "soak": ("rss_growth_mb",),
}


def result_line(name: str, stdout: str) -> dict[str, str]:
    lines = [ln for ln in stdout.splitlines() if ln.startswith(f"RESULT {name} ")]
    assert len(lines) == 1, f"expected one RESULT {name} line:\n{stdout[-3000:]}"
    assert stdout.rstrip().splitlines()[-1] == lines[0], "the RESULT line must come last"
    pairs = [kv.split("=", 1) for kv in lines[0].split()[2:]]
    assert all(len(p) == 2 and p[0] and p[1] for p in pairs), lines[0]
    return dict((k, v) for k, v in pairs)


@pytest.mark.parametrize("name", list(REQUIRED))
def test_benchmark_smoke(kafka_broker: Broker, name: str) -> None:
    env = {**os.environ, "KWORKERS_BOOTSTRAP": kafka_broker.bootstrap_servers,
           "TESTCONTAINERS_RYUK_DISABLED": "true"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks", name, "--smoke"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-3000:]}"
    figures = result_line(name, proc.stdout)
    missing = [k for k in REQUIRED[name] if k not in figures]
    assert not missing, f"RESULT {name} lacks {missing}: {figures}"
    for key in REQUIRED[name]:
        float(figures[key])  # every figure is a number (never compared with anything)
