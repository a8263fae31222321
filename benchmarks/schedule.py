"""schedule: how fast records are scheduled, and how late they arrive (never early).

One in-process scheduler worker (``Scheduler.worker``: exactly once, the ids in SQLite) over
the rungs of one destination, ladder 2 s / 5 s (horizon 5 s), so most records are moved once
or twice before delivery. N records are scheduled one call after another (each waits for the
broker's acknowledgement: ``schedule_per_s``), due 3–8 s after their call (smoke: 1–3 s).
Lateness is read back from the destination (read_committed): the broker record's timestamp
(set when the transaction thread produced it) minus the due time the test asked for; ``early``
counts records with a negative one. ``handler_*``: the same from ``kw-scheduled-delivered-at``,
when the handler released it (the difference is the exactly-once output's way to the broker).
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path

from benchmarks.common import (
    Mode,
    console,
    fmt,
    kafka,
    quiet_logs,
    result,
    running,
    table,
    wait_for,
)
from kworkers import TierLadder
from kworkers.idempotency.sqlite import SqliteStore
from kworkers.retry_tiers.headers import ms_up
from kworkers.schedule import ScheduleLadder, Scheduler
from kworkers.schedule.headers import DELIVERED_AT, SCHEDULED_ID
from kworkers.testing.checker import read_log
from kworkers.testing.workload import make_topic, unique

PARTITIONS = 6
LADDER = ScheduleLadder((2.0, 5.0), horizon=5.0)
SETTINGS = {"tiers": TierLadder((1.0,))}


def percentile(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))] if xs else float("nan")


def main(mode: Mode) -> None:
    quiet_logs()
    n = mode.pick(30, 1_000, 2_000)
    lo, hi = mode.pick((1.0, 3.0), (3.0, 8.0), (3.0, 8.0))
    rng = random.Random(33)
    with kafka() as bs, tempfile.TemporaryDirectory() as tmp:
        dest = make_topic(bs, unique("bench-sched"), PARTITIONS)
        s = Scheduler(bs, SqliteStore(Path(tmp) / "ids.db"), [dest], ladder=LADDER)
        s.create_topics(PARTITIONS, **SETTINGS)
        w = s.worker(unique("bench-sched"), **SETTINGS)
        due_ms: dict[str, int] = {}
        with running(w):
            t0 = time.monotonic()
            for i in range(n):
                at = time.time() + rng.uniform(lo, hi)
                s.schedule(dest, b"x" * 100, key=str(i % 50), at=at, id=f"b-{i}")
                due_ms[f"b-{i}"] = ms_up(at)
            took = time.monotonic() - t0
            console.print(f"  {n:,} records scheduled in {took:.2f}s ({n / took:,.0f}/s)")
            wait_for(lambda: len(read_log(bs, dest)) >= n, 300, f"{n} deliveries", 0.5)
        s.close()
        back = read_log(bs, dest)
        late = sorted((r.timestamp_ms - due_ms[dict(r.headers)[SCHEDULED_ID].decode()]) / 1000
                      for r in back if r.timestamp_ms is not None)
        # the handler's own view: kw-scheduled-delivered-at (written when it delivered)
        handler = sorted((int(h[DELIVERED_AT]) - due_ms[h[SCHEDULED_ID].decode()]) / 1000
                         for h in (dict(r.headers) for r in back))
    early = sum(1 for x in late if x < 0)
    ms = [x * 1000 for x in late]
    p50, p99, worst = percentile(ms, 0.5), percentile(ms, 0.99), ms[-1] if ms else float("nan")
    h50, h99 = percentile(handler, 0.5) * 1000, percentile(handler, 0.99) * 1000
    table(f"schedule: {n:,} records due in {lo:g}-{hi:g} s, ladder 2 s / 5 s",
          ["figure", "value", "aim"],
          [["schedule calls/s (one after another)", f"{n / took:,.0f}", ""],
           ["lateness p50 (ms)", fmt(p50, 1), ""],
           ["lateness p99 (ms)", fmt(p99, 1), ""],
           ["lateness max (ms)", fmt(worst, 1), ""],
           ["handler's lateness p50 / p99 (ms)", f"{fmt(h50, 1)} / {fmt(h99, 1)}", ""],
           ["early", str(early), "0"],
           ["delivered", str(len(late)), str(n)]])
    result("schedule", {"early": early, "p50_ms": round(p50, 1), "p99_ms": round(p99, 1),
                        "max_ms": round(worst, 1),
                        "handler_p50_ms": round(h50, 1), "handler_p99_ms": round(h99, 1),
                        "schedule_per_s": round(n / took),
                        "delivered": len(late)})
