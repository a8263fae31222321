"""Every benchmark runs end to end at its smallest size and prints its RESULT line; the method's
own checks (read-ahead cap, committed read-back) are shown to work, and to catch what they are
there for.

Each benchmark runs as ``python -m benchmarks NAME --smoke`` against the session broker (through
``KWORKERS_BOOTSTRAP``, so no second broker starts). Speeds are never checked: only that the
run succeeds, reports the keys BENCHMARKS.md documents, and that counts read back from the
broker agree with the method (no side fell short of its N; the cap holds the read-ahead below
what librdkafka fetches at its defaults).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.common import produce_fill
from benchmarks.method import Comparison, Side
from kworkers.testing import Broker
from kworkers.testing.workload import make_topic, unique

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
REQUIRED: dict[str, tuple[str, ...]] = {
    "peers": ("raw_mps", "kworkers_mps", "kworkers_inline_mps", "kworkers_async_mps",
              "kworkers_batch_mps", "read_ahead", "short_commits"),
    "eos": ("raw_eos_mps", "kworkers_alo_mps", "kworkers_eos_mps", "ratio_alo",
            "short_commits"),
    "throughput": ("ratio", "raw_mps", "kworkers_mps", "read_ahead", "read_ahead_defaults",
                   "short_commits"),
    "slow_io": ("ratio", "violations"),
    "iobound": ("ratio_1000", "kworkers_1000", "asyncio_1000", "ratio_partition", "violations",
                "short_commits"),
    "rebalance": ("gap_s_eager", "gap_s_cooperative", "gap_s_consumer",
                  "resume_s_cooperative", "resume_s_consumer"),
    "retry_timing": ("early", "p99_ms", "idle_cpu"),
    "commits": ("ratio", "commits_per_partition_s"),
    "soak": ("rss_growth_mb",),
    "storm": ("handoff_mps", "noop_mps", "ratio", "recovery_s", "peak_rss_mb"),
    "leave": ("exit_s_classic", "exit_s_consumer", "moved_s_classic", "moved_s_consumer"),
    "pace": ("noop_mps", "ratio_replica", "ratio_pool_pg"),
    "handoff_cpu": ("noop_us", "fail_us", "batch_us", "cpu_ratio", "contention",
                    "floor_ratio"),
    "schedule": ("early", "p99_ms", "schedule_per_s", "delivered"),
    "hot": ("raw_mps", "kworkers_mps", "pausing_mps", "hold_gain", "short_commits"),
    "floor": ("consume_us", "messages_us", "in_flight_us", "gc_off_us", "build_us", "gc_us"),
    "autoscale": ("drain_s", "first_scale_out_s", "zero_after_drain_s", "flaps", "spurious",
                  "before47_spurious", "twice"),
    "redrive": ("redrive_rps", "wall_s", "cpu_s", "peak_rss_mb", "clean_once", "duplicates",
                "missing", "crash_once"),
}
# Sides that cannot run in smoke mode; their RESULT value is "n/a".
NOT_IN_SMOKE = {"peers": ("quix_mps", "arroyo_mps", "faststream_mps", "faststream_batch_mps"),
                "eos": ("quix_eos_mps", "quix_alo_mps", "ratio_quix")}


def result_line(name: str, stdout: str) -> dict[str, str]:
    lines = [ln for ln in stdout.splitlines() if ln.startswith(f"RESULT {name} ")]
    assert len(lines) == 1, f"expected one RESULT {name} line:\n{stdout[-3000:]}"
    assert stdout.rstrip().splitlines()[-1] == lines[0], "the RESULT line must come last"
    pairs = [kv.split("=", 1) for kv in lines[0].split()[2:]]
    assert all(len(p) == 2 and p[0] and p[1] for p in pairs), lines[0]
    return dict((k, v) for k, v in pairs)


def run_smoke(broker: Broker, name: str, env_extra: dict[str, str]) -> str:
    env = {**os.environ, "KWORKERS_BOOTSTRAP": broker.bootstrap_servers,
           "TESTCONTAINERS_RYUK_DISABLED": "true", "COLUMNS": "200", **env_extra}
    proc = subprocess.run([sys.executable, "-m", "benchmarks", name, "--smoke"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.parametrize("name", list(REQUIRED))
def test_benchmark_smoke(kafka_broker: Broker, name: str, tmp_path: Path) -> None:
    peers_dir = tmp_path / "peers"
    stdout = run_smoke(kafka_broker, name, {"KWORKERS_PEERS_DIR": str(peers_dir)})
    figures = result_line(name, stdout)
    missing = [k for k in (*REQUIRED[name], *NOT_IN_SMOKE.get(name, ())) if k not in figures]
    assert not missing, f"RESULT {name} lacks {missing}: {figures}"
    for key in REQUIRED[name]:
        float(figures[key])  # every figure is a number (speeds are never compared)
    if "short_commits" in figures:  # read back from the broker: every run committed its N
        assert figures["short_commits"] == "0", stdout[-3000:]
    if name == "redrive":  # counted from the broker: each dead letter replayed once, twice
        assert figures["clean_once"] == figures["crash_once"] == "1", stdout[-3000:]
    if name == "throughput":  # the cap is applied: less read ahead than at librdkafka defaults
        assert 0 < int(figures["read_ahead"]) < int(figures["read_ahead_defaults"]), figures
    if name == "peers":  # smoke mode never installs a peer (CI must not reach for PyPI)
        assert "peers skipped in smoke mode" in stdout
        assert all(figures[k] == "n/a" for k in NOT_IN_SMOKE["peers"]), figures
        assert not peers_dir.exists(), "smoke mode created peer venvs"


def test_short_commit_is_flagged(kafka_broker: Broker) -> None:
    """Canary for the read-back check: a raw loop that never commits is caught, the normal
    one is not (counts read back from the broker with a fresh client, not from the side)."""
    bs = kafka_broker.bootstrap_servers
    n = 3_000
    topic = make_topic(bs, unique("bench-canary"), 2)
    produce_fill(bs, topic, n, 2)
    cmp = Comparison(bs, topic, 2, n, timeout=120)
    summaries = cmp.alternate([Side("raw", "raw"),
                               Side("raw", "no-commit", options={"commit": False})], 1)
    assert summaries["raw"].runs[0].committed >= n
    assert summaries["raw"].short_commits == 0
    assert summaries["no-commit"].runs[0].committed == 0
    assert summaries["no-commit"].short_commits == 1
    assert "committed < N in a run" in summaries["no-commit"].notes
