"""pace: what ``rate_limit`` costs far from the limit, against the same worker without one.

The same pre-produced topic (100-byte values, 6 partitions) is read by the default no-op worker
and by the same worker with ``RateLimit(per_second=10_000_000)``: a limit two orders of magnitude
above what one process reaches, so records never wait for a token and what is measured is the
limit's own cost (a token taken per record from the replica's block, a block from the bucket
now and then). Two rate-limited sides: ``scope="replica"`` (the bucket in the process) and
``scope="pool"`` through PostgreSQL (``KWORKERS_PG_DSN``; the side is reported unavailable
without it). Alternated, each in a process of its own, timed from subscribe
(``benchmarks.method``). Aim: each rate-limited side at >= 0.95 of the no-op's records/s.
"""

from __future__ import annotations

import os

from benchmarks.common import Mode, fmt, kafka, quiet_logs, result, table
from benchmarks.method import Comparison, Side, summary_table

PARTITIONS = 6
VALUE_SIZE = 100
FAR = 10_000_000.0


def _sides() -> tuple[Side, ...]:
    dsn = os.environ.get("KWORKERS_PG_DSN", "")
    pool = {"per_second": FAR, "scope": "pool", "store": dsn}
    return (Side("kworkers", "noop"),
            Side("kworkers", "replica", options={"rate_limit": {"per_second": FAR,
                                                                "scope": "replica"}}),
            Side("kworkers", "pool-pg", options={"rate_limit": pool},
                 unavailable=None if dsn else "KWORKERS_PG_DSN is unset"))


def main(mode: Mode) -> None:
    quiet_logs()
    n = mode.pick(20_000, 200_000, 1_000_000)
    rounds = mode.pick(1, 3, 3)
    sides = _sides()
    with kafka() as bs:
        cmp = Comparison.on_new_topic(bs, "pace", n, PARTITIONS, VALUE_SIZE)
        summaries = cmp.alternate(sides, rounds)
    summary_table(f"pace, {n:,} records, {PARTITIONS} partitions, {rounds} run(s) each, "
                  "alternated", summaries.values(), "noop")
    noop = summaries["noop"].mps
    figures: dict[str, float | int | str] = {"noop_mps": round(noop), "records": n}
    rows = []
    for label in ("replica", "pool-pg"):
        s = summaries[label]
        if not s.ok:
            figures[f"ratio_{label.replace('-', '_')}"] = "n/a"
            continue
        ratio = s.mps / noop if noop else 0.0
        tokens = s.median(lambda r: r.extra.get("tokens")) or 0.0
        waited = s.median(lambda r: r.extra.get("waits")) or 0.0
        figures[f"ratio_{label.replace('-', '_')}"] = round(ratio, 3)
        figures[f"{label.replace('-', '_')}_mps"] = round(s.mps)
        rows.append([label, fmt(ratio, 3), f"{tokens:,.0f}", f"{waited:.3f}"])
    table("rate_limit far from the limit", ["side", "records/s vs no-op (aim >= 0.95)",
                                            "tokens taken (median)",
                                            "s waited for tokens (median)"], rows)
    result("pace", figures)
