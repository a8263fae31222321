"""share: share mode (KIP-932) next to partitioned mode, one worker each, on the same topic.

One pre-produced topic (4 partitions, 100-byte values) is read by fresh groups, the two modes
alternating (share, partitioned, partitioned, share, ...; at least 3 runs each), for two
handlers: a no-op, and slow I/O (a sync handler sleeping 5 ms, 16 threads). The median run of
each mode is reported. Time runs from the first record handled to the last, so the share
group's join (about 5 s on this broker) is not counted.

What to expect: partitioned mode keeps order per partition, so slow I/O runs at most one record
per partition at a time (4 here); share mode keeps no order and runs ``concurrency`` records at
once on any number of partitions, but acknowledges every record (one ACCEPT each, sent in
batches) and may poll again only once a whole poll's records are acknowledged (the client
refuses otherwise), so its no-op rate is bounded by that barrier and by the per-record work.
"""

from __future__ import annotations

import statistics
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
    running,
    table,
    wait_for,
)
from kworkers import Message, Worker
from kworkers.testing.workload import make_topic, unique

PARTITIONS = 4
VALUE_SIZE = 100
SLOW_S = 0.005
CONCURRENCY = 16


class Probe:
    def __init__(self, slow: bool) -> None:
        self.slow = slow
        self.n = 0
        self.first = 0.0
        self.last = 0.0
        self.lock = threading.Lock()

    def handle(self, msg: Message) -> None:
        if self.slow:
            time.sleep(SLOW_S)
        now = time.monotonic()
        with self.lock:
            if self.n == 0:
                self.first = now
            self.n += 1
            self.last = now


def one_run(bs: str, topic: str, n: int, mode: str, slow: bool) -> float:
    """Records per second of one fresh group reading the whole topic."""
    probe = Probe(slow)
    w = Worker(topics=[topic], group_id=unique(f"bench-{mode}"), bootstrap_servers=bs,
               mode=mode, concurrency=CONCURRENCY)  # type: ignore[arg-type]
    w.handler(probe.handle)
    with running(w):
        wait_for(lambda: probe.n >= n, 900, f"{n} records ({mode})", 0.02)
    seconds = probe.last - probe.first
    return n / seconds if seconds > 0 else 0.0


def main(mode: Mode) -> None:
    quiet_logs()
    runs = mode.pick(1, 3, 3)
    sizes = {"noop": mode.pick(2_000, 40_000, 200_000), "slow": mode.pick(200, 2_000, 8_000)}
    medians: dict[tuple[str, str], float] = {}
    with kafka() as bs:
        for case, n in sizes.items():
            topic = make_topic(bs, unique(f"share-{case}"), PARTITIONS)
            produce_fill(bs, topic, n, PARTITIONS, VALUE_SIZE)
            rates: dict[str, list[float]] = {"share": [], "partition": []}
            for i in range(runs):
                order = ("share", "partition") if i % 2 == 0 else ("partition", "share")
                for m in order:
                    rate = one_run(bs, topic, n, m, case == "slow")
                    rates[m].append(rate)
                    console.print(f"  {case:4s} {m:9s} run {i + 1}: {n:,} records "
                                  f"= {rate:,.0f} records/s")
            for m, rs in rates.items():
                medians[(case, m)] = statistics.median(rs)
    noop = medians[("noop", "share")] / medians[("noop", "partition")]
    slow = medians[("slow", "share")] / medians[("slow", "partition")]
    table(f"share vs partitioned, {PARTITIONS} partitions, one worker, concurrency "
          f"{CONCURRENCY}, median of {runs} alternated runs",
          ["handler", "partitioned rec/s", "share rec/s", "share / partitioned"],
          [[f"no-op ({sizes['noop']:,} records)", f"{medians[('noop', 'partition')]:,.0f}",
            f"{medians[('noop', 'share')]:,.0f}", fmt(noop, 3)],
           [f"sleep {SLOW_S * 1000:.0f} ms ({sizes['slow']:,} records)",
            f"{medians[('slow', 'partition')]:,.0f}", f"{medians[('slow', 'share')]:,.0f}",
            fmt(slow, 3)]])
    result("share", {"noop_ratio": round(noop, 3), "slow_ratio": round(slow, 3),
                     "noop_share_mps": round(medians[("noop", "share")]),
                     "noop_partition_mps": round(medians[("noop", "partition")]),
                     "slow_share_mps": round(medians[("slow", "share")]),
                     "slow_partition_mps": round(medians[("slow", "partition")]),
                     "runs": runs})
