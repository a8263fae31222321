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
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.child import read_broker_cpu
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
from benchmarks.method import locate_broker_cpu
from kworkers import Message, Worker
from kworkers.testing.workload import make_topic, unique

PARTITIONS = 4
VALUE_SIZE = 100
SLOW_S = 0.005
CONCURRENCY = 16


@dataclass(frozen=True)
class Run:
    """One fresh group reading the whole topic: its rate and the CPU both sides used while it
    handled records (first to last)."""

    mps: float
    cpu_s: float
    broker_cpu_s: float | None


class Probe:
    """Times the window from the first record handled to the n-th; CPU (this process, all
    threads, librdkafka's included; the broker's from its cgroup) is read at both ends only,
    so the handler costs the same in both modes."""

    def __init__(self, n: int, slow: bool, broker: dict[str, str] | None) -> None:
        self.target = n
        self.slow = slow
        self.broker = broker
        self.n = 0
        self.first = self.last = self.cpu0 = self.cpu1 = 0.0
        self.broker0: float | None = None
        self.broker1: float | None = None
        self.lock = threading.Lock()

    def handle(self, msg: Message) -> None:
        if self.slow:
            time.sleep(SLOW_S)
        now = time.monotonic()
        with self.lock:
            if self.n == 0:
                self.first, self.cpu0 = now, time.process_time()
                self.broker0 = read_broker_cpu(self.broker)
            self.n += 1
            self.last = now
            if self.n == self.target:
                self.cpu1 = time.process_time()
                self.broker1 = read_broker_cpu(self.broker)

    def run(self) -> Run:
        seconds = self.last - self.first
        broker = (None if self.broker0 is None or self.broker1 is None
                  else self.broker1 - self.broker0)
        return Run(self.target / seconds if seconds > 0 else 0.0, self.cpu1 - self.cpu0,
                   broker)


def one_run(bs: str, topic: str, n: int, mode: str, slow: bool,
            broker: dict[str, str] | None) -> Run:
    probe = Probe(n, slow, broker)
    w = Worker(topics=[topic], group_id=unique(f"bench-{mode}"), bootstrap_servers=bs,
               mode=mode, concurrency=CONCURRENCY)
    w.handler(probe.handle)
    with running(w):
        wait_for(lambda: probe.n >= n, 900, f"{n} records ({mode})", 0.02)
    return probe.run()


def _median(runs: list[Run], f: Callable[[Run], float | None]) -> float | None:
    values = [v for v in map(f, runs) if v is not None]
    return statistics.median(values) if values else None


def _cell(runs: list[Run]) -> list[str]:
    rates = [r.mps for r in runs]
    broker = _median(runs, lambda r: r.broker_cpu_s)
    return [f"{statistics.median(rates):,.0f}", f"{min(rates):,.0f}–{max(rates):,.0f}",
            fmt(statistics.median(r.cpu_s for r in runs), 2),
            "n/a" if broker is None else fmt(broker, 2)]


def main(mode: Mode) -> None:
    quiet_logs()
    runs = mode.pick(1, 3, 3)
    sizes = {"noop": mode.pick(2_000, 40_000, 200_000), "slow": mode.pick(200, 2_000, 8_000)}
    done: dict[tuple[str, str], list[Run]] = {}
    with kafka() as bs:
        broker = locate_broker_cpu(bs)
        for case, n in sizes.items():
            topic = make_topic(bs, unique(f"share-{case}"), PARTITIONS)
            produce_fill(bs, topic, n, PARTITIONS, VALUE_SIZE)
            for i in range(runs):
                order = ("share", "partition") if i % 2 == 0 else ("partition", "share")
                for m in order:
                    run = one_run(bs, topic, n, m, case == "slow", broker)
                    done.setdefault((case, m), []).append(run)
                    console.print(f"  {case:4s} {m:9s} run {i + 1}: {n:,} records = "
                                  f"{run.mps:,.0f} records/s, CPU {run.cpu_s:.2f} s")
    med = {k: statistics.median(r.mps for r in rs) for k, rs in done.items()}
    noop = med[("noop", "share")] / med[("noop", "partition")]
    slow = med[("slow", "share")] / med[("slow", "partition")]
    labels = {"noop": f"no-op ({sizes['noop']:,} records)",
              "slow": f"sleep {SLOW_S * 1000:.0f} ms ({sizes['slow']:,} records)"}
    table(f"share vs partitioned, {PARTITIONS} partitions, one worker, concurrency "
          f"{CONCURRENCY}, median of {runs} alternated runs",
          ["handler", "mode", "records/s median", "spread (min–max)", "CPU s worker",
           "CPU s broker", "share / partitioned"],
          [[labels[case], m, *_cell(done[(case, m)]),
            fmt(noop if case == "noop" else slow, 3) if m == "share" else ""]
           for case in sizes for m in ("partition", "share")])
    cpu = {k: statistics.median(r.cpu_s for r in rs) for k, rs in done.items()}
    result("share", {"noop_ratio": round(noop, 3), "slow_ratio": round(slow, 3),
                     "noop_share_mps": round(med[("noop", "share")]),
                     "noop_partition_mps": round(med[("noop", "partition")]),
                     "slow_share_mps": round(med[("slow", "share")]),
                     "slow_partition_mps": round(med[("slow", "partition")]),
                     "noop_share_cpu_s": fmt(cpu[("noop", "share")], 2),
                     "noop_partition_cpu_s": fmt(cpu[("noop", "partition")], 2),
                     "runs": runs})
