"""retry_timing: records that fail once run again on time, never early, and waiting is cheap.

Lateness run: 2,000 records fail their first attempt into the 1 s tier
(``RetryPolicy(initial=1.0, max_attempts=3)``, ``TierLadder((1.0, 5.0))``, no jitter, so each
is due exactly 1 s after it failed). The handler compares the time its retry runs with the
record's ``kw-due-at`` header: lateness p50/p99/max, and the number of early runs.

Idle run: handing 2,000 failures to the tier takes longer than the tier's 1 s delay (each
failed record waits for its hand-off's delivery report before its lane moves on), so the first
retries are due before the last failure is handed off and there is no moment where every
record only waits. The CPU figure therefore comes from a second worker with
``RetryPolicy(initial=5.0)``, whose failures all land in the 5 s tier: from the moment the
last one is handed off until shortly before the first is due, the process only waits; its
``time.process_time`` over that window, divided by the window, is ``idle_cpu`` (a fraction of
one core; the whole process, i.e. both poll loops, the hand-off producer and librdkafka).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from benchmarks.common import (
    Mode,
    console,
    counter_value,
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
from kworkers.retry_tiers import no_jitter
from kworkers.retry_tiers.headers import due_at_of
from kworkers.testing.workload import make_topic, unique

PARTITIONS = 6
LADDER = TierLadder((1.0, 5.0))


@dataclass
class Probe:
    lock: threading.Lock = field(default_factory=threading.Lock)
    first_failure_wall: float | None = None
    first_failure: float | None = None
    lateness: list[float] = field(default_factory=list)  # seconds, negative = early
    failed: int = 0

    def handle(self, msg: Message) -> None:
        if msg.attempt == 1:
            with self.lock:
                if self.first_failure is None:
                    self.first_failure, self.first_failure_wall = time.monotonic(), time.time()
                self.failed += 1
            raise RuntimeError("first attempts fail")
        due = due_at_of(msg.headers)
        now = time.time()
        if due is None:
            raise AssertionError("a retry without kw-due-at")
        with self.lock:
            self.lateness.append(now - due)


def make_worker(bootstrap: str, topic: str, initial: float, probe: Probe) -> tuple[Worker, str]:
    group = unique("retry")
    w = Worker(topics=[topic], group_id=group, bootstrap_servers=bootstrap,
               retry=RetryPolicy(initial=initial, max_attempts=3), tiers=LADDER,
               jitter=no_jitter)
    w.handler(probe.handle)
    w.create_topics()
    return w, group


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


def lateness_run(bootstrap: str, n: int) -> tuple[Probe, float]:
    """Returns the probe and the seconds it took to hand all ``n`` failures to the tier."""
    topic = make_topic(bootstrap, unique("retry-late"), PARTITIONS)
    produce_fill(bootstrap, topic, n, PARTITIONS, 100)
    probe = Probe()
    w, group = make_worker(bootstrap, topic, 1.0, probe)
    with running(w):
        handed = wait_for(lambda: counter_value(w.metrics.retries, group, "1s") >= n, 300,
                          f"{n} failures handed to the 1s tier")
        wait_for(lambda: len(probe.lateness) >= n, 300, f"{n} retries run", 0.05)
    assert probe.first_failure is not None
    return probe, handed - probe.first_failure


def idle_run(bootstrap: str, n: int) -> tuple[float, float, Probe]:
    """CPU fraction and window length while ``n`` records wait in the 5 s tier."""
    topic = make_topic(bootstrap, unique("retry-idle"), PARTITIONS)
    produce_fill(bootstrap, topic, n, PARTITIONS, 100)
    probe = Probe()
    w, group = make_worker(bootstrap, topic, 5.0, probe)
    with running(w):
        wait_for(lambda: counter_value(w.metrics.retries, group, "5s") >= n, 120,
                 f"{n} failures handed to the 5s tier", 0.05)
        assert probe.first_failure_wall is not None
        time.sleep(0.2)  # let the tier loop read the records into its timer heap
        window = probe.first_failure_wall + 5.0 - 0.3 - time.time()
        if window < 0.5:
            raise RuntimeError(f"hand-off too slow to leave an idle window ({window:.2f}s)")
        cpu0, t0 = time.process_time(), time.monotonic()
        time.sleep(window)  # no polling here: the benchmark itself must not use the CPU
        cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
        early_runs = len(probe.lateness)
        wait_for(lambda: len(probe.lateness) >= n, 120, f"{n} retries run", 0.05)
    if early_runs:
        raise RuntimeError(f"{early_runs} retries ran inside the idle window: not idle")
    return cpu / wall, wall, probe


def main(mode: Mode) -> None:
    quiet_logs()
    n = mode.pick(200, 2_000, 2_000)
    n_idle = mode.pick(50, 200, 500)
    with kafka() as bs:
        probe, handoff_s = lateness_run(bs, n)
        console.print(f"  {n:,} failures handed to the 1s tier in {handoff_s:.2f}s "
                      f"({n / handoff_s:,.0f}/s)")
        idle_cpu, window, idle_probe = idle_run(bs, n_idle)
        console.print(f"  idle: {n_idle} records waiting in the 5s tier, process CPU "
                      f"{idle_cpu:.1%} of one core over {window:.2f}s")
    late = sorted(probe.lateness + idle_probe.lateness)
    early = sum(1 for x in late if x < 0)
    ms = [x * 1000 for x in late]
    p50, p99, worst = percentile(ms, 0.50), percentile(ms, 0.99), ms[-1]
    table(f"retry_timing: {n:,} + {n_idle} records failing once (no jitter)",
          ["figure", "value", "aim"],
          [["lateness p50 (ms)", fmt(p50, 1), ""],
           ["lateness p99 (ms)", fmt(p99, 1), "<= 100"],
           ["lateness max (ms)", fmt(worst, 1), ""],
           ["early runs", str(early), "0"],
           ["idle CPU (fraction of one core)", fmt(idle_cpu, 4), ""],
           ["hand-off rate to the tier (records/s)", f"{n / handoff_s:,.0f}", ""]])
    result("retry_timing", {"early": early, "p50_ms": round(p50, 1), "p99_ms": round(p99, 1),
                            "max_ms": round(worst, 1), "idle_cpu": round(idle_cpu, 4),
                            "handoff_per_s": round(n / handoff_s), "records": len(late)})
