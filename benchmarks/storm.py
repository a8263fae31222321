"""A downstream outage: how fast failures are handed to the tiers, and how soon all is applied.

Three measurements on one broker, in one run:

- ``noop``: a worker with a no-op handler over N records (the baseline of the same run);
- ``handoff``: a worker whose handler raises at once for every record (a dependency that is
  down), no idempotency store; the retry policy's first delay is far beyond the run, so every
  record is handed to the first tier exactly once. The figure is first hand-offs per second,
  counted when the broker acknowledged them;
- ``recovery``: a smaller storm where the downstream is down for ``outage`` seconds while every
  record fails through short tiers, then comes back: seconds from its return until every record
  was applied, and the process's peak RSS (VmHWM) over the whole benchmark.

``noop`` and ``handoff`` alternate (A B A B ...), each on a fresh group, timed from the worker's
start (subscribe) to the Nth record, ≥ 3 runs each; the medians and spreads are printed, the
ratio is handoff / noop. Read-ahead is capped equally on both sides (``READ_AHEAD``), and N is
large next to it, so neither side is timed draining records fetched before its clock started.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

from benchmarks.common import (
    Mode,
    console,
    fmt,
    kafka,
    produce_fill,
    quiet_logs,
    result,
    running,
    table,
    wait_for,
)
from kworkers import Message, RetryPolicy, TierLadder, Worker
from kworkers.admin import TopicSpec, admin_client, create_topics

PARTITIONS = 6
#: librdkafka read-ahead per consumer, the same on both sides (KiB; default 65536)
READ_AHEAD = {"queued.max.messages.kbytes": 4096, "queued.min.messages": 2000}


def _peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _worker(bs: str, topic: str, group: str, **kw: Any) -> Worker:
    w = Worker(topics=[topic], group_id=group, bootstrap_servers=bs,
               consumer_config=dict(READ_AHEAD), **kw)
    w.create_topics(PARTITIONS)
    return w


def _timed(bs: str, topic: str, n: int, side: str, run: int) -> tuple[float, float]:
    """Seconds from start (subscribe) to N records done, for one side, and the CPU seconds this
    process spent meanwhile (every thread: poll loop, runners, hand-off producer)."""
    done = [0]
    lock = threading.Lock()
    if side == "noop":
        w = _worker(bs, topic, f"storm-noop-{run}")

        @w.handler
        def noop(msg: Message) -> None:
            with lock:
                done[0] += 1

        count = lambda: done[0]  # noqa: E731
    else:
        # first retry in 1 h: each record is handed off exactly once during the run
        w = _worker(bs, topic, f"storm-handoff-{run}",
                    retry=RetryPolicy(initial=3600, max_interval=3600, max_attempts=5),
                    tiers=TierLadder((3600.0,)))

        @w.handler
        def down(msg: Message) -> None:
            raise ConnectionError("downstream is down")

        group = f"storm-handoff-{run}"
        retried = w.metrics.records.labels(group, "retried")
        count = lambda: int(retried._value.get())  # noqa: E731
    c0, t0 = time.process_time(), time.monotonic()
    with running(w):
        t1 = wait_for(lambda: count() >= n, 600, f"{side} {n} records", poll=0.005)
        c1 = time.process_time()
    return t1 - t0, c1 - c0


def _recovery(bs: str, n: int, outage: float) -> tuple[float, int]:
    topic = f"storm-rec-{int(time.time())}"
    create_topics(admin_client(bs), [TopicSpec(topic, PARTITIONS)])
    produce_fill(bs, topic, n, PARTITIONS)
    applied: set[bytes] = set()
    lock = threading.Lock()
    down = threading.Event()
    down.set()
    w = _worker(bs, topic, "storm-recovery",
                retry=RetryPolicy(initial=0.5, backoff=2.0, max_interval=2.0, max_attempts=100),
                tiers=TierLadder((0.5, 1.0, 2.0)))

    @w.handler
    def handle(msg: Message) -> None:
        if down.is_set():
            raise ConnectionError("downstream is down")
        with lock:
            applied.add(msg.value or b"")

    with running(w):
        time.sleep(outage)
        down.clear()
        back = time.monotonic()
        done = wait_for(lambda: len(applied) >= n, 900, "every record applied", poll=0.02)
    handed = int(w.metrics.records.labels("storm-recovery", "retried")._value.get())
    return done - back, handed


def main(mode: Mode) -> None:
    quiet_logs()
    n = mode.pick(20_000, 100_000, 300_000)
    runs = mode.pick(1, 3, 3)
    rec_n, outage = mode.pick((2_000, 2.0), (20_000, 10.0), (30_000, 30.0))
    with kafka() as bs:
        topic = f"storm-{int(time.time())}"
        create_topics(admin_client(bs), [TopicSpec(topic, PARTITIONS)])
        produce_fill(bs, topic, n, PARTITIONS)
        times: dict[str, list[float]] = {"noop": [], "handoff": []}
        cpu: dict[str, list[float]] = {"noop": [], "handoff": []}
        for run in range(runs):
            for side in ("noop", "handoff") if run % 2 == 0 else ("handoff", "noop"):
                s, c = _timed(bs, topic, n, side, run)
                times[side].append(s)
                cpu[side].append(c)
                console.print(f"[dim]run {run + 1} {side}: {n / s:,.0f} records/s, "
                              f"{c:.1f} CPU s[/dim]")
        rec_s, handed = _recovery(bs, rec_n, outage)
    mps = {k: [n / s for s in v] for k, v in times.items()}
    med = {k: statistics.median(v) for k, v in mps.items()}
    ratio = med["handoff"] / med["noop"]
    table(f"failure storm, {n:,} records x {runs} runs, {PARTITIONS} partitions",
          ["side", "median records/s", "min", "max", "median CPU s"],
          [[k, f"{med[k]:,.0f}", f"{min(v):,.0f}", f"{max(v):,.0f}",
            f"{statistics.median(cpu[k]):.1f}"] for k, v in mps.items()])
    console.print(f"recovery: {rec_n:,} records failing for {outage:.0f}s ({handed:,} hand-offs)"
                  f", all applied {fmt(rec_s, 2)}s after the downstream came back")
    result("storm", {"handoff_mps": med["handoff"], "noop_mps": med["noop"],
                     "ratio": round(ratio, 3),
                     "cpu_s_handoff": round(statistics.median(cpu["handoff"]), 2),
                     "cpu_s_noop": round(statistics.median(cpu["noop"]), 2),
                     "recovery_s": round(rec_s, 2),
                     "peak_rss_mb": round(_peak_rss_mb(), 1), "n": n, "runs": runs})
