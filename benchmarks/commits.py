"""commits: what the default commit policy costs, against a worker that never commits.

The same pre-produced topic (100-byte values, 6 partitions) is read by a worker with the default
``CommitPolicy()`` (once a second, or after 1,000,000 completions) and by one with
``CommitPolicy(interval_s=3600, max_completions=10**9)``, which commits only when it stops;
alternated, each in a process of its own, timed from subscribe (``benchmarks.method``). Each
commit is one synchronous request carrying one offset per partition that progressed (here all
6, as they progress together), so commits per partition per second is
``kworkers_commits_total`` at the N-th record over the run's seconds.
"""

from __future__ import annotations

import sys

from benchmarks.common import Mode, fmt, kafka, quiet_logs, result, table
from benchmarks.method import Comparison, Side, summary_table

PARTITIONS = 6
VALUE_SIZE = 100
SIDES = (Side("kworkers", "default", options={"commit": "default"}),
         Side("kworkers", "never", options={"commit": "never"}))


def main(mode: Mode) -> None:
    quiet_logs()
    n = mode.pick(20_000, 200_000, 1_000_000)
    rounds = mode.pick(1, 3, 3)
    with kafka() as bs:
        cmp = Comparison.on_new_topic(bs, "commits", n, PARTITIONS, VALUE_SIZE)
        cmp.measure_read_ahead(sys.executable)
        summaries = cmp.alternate(SIDES, rounds)
    default, never = summaries["default"], summaries["never"]
    summary_table(f"commits, {n:,} records, {PARTITIONS} partitions, {rounds} run(s) each, "
                  "alternated", summaries.values(), "never", cmp.read_ahead)
    ratio = default.mps / never.mps
    rate = default.median(lambda r: r.extra["commits"] / r.seconds) or 0.0
    commits = default.median(lambda r: r.extra["commits"]) or 0.0
    table("commit cost", ["policy", "commits until the N-th record (median)",
                          "commits per partition per s"],
          [["default CommitPolicy()", f"{commits:.0f}", fmt(rate, 2)],
           ["never (interval 3600 s)",
            f"{never.median(lambda r: r.extra['commits']) or 0:.0f}", "0"],
           ["ratio default/never records/s (aim >= 0.9 at <= 1/s)", fmt(ratio, 3), ""]])
    result("commits", {"ratio": round(ratio, 3), "commits_per_partition_s": round(rate, 3),
                       "default_mps": round(default.mps), "never_mps": round(never.mps),
                       "records": n})
