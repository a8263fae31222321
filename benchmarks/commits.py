"""commits: what the default commit policy costs, against a worker that never commits.

The same pre-produced topic (100-byte values, 6 partitions) is read by a worker with the default
``CommitPolicy()`` (once a second, or after 50,000 completions) and by one with
``CommitPolicy(interval_s=3600, max_completions=10**9)``, which commits only when it stops; in
the order default, none, default, none, best run of each. Each commit is one synchronous
request carrying one offset per partition that progressed (here all 6, as they progress
together), so commits per partition per second is ``kworkers_commits_total`` over the run's
seconds.
"""

from __future__ import annotations

from benchmarks.common import Mode, console, fmt, kafka, produce_fill, quiet_logs, result, table
from benchmarks.throughput import PARTITIONS, VALUE_SIZE, KwRun, kworkers_run
from kworkers import CommitPolicy
from kworkers.testing.workload import make_topic, unique

NEVER = CommitPolicy(interval_s=3600, max_completions=10**9)


def main(mode: Mode) -> None:
    quiet_logs()
    n = mode.pick(20_000, 200_000, 1_000_000)
    with kafka() as bs:
        topic = make_topic(bs, unique("commits"), PARTITIONS)
        secs = produce_fill(bs, topic, n, PARTITIONS, VALUE_SIZE)
        console.print(f"produced {n:,} records of {VALUE_SIZE} B over {PARTITIONS} partitions "
                      f"in {secs:.1f}s")
        runs: list[KwRun] = []
        for _ in range(2):
            for side, policy in (("default", CommitPolicy()), ("none", NEVER)):
                r = kworkers_run(bs, topic, n, side=side, commit=policy)
                console.print(f"  {side:8s} {r.records:,} records in {r.seconds:.2f}s = "
                              f"{r.mps:,.0f} records/s, {r.commits:.0f} commits")
                runs.append(r)
    default = max((r for r in runs if r.side == "default"), key=lambda r: r.mps)
    never = max((r for r in runs if r.side == "none"), key=lambda r: r.mps)
    ratio = default.mps / never.mps
    rate = default.commits / default.seconds
    table(f"commits, {n:,} records, {PARTITIONS} partitions (best of 2)",
          ["policy", "records/s", "commits", "commits per partition per s"],
          [["default CommitPolicy()", f"{default.mps:,.0f}", f"{default.commits:.0f}",
            fmt(rate, 2)],
           ["never (interval 3600 s)", f"{never.mps:,.0f}", f"{never.commits:.0f}", "0"],
           ["ratio default/never (aim >= 0.9 at <= 1/s)", fmt(ratio, 3), "", ""]])
    result("commits", {"ratio": round(ratio, 3), "commits_per_partition_s": round(rate, 3),
                       "default_mps": round(default.mps), "never_mps": round(never.mps),
                       "records": n})
