"""hot: one partition with a backlog beside idle ones, the load a hot key puts on a topic.

A 6-partition topic whose records all sit on partition 0, read by each side in a process of
its own with a fresh group, alternated (``benchmarks.method``): the raw loop, kworkers with a
sync no-op handler, and the same with backpressure's hold switched off (``pausing``: a
partition at its share paused in the client, as before issue #32's fourth pass), a control
that shows what the hold is worth. Timed from subscribe to the N-th record.

Why it is a benchmark of its own: a pause drops librdkafka's read-ahead of the partition and
its next records wait for the fetch long-polling the idle partitions (``fetch.wait.max.ms``),
so a backpressure built on pauses runs a hot partition a share at a time with a wait after
each; an even spread over the partitions hides it (the others keep the handlers busy).
"""

from __future__ import annotations

import sys

from benchmarks.common import Mode, console, fast_producer, kafka, quiet_logs, result
from benchmarks.method import Comparison, Side, summary_table
from kworkers.testing.workload import make_topic, unique

PARTITIONS = 6
VALUE_SIZE = 100
SIDES = (Side("raw", "raw"), Side("kworkers", "kworkers"),
         Side("kworkers", "pausing", options={"holds": False}))


def fill_one_partition(bootstrap: str, topic: str, n: int) -> None:
    p = fast_producer(bootstrap)
    pad = b"x" * (VALUE_SIZE - 8)
    for i in range(n):
        p.produce(topic, value=b"%08d" % i + pad, partition=0)
        if i % 50_000 == 0:
            p.poll(0)
    if p.flush(120):
        raise RuntimeError("records not delivered")


def main(mode: Mode) -> None:
    quiet_logs()
    n = mode.pick(20_000, 200_000, 1_000_000)
    rounds = mode.pick(1, 3, 3)
    with kafka() as bs:
        topic = make_topic(bs, unique("hot"), PARTITIONS)
        fill_one_partition(bs, topic, n)
        console.print(f"produced {n:,} records of {VALUE_SIZE} B, all on partition 0 of "
                      f"{PARTITIONS}")
        cmp = Comparison(bs, topic, PARTITIONS, n)
        ra = cmp.measure_read_ahead(sys.executable)
        summaries = cmp.alternate(SIDES, rounds)
        cmp.flag_faster_than(summaries, "raw")
    raw, kw, pausing = summaries["raw"], summaries["kworkers"], summaries["pausing"]
    summary_table(f"hot: {n:,} records x {VALUE_SIZE} B on one partition of {PARTITIONS}, "
                  f"{rounds} run(s) each, alternated, timed from subscribe",
                  summaries.values(), "raw", cmp.read_ahead)
    gain = kw.mps / pausing.mps
    console.print(f"kworkers/raw = {kw.mps / raw.mps:.3f}; the hold against pausing: "
                  f"{gain:.2f}x; N / read-ahead = {n / ra:.0f}")
    result("hot", {"raw_mps": round(raw.mps), "kworkers_mps": round(kw.mps),
                   "pausing_mps": round(pausing.mps), "hold_gain": round(gain, 2),
                   "ratio": round(kw.mps / raw.mps, 3),
                   "short_commits": sum(s.short_commits for s in summaries.values()),
                   "records": n})
