"""soak: does memory stay flat while many records go through the full pipeline?

1M keyed records (quick: 200k) of 100 bytes over 6 partitions are read by one worker with the
default settings and a no-op handler. The process's resident set (``VmRSS`` in
/proc/self/status) is read when 10% of the records were handled and again at 100%; the growth
between the two is the figure.

librdkafka reads ahead (up to 64 MB of fetched records by default), so a topic that ends at the
last measured record would show its fetch queue full at 10% and empty at 100%: a drop that
could hide a leak. More records than are measured are therefore produced (a tail), so the fetch
queue is in the same steady state at both readings; what grows between them is per-record state
that is never released.
"""

from __future__ import annotations

import gc
import itertools
import threading
import time

from benchmarks.common import (
    Mode,
    console,
    fmt,
    kafka,
    produce_fill,
    quiet_logs,
    result,
    rss_mb,
    running,
    table,
)
from kworkers import Message, Worker
from kworkers.testing.workload import make_topic, unique

PARTITIONS = 6


def peak_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main(mode: Mode) -> None:
    quiet_logs()
    n = mode.pick(20_000, 200_000, 1_000_000)
    tail = mode.pick(20_000, 200_000, 300_000)
    checkpoints = (n // 10, n // 4, n // 2, 3 * n // 4, n)
    with kafka() as bs:
        topic = make_topic(bs, unique("soak"), PARTITIONS)
        secs = produce_fill(bs, topic, n + tail, PARTITIONS, 100,
                            key=lambda i: b"k%d" % (i % 1000))
        console.print(f"produced {n:,} + {tail:,} (unmeasured tail) keyed records over "
                      f"{PARTITIONS} partitions in {secs:.1f}s")
        w = Worker(topics=[topic], group_id=unique("soak"), bootstrap_servers=bs)
        seq = itertools.count(1)
        reached = {c: threading.Event() for c in checkpoints}

        @w.handler
        def handle(msg: Message) -> None:
            i = next(seq)
            ev = reached.get(i)
            if ev is not None:
                ev.set()

        w.create_topics()
        samples: list[tuple[int, float, float]] = []
        start_rss = rss_mb()
        t0 = time.monotonic()
        with running(w):
            for c in checkpoints:
                if not reached[c].wait(600):
                    raise TimeoutError(f"{c:,} records not handled")
                gc.collect()
                samples.append((c, time.monotonic() - t0, rss_mb()))
                console.print(f"  {c:>9,} records  {samples[-1][1]:6.1f}s  "
                              f"RSS {samples[-1][2]:7.1f} MB")
        end_rss = rss_mb()
    at10, at100 = samples[0][2], samples[-1][2]
    growth = at100 - at10
    table(f"soak, {n:,} records, default worker, no-op handler",
          ["point", "RSS (MB)"],
          [["before the worker started", fmt(start_rss, 1)],
           ["10% handled", fmt(at10, 1)],
           ["100% handled", fmt(at100, 1)],
           ["after the worker stopped (tail read too)", fmt(end_rss, 1)],
           ["peak (VmHWM)", fmt(peak_mb(), 1)],
           ["growth 10% -> 100% (aim <= 50)", fmt(growth, 1)]])
    result("soak", {"rss_growth_mb": round(growth, 1), "rss_10_mb": round(at10, 1),
                    "rss_100_mb": round(at100, 1), "records": n})
