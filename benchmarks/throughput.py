"""throughput: the raw confluent-kafka loop against the full kworkers pipeline, no-op handler.

One pre-produced topic (100-byte values, 6 partitions), read by each side in a process of its
own with a fresh group, the sides alternated round by round (``benchmarks.method``): raw, raw
reading every field, raw at librdkafka's default read-ahead (a control: the cap must not be
what limits the raw loop), kworkers. Timed from subscribe to the N-th record.

The raw baseline is what a hand-written consumer does at best: ``consume(500)`` in a loop,
``enable.auto.commit=false`` and one synchronous commit per second. kworkers runs its whole
pipeline: conversion to ``Message``, per-partition lanes on handler threads, offset tracking,
the commit policy and metrics. The kworkers side also reports its CPU per thread over the
window (``/proc/self/task``): the poll loop, the handler pool, librdkafka's threads.

``--profile`` runs the kworkers side once more under py-spy instead (``benchmarks.profile``).
"""

from __future__ import annotations

import sys
from functools import partial

from benchmarks.common import (
    Mode,
    console,
    fmt,
    kafka,
    quiet_logs,
    result,
    table,
)
from benchmarks.method import Comparison, Reading, Side, Summary, summary_table
from kworkers.cli.collector import DEFAULT_YOUNG

PARTITIONS = 6
VALUE_SIZE = 100
#: the collector as ``kworkers run`` sets it (``kworkers.cli.collector``), which docs/CONFIG.md
#: suggests to an application that embeds a ``Worker``: the ``+gc`` sides
GC_TUNED = {"gc": {"threshold": [DEFAULT_YOUNG, 10, 10]}}
SIDES = (Side("raw", "raw"), Side("raw_fields", "raw+fields"),
         Side("raw", "raw@defaults", capped=False), Side("kworkers", "kworkers"),
         Side("kworkers", "kworkers+gc", options=GC_TUNED))


def _thread_cpu(r: Reading, group: str) -> float:
    return float(r.extra.get("threads", {}).get(group, 0.0))


def thread_table(kw: Summary) -> None:
    """kworkers' CPU per thread group, median over its runs."""
    groups = sorted({g for r in kw.runs for g in r.extra.get("threads", {})})
    if not groups:
        return
    med = {g: kw.median(partial(_thread_cpu, group=g)) or 0.0 for g in groups}
    secs = kw.median(lambda r: r.seconds) or 1.0
    total = sum(med.values())
    table("kworkers CPU by thread over the window (median of its runs; the main thread runs "
          "the poll loop)", ["thread", "CPU s", "share of CPU", "busy (CPU / wall)"],
          [[g, fmt(v, 2), f"{v / total:.0%}", f"{v / secs:.0%}"]
           for g, v in sorted(med.items(), key=lambda kv: -kv[1])])


def main(mode: Mode, profile: bool = False) -> None:
    quiet_logs()
    # Smoke: still over 1 MB per partition, so the capped probe cannot read the whole topic.
    n = mode.pick(60_000, 200_000, 1_000_000)
    rounds = mode.pick(1, 3, 3)
    with kafka() as bs:
        cmp = Comparison.on_new_topic(bs, "tput", n, PARTITIONS, VALUE_SIZE)
        if profile:
            from benchmarks.profile import profile_side

            profile_side(cmp, Side("kworkers", "kworkers (sync no-op)"))
            return
        ra = cmp.measure_read_ahead(sys.executable)
        ra_default = cmp.measure_read_ahead(sys.executable, capped=False)
        summaries = cmp.alternate(SIDES, rounds)
        cmp.flag_faster_than(summaries, "raw")
    raw, fields, kw = summaries["raw"], summaries["raw+fields"], summaries["kworkers"]
    summary_table(f"throughput, {n:,} records x {VALUE_SIZE} B, {PARTITIONS} partitions, "
                  f"{rounds} run(s) each, alternated, timed from subscribe", summaries.values(),
                  "raw", cmp.read_ahead)
    thread_table(kw)
    ratio, ratio_fields = kw.mps / raw.mps, kw.mps / fields.mps
    tuned = summaries["kworkers+gc"]
    kw_cpu, tuned_cpu = kw.median(lambda r: r.cpu_s), tuned.median(lambda r: r.cpu_s)
    gc_cpu = round(tuned_cpu / kw_cpu, 3) if kw_cpu and tuned_cpu else "n/a"
    console.print(f"kworkers/raw = {ratio:.3f} (issue #32's aim for the sync no-op: >= 0.4); "
                  f"kworkers/raw+fields = {ratio_fields:.3f}; N / read-ahead = {n / ra:.0f}; "
                  f"with the application's GC threshold at 20,000: {tuned.mps / raw.mps:.3f} "
                  f"x raw, CPU x{gc_cpu} of the default's")
    result("throughput", {"ratio": round(ratio, 3), "raw_mps": round(raw.mps),
                          "kworkers_mps": round(kw.mps), "raw_fields_mps": round(fields.mps),
                          "kworkers_gc_mps": round(tuned.mps), "gc_cpu": gc_cpu,
                          "ratio_fields": round(ratio_fields, 3),
                          "raw_defaults_mps": round(summaries["raw@defaults"].mps),
                          "read_ahead": ra, "read_ahead_defaults": ra_default,
                          "short_commits": sum(s.short_commits for s in summaries.values()),
                          "records": n})
